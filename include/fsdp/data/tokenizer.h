// fsdp/data/tokenizer.h: text <-> token ids.
//
// ByteTokenizer: each byte is a token (vocab 256); needs no files, so it is the default.
// Gpt2BpeTokenizer: GPT-2's byte-level BPE, read from the standard vocab.json (token -> id) and
// merges.txt (one "left right" pair per line, in merge priority order) that Hugging Face ships
// with every GPT-2-family model. Text is split by GPT-2's pre-tokenisation pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// where, without a Unicode database, letters are ASCII letters and every non-ASCII character and
// digits are 0-9 (exact on ASCII text; other scripts may split differently from the reference).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace fsdp::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
  // End-of-text id placed between documents, or -1 when the vocabulary has none.
  virtual int32_t end_of_text() const { return -1; }
};

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "byte"; }
};

class Gpt2BpeTokenizer : public Tokenizer {
 public:
  // Throws std::runtime_error naming the file and line on unreadable or malformed input.
  Gpt2BpeTokenizer(const std::string& vocab_json_path, const std::string& merges_txt_path);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  std::string name() const override { return "gpt2"; }
  int32_t end_of_text() const override { return end_of_text_; }

  // GPT-2's pre-tokenisation of text into pieces (exposed for tests).
  static std::vector<std::string> split_words(const std::string& text);

 private:
  std::vector<int32_t> encode_word(const std::string& word) const;

  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> priority (lower first)
  std::string byte_to_symbol_[256];                      // GPT-2's printable stand-in per byte (UTF-8)
  std::unordered_map<std::string, uint8_t> symbol_to_byte_;
  int32_t end_of_text_ = -1;
};

// kind: "byte" or "gpt2" (which needs vocab_json and merges_txt). Throws on an unknown kind.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json = "",
                                          const std::string& merges_txt = "");

}  // namespace fsdp::data
