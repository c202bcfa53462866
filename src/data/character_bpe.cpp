#include "character_bpe.h"

#include <cstdio>
#include <stdexcept>

#include "byte_level_bpe.h"  // utf8_length

namespace fsdp::data {

CharacterBpe::CharacterBpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::string>& merges,
                           CharacterBpeOptions options, const std::string& source)
    : token_to_id_(std::move(vocab)), merges_(merges), options_(std::move(options)), instance_(new_bpe_instance()) {
  id_to_token_ = tokens_by_id(token_to_id_, source);
  if (!options_.unk_token.empty()) {
    unk_id_ = id_of(options_.unk_token);
    if (unk_id_ < 0) {
      throw std::runtime_error(source + ": the unknown token '" + options_.unk_token + "' is not in the vocabulary");
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = id_of(name);
  }
  // Every merge's result must be a token, as Hugging Face checks when it loads the file (so a
  // merged symbol always has an id).
  // A token may hold a space itself ("left right" then has several): one of them must divide it.
  for (const auto& merge : merges) {
    bool makes_token = false;
    for (size_t space = merge.find(' '); space != std::string::npos && !makes_token;
         space = merge.find(' ', space + 1)) {
      makes_token = token_to_id_.count(merge.substr(0, space) + merge.substr(space + 1)) > 0;
    }
    if (!makes_token) throw std::runtime_error(source + ": merge '" + merge + "' makes no token of the vocabulary");
  }
}

int32_t CharacterBpe::id_of(const std::string& token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

void CharacterBpe::encode_words(const std::vector<std::string>& words, std::vector<int32_t>& ids) const {
  for (const auto& word : words) {
    if (word.empty()) continue;
    BpeWordCache& cache = this_threads_word_cache(instance_);
    if (auto it = cache.find(word); it != cache.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      continue;
    }
    const std::vector<int32_t> word_ids = encode_word(word);
    remember_word(cache, word, word_ids);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  }
}

std::vector<int32_t> CharacterBpe::encode_word(const std::string& word) const {
  if (options_.ignore_merges) {
    if (int32_t id = id_of(word); id >= 0) return {id};
  }
  // The first symbols, as token texts: characters, in the order Hugging Face adds them (a pending
  // unknown run is added before the next known character, but not before byte-fallback tokens).
  std::vector<std::string> symbols;
  bool unk_pending = false;
  for (size_t i = 0; i < word.size();) {
    const size_t length = std::min(utf8_length(static_cast<unsigned char>(word[i])), word.size() - i);
    std::string character = word.substr(i, length);
    i += length;
    if (token_to_id_.count(character)) {
      if (unk_pending) symbols.push_back(options_.unk_token);
      unk_pending = false;
      symbols.push_back(std::move(character));
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (unsigned char b : character) all_bytes = all_bytes && byte_ids_[b] >= 0;
      if (all_bytes) {
        for (unsigned char b : character) symbols.push_back(id_to_token_[static_cast<size_t>(byte_ids_[b])]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk_pending && !options_.fuse_unk) symbols.push_back(options_.unk_token);
      unk_pending = true;
    }
  }
  if (unk_pending) symbols.push_back(options_.unk_token);
  merges_.apply(symbols);
  std::vector<int32_t> ids;
  ids.reserve(symbols.size());
  for (const auto& symbol : symbols) ids.push_back(token_to_id_.at(symbol));
  return ids;
}

}  // namespace fsdp::data
