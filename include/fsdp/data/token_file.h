// fsdp/data/token_file.h: a file of token ids that training memory-maps.
//
// Layout (little-endian), 32-byte header then the tokens:
//   bytes 0-7    magic "FSDPTOK\0"
//   bytes 8-11   uint32 format version (1)
//   bytes 12-15  uint32 bytes per token: 2 (uint16, vocab <= 65536) or 4 (uint32)
//   bytes 16-19  uint32 vocabulary size (every token is below it)
//   bytes 20-23  uint32 the tokenizer that made it (0: not said, files before 2026-12-05): its kind in
//                the high byte (1 byte, 2 gpt2, 3 hf), in the low 24 bits those of the crc32 of its
//                files (TokenizerStamp, tokenizer.h); a run on the file checks its tokenizer is that one
//   bytes 24-31  uint64 token count
//   bytes 32-    count tokens
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

constexpr uint32_t kTokenFileVersion = 1;

// Writes atomically: to a temporary file beside `path`, flushed to disk, then renamed over it.
// Throws std::runtime_error naming the file (and std::invalid_argument for a token >= vocab).
// `made_by`: the tokenizer the tokens come from (stored in the header; default: not said).
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size,
                      TokenizerStamp made_by = {});

// A sequence of token ids, on disk or in memory.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Tokens [start, start + length) as int64 [length]. Throws std::out_of_range outside [0, size()).
  virtual at::Tensor read(int64_t start, int64_t length) const = 0;
  // Bytes held in the process's memory (0 for a memory-mapped file).
  virtual int64_t held_bytes() const = 0;
};

// Tokens held in memory (a corpus tokenised at start-up).
class TokenBuffer final : public TokenSource {
 public:
  TokenBuffer(std::vector<int32_t> tokens, int64_t vocab_size);
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t vocab_size() const override { return vocab_; }
  at::Tensor read(int64_t start, int64_t length) const override;
  int64_t held_bytes() const override { return static_cast<int64_t>(tokens_.capacity() * sizeof(int32_t)); }

 private:
  std::vector<int32_t> tokens_;
  int64_t vocab_;
};

class TokenFile final : public TokenSource {
 public:
  // Maps the file read-only and checks the header against the file's size.
  // Throws std::runtime_error naming the file and the problem.
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const override { return count_; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t held_bytes() const override { return 0; }  // mapped
  int bytes_per_token() const { return token_bytes_; }
  const std::string& path() const { return path_; }
  // Tokens [start, start + length) as int64 [length]. Throws if out of range or a token >= vocab,
  // and, naming the file, if it was rewritten in place or shortened since it was opened: the
  // mapping would otherwise show other tokens than the run started with, or die of SIGBUS.
  at::Tensor read(int64_t start, int64_t length) const override;
  // "<bytes> bytes, crc32 <hex>": the size and a checksum of the header and three 4 KiB blocks
  // (start, middle, end), taken at open. Ranks compare theirs: different copies on different hosts
  // would give each rank other tokens, silently.
  const std::string& fingerprint() const { return fingerprint_; }
  // The tokenizer the header says made it (kind Unknown when it says none).
  TokenizerStamp tokenizer_stamp() const { return stamp_; }

 private:
  std::string path_;
  int fd_ = -1;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  int64_t count_ = 0;
  int64_t vocab_ = 0;
  int token_bytes_ = 0;
  std::string fingerprint_;
  TokenizerStamp stamp_;
  // The file as opened: a rewrite in place changes its modification time, a truncation its size
  // (a replacement by rename, as fsdp-data writes, is another inode: the mapping keeps the old one).
  uint64_t device_ = 0, inode_ = 0;
  int64_t modified_ns_ = 0;
};

}  // namespace fsdp::data
