#include "fsdp/data/bpe_training.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "byte_level_bpe.h"
#include "unicode_regex.h"

namespace fsdp::data {

namespace {

// Llama 3's split pattern: contractions, letters with one leading non-letter, numbers of at most
// three digits, punctuation runs with their line ends, line breaks, and the rest of the spaces.
const char* const kSplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A template that renders conversations as fsdp.cpp's llama3 chat format does (instructions.h):
// the begin-of-text token once, then each message's header, its trimmed content and <|eot_id|>.
const char* const kChatTemplate =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}";

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// The words' symbols and the adjacent pairs' counts, kept up to date as pairs merge.
class PairCounts {
 public:
  PairCounts(std::vector<std::vector<int32_t>> words, std::vector<int64_t> counts)
      : words_(std::move(words)), counts_(std::move(counts)) {
    for (size_t w = 0; w < words_.size(); ++w) add_word(w, +1);
  }

  // The most frequent pair (ties: smaller left id, then smaller right id), or false when none
  // occurs min_frequency times.
  bool best(int64_t min_frequency, int32_t& left, int32_t& right) const {
    int64_t best_count = 0;
    uint64_t best_key = 0;
    for (const auto& [key, count] : pair_count_) {
      if (count > best_count || (count == best_count && count > 0 && key < best_key)) {
        best_count = count;
        best_key = key;
      }
    }
    if (best_count < min_frequency || best_count == 0) return false;
    left = static_cast<int32_t>(best_key >> 32);
    right = static_cast<int32_t>(best_key & 0xffffffffu);
    return true;
  }

  // Every occurrence of (left, right), left to right in each word, becomes `merged`.
  void merge(int32_t left, int32_t right, int32_t merged) {
    const uint64_t key = pair_key(left, right);
    const auto where = words_with_.find(key);
    if (where == words_with_.end()) return;
    const std::vector<size_t> candidates(where->second.begin(), where->second.end());
    for (size_t w : candidates) {
      std::vector<int32_t>& symbols = words_[w];
      bool present = false;
      for (size_t i = 0; i + 1 < symbols.size() && !present; ++i)
        present = symbols[i] == left && symbols[i + 1] == right;
      if (!present) continue;
      add_word(w, -1);
      std::vector<int32_t> out;
      out.reserve(symbols.size());
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(symbols[i]);
        }
      }
      symbols = std::move(out);
      add_word(w, +1);
    }
    pair_count_.erase(key);
    words_with_.erase(key);
  }

 private:
  void add_word(size_t w, int sign) {
    const std::vector<int32_t>& symbols = words_[w];
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const uint64_t key = pair_key(symbols[i], symbols[i + 1]);
      int64_t& count = pair_count_[key];
      count += sign * counts_[w];
      if (sign > 0) words_with_[key].insert(w);
      if (count == 0) pair_count_.erase(key);  // best() scans what is left
    }
  }

  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> counts_;
  std::unordered_map<uint64_t, int64_t> pair_count_;
  std::unordered_map<uint64_t, std::unordered_set<size_t>> words_with_;  // may list words that lost the pair
};

}  // namespace

namespace {

// Word frequencies over the corpus, as the split pattern cuts it (what encoding will see): ordered,
// so that the same words come in the same order every run.
std::map<std::string, int64_t> word_frequencies(const std::vector<std::string>& documents) {
  const UnicodeRegex split(kSplitPattern, "train_byte_level_bpe");
  std::map<std::string, int64_t> frequency;
  for (size_t d = 0; d < documents.size(); ++d) {
    std::vector<std::pair<size_t, size_t>> matches;
    try {
      matches = split.find_all(documents[d]);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("train_byte_level_bpe: document " + std::to_string(d) + ": " + e.what());
    }
    size_t last = 0;
    for (const auto& [begin, end] : matches) {
      if (begin > last) ++frequency[documents[d].substr(last, begin - last)];
      ++frequency[documents[d].substr(begin, end - begin)];
      last = end;
    }
    if (last < documents[d].size()) ++frequency[documents[d].substr(last)];
  }
  return frequency;
}

// Hugging Face's tokenizer.json of a byte-level BPE: `tokens` (id -> token in GPT-2's printable
// characters) as the vocabulary, `merges` in order, the special tokens after them, Llama 3's split
// pattern before the byte-level step.
nlohmann::json tokenizer_json(const std::vector<std::string>& tokens, const nlohmann::json& merges,
                              const std::vector<std::string>& special_tokens) {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    added.push_back({{"id", static_cast<int64_t>(tokens.size() + i)},
                     {"content", special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", kSplitPattern}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
          {"post_processor",
           {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// tokenizer_config.json: bos, eos and Llama 3's chat template where the special tokens have them.
nlohmann::json tokenizer_config_json(const std::vector<std::string>& special_tokens) {
  auto special = [&](const char* token) {
    return std::find(special_tokens.begin(), special_tokens.end(), token) != special_tokens.end();
  };
  nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                           {"model_max_length", 1000000},
                           {"clean_up_tokenization_spaces", false}};
  if (special("<|begin_of_text|>")) config["bos_token"] = "<|begin_of_text|>";
  if (special("<|eot_id|>")) config["eos_token"] = "<|eot_id|>";
  else if (special("<|end_of_text|>")) config["eos_token"] = "<|end_of_text|>";
  if (special("<|start_header_id|>") && special("<|eot_id|>")) config["chat_template"] = kChatTemplate;
  return config;
}

}  // namespace

TrainedBpe train_byte_level_bpe(const std::vector<std::string>& documents, const BpeTrainingOptions& options) {
  const int64_t specials = static_cast<int64_t>(options.special_tokens.size());
  if (options.vocab_size < 256 + specials) {
    throw std::invalid_argument("train_byte_level_bpe: vocab_size " + std::to_string(options.vocab_size) +
                                " leaves no room for the 256 bytes and the " + std::to_string(specials) +
                                " special tokens");
  }
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (const auto& [word, count] : word_frequencies(documents)) {
    std::vector<int32_t> bytes;
    for (unsigned char b : word) bytes.push_back(b);  // token id b is byte b
    words.push_back(std::move(bytes));
    counts.push_back(count);
  }
  TrainedBpe trained;
  trained.words = static_cast<int64_t>(words.size());

  std::vector<std::string> tokens;  // id -> the token in GPT-2's printable stand-in characters
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_level_symbol(static_cast<uint8_t>(b)));
  nlohmann::json merges = nlohmann::json::array();
  PairCounts pairs(std::move(words), std::move(counts));
  const int64_t merged_limit = options.vocab_size - specials;
  int32_t left = 0, right = 0;
  while (static_cast<int64_t>(tokens.size()) < merged_limit && pairs.best(options.min_frequency, left, right)) {
    const auto merged = static_cast<int32_t>(tokens.size());
    tokens.push_back(tokens[static_cast<size_t>(left)] + tokens[static_cast<size_t>(right)]);
    merges.push_back(nlohmann::json::array({tokens[static_cast<size_t>(left)], tokens[static_cast<size_t>(right)]}));
    pairs.merge(left, right, merged);
  }
  trained.merges = static_cast<int64_t>(merges.size());
  trained.vocab_size = static_cast<int64_t>(tokens.size()) + specials;
  trained.tokenizer_json = tokenizer_json(tokens, merges, options.special_tokens).dump(1) + "\n";
  trained.tokenizer_config_json = tokenizer_config_json(options.special_tokens).dump(2) + "\n";
  return trained;
}

}  // namespace fsdp::data
