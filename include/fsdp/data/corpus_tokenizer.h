// fsdp/data/corpus_tokenizer.h: a corpus of any size tokenized on every core into token shards.
//
// Input: text files (each one document), JSON-lines files (*.jsonl: a {"text": ...} document a
// line), directories of them (recursively, in path order; hidden files skipped) and standard
// input ("-": JSON lines). Documents are read batch_bytes of text at a time; a batch is split into
// `threads` contiguous ranges tokenized at once and appended in document order, so the shards are
// the same whatever the number of threads. Each document is followed by document_separator
// (text_corpus.h), as in tokenize_documents. A document goes to validation when its FNV-1a hash
// falls in the first validation_percent of 100 buckets (the fortunes' split).
//
// Output, under OUTPUT.partial and renamed to OUTPUT once complete (a failure leaves nothing):
//   OUTPUT/train/shard-00000.tok, shard-00001.tok, ...       shard_tokens tokens each but the last
//   OUTPUT/validation/shard-00000.tok, ...                    (when validation_percent > 0)
// Token files as token_file.h: uint16 when the vocabulary fits in 65,536, else uint32. Memory: a
// batch of text and one shard per split (int32 tokens), whatever the corpus's size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

struct CorpusOptions {
  std::string output_dir;
  int threads = 1;
  int64_t shard_tokens = int64_t{1} << 25;  // 32 Mi tokens: 64 MiB (uint16) or 128 MiB (uint32) a shard
  int validation_percent = 1;               // 0: no validation split
  int64_t batch_bytes = int64_t{16} << 20;  // text read and tokenized per round
};

struct CorpusProgress {
  int64_t bytes_read = 0;
  int64_t bytes_total = 0;  // 0: unknown (standard input)
  int64_t documents = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

struct CorpusSummary {
  int64_t documents = 0;
  int64_t bytes = 0;
  int64_t train_tokens = 0, validation_tokens = 0;
  int train_shards = 0, validation_shards = 0;
  int threads = 1;
  double seconds = 0;
};

// Throws std::runtime_error naming the input (file and line) or the output that failed.
CorpusSummary tokenize_corpus(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                              const CorpusOptions& options,
                              const std::function<void(const CorpusProgress&)>& progress = {});

}  // namespace fsdp::data
