// Byte-level BPE, the model behind GPT-2's, Llama 3's and Qwen2's tokenizers: a word's bytes are
// written as printable stand-in characters (GPT-2's byte map), then adjacent symbols are merged by
// the merges' priority until no ranked pair is left; each symbol is a vocabulary token.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "bpe_model.h"

namespace fsdp::data {

// GPT-2's pre-tokenisation pattern (its encoder.py), with Unicode classes: GPT-2's split, and a
// tokenizer.json's ByteLevel pre-tokenizer's where use_regex is on.
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's printable stand-in for a byte (UTF-8): printable Latin-1 bytes stand for themselves, the
// other 68 bytes for code points 256, 257, ... in byte order.
const std::string& byte_level_symbol(uint8_t byte);

class ByteLevelBpe final : public BpeModel {
 public:
  // vocab: token (in stand-in characters) -> id; merges: "left right" in priority order.
  // ignore_merges: a word that is itself a token is that token, unmerged (Llama 3).
  // Throws std::runtime_error naming `source` when a byte has no token.
  ByteLevelBpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::string>& merges,
               bool ignore_merges, const std::string& source);

  // The ids of one pre-tokenised word (raw bytes, not stand-ins). Cached per word; thread-safe.
  std::vector<int32_t> encode_word(const std::string& word) const;
  // The ids of each word (raw bytes) in turn, appended to `ids`.
  void encode_words(const std::vector<std::string>& words, std::vector<int32_t>& ids) const override;
  // The raw bytes of a token id, or false when the id is not a byte-level token.
  bool token_bytes(int32_t id, std::string& out) const;
  int32_t id_of(const std::string& token) const override;
  int64_t id_limit() const override { return static_cast<int64_t>(id_to_token_.size()); }
  const std::string& token(int32_t id) const override { return id_to_token_.at(static_cast<size_t>(id)); }

 private:
  std::vector<int32_t> merge(const std::string& word) const;

  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;  // "" for ids the vocabulary skips
  BpeMerges merges_;
  std::string byte_to_symbol_[256];  // GPT-2's printable stand-in per byte (UTF-8)
  std::unordered_map<std::string, uint8_t> symbol_to_byte_;
  bool ignore_merges_ = false;
  uint64_t instance_;  // names this model's word cache (bpe_model.h)
};

// Length in bytes of the UTF-8 character starting with `lead` (1 for a stray continuation byte).
inline size_t utf8_length(unsigned char lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

}  // namespace fsdp::data
