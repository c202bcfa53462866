// fsdp/data/token_shards.h: a corpus stored as several token files (shards), read as one sequence.
//
// A corpus too large for one file (fsdp-data corpus writes shards of a set number of tokens) is
// named by a directory (its *.tok files), a glob ("corpus/train/shard-*.tok") or a single token
// file. The shards are concatenated in name order, numbers by value (shard-99999 before
// shard-100000); a read may span two or more of them. Each is memory-mapped (TokenFile): nothing
// is read whole. Every shard must hold tokens and share one
// vocabulary and token size: a corpus is one tokenizer's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdp/data/token_file.h"

namespace fsdp::data {

// The token files a spec names, sorted: a directory's *.tok files, a glob's matches, or the file
// itself. Throws std::runtime_error naming the spec when it names none.
std::vector<std::string> token_shard_paths(const std::string& spec);

class TokenShards final : public TokenSource {
 public:
  // Opens (maps) every shard the spec names. Throws std::runtime_error naming the shard and the
  // problem: unreadable, empty, or another vocabulary or token size than the first shard's.
  explicit TokenShards(const std::string& spec);

  int64_t size() const override { return total_; }
  int64_t vocab_size() const override { return shards_.front()->vocab_size(); }
  int64_t held_bytes() const override { return 0; }  // mapped
  // Tokens [start, start + length) as int64 [length], across shard boundaries.
  at::Tensor read(int64_t start, int64_t length) const override;
  size_t shard_count() const { return shards_.size(); }
  const std::string& spec() const { return spec_; }
  // The shards' sizes and checksums (TokenFile::fingerprint) in one line, to compare across ranks.
  std::string fingerprint() const;
  // The tokenizer the shards say made them (all the same, checked when opened).
  TokenizerStamp tokenizer_stamp() const { return shards_.front()->tokenizer_stamp(); }

 private:
  std::string spec_;
  std::vector<std::unique_ptr<TokenFile>> shards_;
  std::vector<int64_t> starts_;  // shard i holds tokens [starts_[i], starts_[i] + shards_[i]->size())
  int64_t total_ = 0;
};

}  // namespace fsdp::data
