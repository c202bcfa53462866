#include "byte_level_bpe.h"

#include <climits>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace fsdp::data {

namespace {
std::string utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

}  // namespace

const std::string& byte_level_symbol(uint8_t byte) {
  static const std::vector<std::string> symbols = [] {
    std::vector<std::string> table(256);
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      table[static_cast<size_t>(b)] = utf8(printable ? b : 256 + next_extra++);
    }
    return table;
  }();
  return symbols[byte];
}

ByteLevelBpe::ByteLevelBpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::string>& merges,
                           bool ignore_merges, const std::string& source)
    : token_to_id_(std::move(vocab)), merges_(merges), ignore_merges_(ignore_merges), instance_(new_bpe_instance()) {
  for (int b = 0; b < 256; ++b) {
    byte_to_symbol_[b] = byte_level_symbol(static_cast<uint8_t>(b));
    symbol_to_byte_[byte_to_symbol_[b]] = static_cast<uint8_t>(b);
  }
  id_to_token_ = tokens_by_id(token_to_id_, source);
  for (int b = 0; b < 256; ++b) {
    if (!token_to_id_.count(byte_to_symbol_[b])) {
      throw std::runtime_error(source + " lacks the token for byte " + std::to_string(b) +
                               " (a byte-level BPE vocabulary has all 256)");
    }
  }
}

int32_t ByteLevelBpe::id_of(const std::string& token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::vector<int32_t> ByteLevelBpe::encode_word(const std::string& word) const {
  BpeWordCache& cache = this_threads_word_cache(instance_);
  if (auto it = cache.find(word); it != cache.end()) return it->second;
  std::vector<int32_t> ids = merge(word);
  remember_word(cache, word, ids);
  return ids;
}

void ByteLevelBpe::encode_words(const std::vector<std::string>& words, std::vector<int32_t>& ids) const {
  for (const auto& word : words) {
    const std::vector<int32_t> word_ids = encode_word(word);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  }
}

std::vector<int32_t> ByteLevelBpe::merge(const std::string& word) const {
  std::vector<std::string> symbols;
  for (unsigned char b : word) symbols.push_back(byte_to_symbol_[b]);
  if (ignore_merges_) {
    std::string whole;
    for (const auto& s : symbols) whole += s;
    if (auto it = token_to_id_.find(whole); it != token_to_id_.end()) return {it->second};
  }
  merges_.apply(symbols);
  std::vector<int32_t> ids;
  for (const auto& symbol : symbols) {
    auto it = token_to_id_.find(symbol);
    if (it != token_to_id_.end()) {
      ids.push_back(it->second);
    } else {
      // A merge whose result is not in the vocabulary: fall back to the symbol's bytes.
      for (size_t i = 0; i < symbol.size(); i += utf8_length(symbol[i])) {
        ids.push_back(token_to_id_.at(symbol.substr(i, utf8_length(symbol[i]))));
      }
    }
  }
  return ids;
}

bool ByteLevelBpe::token_bytes(int32_t id, std::string& out) const {
  if (id < 0 || id >= id_limit() || id_to_token_[static_cast<size_t>(id)].empty()) return false;
  const std::string& token = id_to_token_[static_cast<size_t>(id)];
  std::string bytes;
  for (size_t i = 0; i < token.size(); i += utf8_length(token[i])) {
    auto it = symbol_to_byte_.find(token.substr(i, utf8_length(token[i])));
    if (it == symbol_to_byte_.end()) return false;
    bytes.push_back(static_cast<char>(it->second));
  }
  out += bytes;
  return true;
}

}  // namespace fsdp::data
