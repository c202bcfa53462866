// fsdp/data/bpe_training.h: training a byte-level BPE tokenizer on a corpus, written as a Hugging
// Face tokenizer.json of Llama 3's layout (Llama 3's split pattern, ByteLevel without a prefix
// space, BPE, ByteLevel decoder, added special tokens), so that HfTokenizer here and Hugging Face's
// `tokenizers` read it alike (tests/tokenizer/check_trained_tokenizer.py checks the ids agree).
//
// The training is BPE's own (Sennrich et al. 2016, over bytes as GPT-2 does it): the corpus is cut
// into words by the split pattern, every word starts as its bytes, and the most frequent adjacent
// pair of symbols (counted over all words, weighted by how often each word occurs) is merged into
// a new token, again and again, until the vocabulary is full or no pair occurs min_frequency times.
// Ties go to the pair of smaller ids, so the same corpus gives the same tokenizer every time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data {

struct BpeTrainingOptions {
  // Tokens in all: the 256 bytes, the merges, and the special tokens after them.
  int64_t vocab_size = 4096;
  int64_t min_frequency = 2;  // a pair seen fewer times is not merged
  // Added after the merged tokens, in order, as Llama 3's are: its chat format's tokens by default.
  std::vector<std::string> special_tokens = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                             "<|end_header_id|>", "<|eot_id|>"};
};

struct TrainedBpe {
  std::string tokenizer_json;         // Hugging Face's tokenizer.json
  std::string tokenizer_config_json;  // tokenizer_config.json: bos/eos and a Llama 3 style chat template
  int64_t vocab_size = 0;             // tokens in all (fewer than asked when the corpus ran out of pairs)
  int64_t merges = 0;
  int64_t words = 0;  // distinct words the split pattern cut the corpus into
};

// Trains on `documents` (valid UTF-8; std::invalid_argument names the document and byte offset
// otherwise). Throws std::invalid_argument for a vocab_size below 256 + the special tokens.
TrainedBpe train_byte_level_bpe(const std::vector<std::string>& documents, const BpeTrainingOptions& options = {});

}  // namespace fsdp::data
