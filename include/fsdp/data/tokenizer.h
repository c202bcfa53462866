// fsdp/data/tokenizer.h: text <-> token ids.
//
// ByteTokenizer: each byte is a token (vocab 256); needs no files, so it is the default.
// Gpt2BpeTokenizer: GPT-2's byte-level BPE, read from the standard vocab.json (token -> id) and
// merges.txt (one "left right" pair per line, in merge priority order) that Hugging Face ships
// with every GPT-2-family model. Text is split by GPT-2's pre-tokenisation pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with Unicode's letter, number and space classes (PCRE2).
// HfTokenizer: a Hugging Face tokenizer.json with a BPE model, of either kind:
//   byte-level (Llama 3, GPT-2, Qwen): a ByteLevel pre-tokenizer and decoder, words as bytes
//   SentencePiece-style (Llama 2, Mistral, Gemma): words as Unicode characters, "▁" for spaces
//     (a Metaspace pre-tokenizer or a Replace normalizer), byte_fallback to <0xNN> tokens
// Its added and special tokens are matched first; the rest goes through its normalizer (Replace,
// Prepend, NFC), pre-tokenizer (Split, ByteLevel, Metaspace) and model; decoding through its
// decoder (ByteLevel, or Replace, ByteFallback, Fuse, Strip, Metaspace): src/data/hf_tokenizer_pipeline.h.
// Whatever else a file asks for is refused by name. Checked token for token against Hugging
// Face's own `tokenizers` library (tests/tokenizer/check_tokenizers.py).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/data/tokenizer_kind.h"

namespace fsdp::data {

// Which tokenizer made a sequence of ids: its kind and a checksum of the files it was read from
// (tokenizer.json; vocab.json then merges.txt), so that token files can say what made them and a
// run on them can check its own tokenizer is that one (token_file.h stores it in 4 bytes).
struct TokenizerStamp {
  TokenizerKind kind = TokenizerKind::Unknown;
  uint32_t checksum = 0;  // the low 24 bits of the crc32 of the tokenizer's files; 0 for byte
  bool known() const { return kind != TokenizerKind::Unknown; }
  bool operator==(const TokenizerStamp& o) const { return kind == o.kind && checksum == o.checksum; }
  bool operator!=(const TokenizerStamp& o) const { return !(*this == o); }
  // "the hf tokenizer (files' crc32 ...a1b2c3)", "the byte tokenizer", "an unknown tokenizer"
  std::string describe() const;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // The text as plain text: special-token text in it ("<|eot_id|>") is encoded as its characters,
  // never as the control token (Hugging Face's split_special_tokens=True). Tokenizers with no
  // special tokens in text encode as encode() does.
  virtual std::vector<int32_t> encode_plain(const std::string& text) const { return encode(text); }
  // As encode(), but no special token is matched where it would overlap a byte range in `literal`
  // (a message's own text rendered into a chat template, under split_special_tokens).
  using ByteRanges = std::vector<std::pair<size_t, size_t>>;  // [begin, end)
  virtual std::vector<int32_t> encode_with_literal(const std::string& text, const ByteRanges& literal) const {
    (void)literal;
    return encode(text);
  }
  // Valid UTF-8 always: bytes that make no character (a sample cut mid-character) become U+FFFD,
  // one per maximal invalid stretch, as Hugging Face's decoders do (src/data/utf8_repair.h).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
  // End-of-text id placed between documents, or -1 when the vocabulary has none.
  virtual int32_t end_of_text() const { return -1; }
  // What this tokenizer is, for token files (TokenizerStamp).
  virtual TokenizerStamp stamp() const { return {}; }
};

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "byte"; }
  TokenizerStamp stamp() const override { return {TokenizerKind::Byte, 0}; }
};

class ByteLevelBpe;  // src/data/byte_level_bpe.h

class Gpt2BpeTokenizer : public Tokenizer {
 public:
  // Throws std::runtime_error naming the file and line on unreadable or malformed input.
  Gpt2BpeTokenizer(const std::string& vocab_json_path, const std::string& merges_txt_path);
  ~Gpt2BpeTokenizer() override;
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  std::string name() const override { return "gpt2"; }
  int32_t end_of_text() const override { return end_of_text_; }
  TokenizerStamp stamp() const override { return {TokenizerKind::Gpt2, checksum_}; }

  // GPT-2's pre-tokenisation of text into pieces (exposed for tests). Text must be valid UTF-8.
  static std::vector<std::string> split_words(const std::string& text);

 private:
  std::unique_ptr<ByteLevelBpe> bpe_;
  int32_t end_of_text_ = -1;
  uint32_t checksum_ = 0;  // of vocab.json then merges.txt (TokenizerStamp)
};

class HfTokenizer : public Tokenizer {
 public:
  // Throws std::runtime_error naming the file and the key it cannot read or does not support.
  explicit HfTokenizer(const std::string& tokenizer_json_path);
  ~HfTokenizer() override;
  // Text must be valid UTF-8 (std::invalid_argument names the byte offset otherwise).
  std::vector<int32_t> encode(const std::string& text) const override;
  std::vector<int32_t> encode_plain(const std::string& text) const override;
  std::vector<int32_t> encode_with_literal(const std::string& text, const ByteRanges& literal) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string name() const override { return "hf"; }
  TokenizerStamp stamp() const override { return {TokenizerKind::Hf, checksum_}; }
  // <|end_of_text|>, <|endoftext|> or </s>, the first that is an added token; else -1.
  int32_t end_of_text() const override { return end_of_text_; }
  // An added (or vocabulary) token's id, -1 when absent: "<|eot_id|>", "<|start_header_id|>".
  int32_t token_id(const std::string& token) const;

  // The words the normalizer and pre-tokenizer make of a stretch of text that begins the text and
  // holds no added token (tests).
  std::vector<std::string> pre_tokenize(const std::string& text) const;

 private:
  struct Pipeline;  // src/data/hf_tokenizer.cpp
  // Adds the ids of text[begin, end), a stretch between added tokens, to `ids`.
  void encode_stretch(const std::string& stretch, bool at_text_start, std::vector<int32_t>& ids) const;

  std::string source_;
  std::unique_ptr<Pipeline> pipeline_;
  int64_t vocab_size_ = 0;
  int32_t end_of_text_ = -1;
  uint32_t checksum_ = 0;  // of tokenizer.json (TokenizerStamp)
};

// kind: Byte, Gpt2 (which needs vocab_json and merges_txt), or Hf (which needs tokenizer_json);
// std::invalid_argument for Unknown or a missing file name.
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& vocab_json = "",
                                          const std::string& merges_txt = "", const std::string& tokenizer_json = "");
// The same by the kind's name ("byte", "gpt2", "hf"); std::invalid_argument for another name.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json = "",
                                          const std::string& merges_txt = "", const std::string& tokenizer_json = "");

}  // namespace fsdp::data
