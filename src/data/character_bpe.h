// BPE over Unicode characters, the model of SentencePiece-style tokenizer.json files (Llama 2,
// Mistral, Gemma): a word's characters are its first symbols; a character the vocabulary lacks
// becomes the <0xNN> tokens of its UTF-8 bytes (byte_fallback), or else the unknown token (runs of
// unknown characters fused into one where fuse_unk says so), or else nothing, as Hugging Face's
// BPE does (tokenizers/src/models/bpe/model.rs, merge_word); then the merges, by priority.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "bpe_model.h"

namespace fsdp::data {

struct CharacterBpeOptions {
  bool byte_fallback = false;
  std::string unk_token;  // "" for none
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself a token is that token, unmerged
};

class CharacterBpe final : public BpeModel {
 public:
  // vocab: token -> id, ids in [0, vocabulary size); merges: "left right" in priority order.
  // Throws std::runtime_error naming `source` on an id outside the vocabulary, an unknown token
  // missing from it, or a merge whose result it lacks.
  CharacterBpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::string>& merges,
               CharacterBpeOptions options, const std::string& source);

  void encode_words(const std::vector<std::string>& words, std::vector<int32_t>& ids) const override;
  int32_t id_of(const std::string& token) const override;
  int64_t id_limit() const override { return static_cast<int64_t>(id_to_token_.size()); }
  const std::string& token(int32_t id) const override { return id_to_token_.at(static_cast<size_t>(id)); }

 private:
  std::vector<int32_t> encode_word(const std::string& word) const;

  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;  // "" for ids the vocabulary skips
  BpeMerges merges_;
  CharacterBpeOptions options_;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256];  // <0x00>..<0xFF>: -1 where the vocabulary lacks one
  uint64_t instance_;      // names this model's word cache (bpe_model.h)
};

}  // namespace fsdp::data
