// What every BPE model of a tokenizer shares: the interface the tokenizers encode through, the
// merge ranks, and a per-thread cache of words already encoded. Two models implement it:
//   ByteLevelBpe  (byte_level_bpe.h): GPT-2, Llama 3, Qwen: a word's bytes as printable stand-ins
//   CharacterBpe  (character_bpe.h):  Llama 2, Mistral, Gemma (SentencePiece's kind): a word's
//                 Unicode characters, a character with no token as its bytes' <0xNN> tokens
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace fsdp::data {

class BpeModel {
 public:
  virtual ~BpeModel() = default;
  // The ids of each pre-tokenised word in turn, appended to `ids`. Thread-safe.
  virtual void encode_words(const std::vector<std::string>& words, std::vector<int32_t>& ids) const = 0;
  // -1 when absent.
  virtual int32_t id_of(const std::string& token) const = 0;
  // One past the largest id.
  virtual int64_t id_limit() const = 0;
  // The token's text as the vocabulary writes it ("" for ids the vocabulary skips).
  virtual const std::string& token(int32_t id) const = 0;
};

// The merges of a BPE model, "left right" in priority order, applied to a word's symbols.
class BpeMerges {
 public:
  explicit BpeMerges(const std::vector<std::string>& merges);
  // Merges the lowest-ranked adjacent pair, every occurrence left to right, until no ranked pair is
  // left (the same result as Hugging Face's queue of (rank, position)).
  void apply(std::vector<std::string>& symbols) const;

 private:
  std::unordered_map<std::string, int32_t> rank_;  // "left right" -> priority (lower first)
};

// The vocabulary's tokens by id ("" for ids it skips). Every id must lie in [0, vocabulary size)
// (the layout every BPE file has), or a crafted file would index out of bounds (found by
// tests/fuzz/fuzz_tokenizer_json): std::runtime_error naming `source`, the token and the id.
std::vector<std::string> tokens_by_id(const std::unordered_map<std::string, int32_t>& token_to_id,
                                      const std::string& source);

// Words already encoded, per thread and model instance, so threads tokenizing a corpus together
// (fsdp-data corpus) share no lock. `instance` names the model (new_bpe_instance: never reused).
using BpeWordCache = std::unordered_map<std::string, std::vector<int32_t>>;
BpeWordCache& this_threads_word_cache(uint64_t instance);
uint64_t new_bpe_instance();
// Keeps the cache bounded (a long corpus of unique words) and stores the word's ids.
void remember_word(BpeWordCache& cache, const std::string& word, const std::vector<int32_t>& ids);

}  // namespace fsdp::data
