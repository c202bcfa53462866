// The steps of a Hugging Face tokenizer.json around its model, each read from its JSON and done as
// the `tokenizers` library does them (file names below are that library's, tokenizers/src/):
//   normalizer     each stretch of text between added tokens, rewritten: Replace (a string or a
//                  regex), Prepend, NFC, or a Sequence of them (normalizers/)
//   pre-tokenizer  the normalized stretch cut into words: Split (a string or a regex; Isolated,
//                  Removed, MergedWithPrevious, MergedWithNext, Contiguous), ByteLevel (GPT-2's
//                  split; the model is then byte-level), Metaspace (spaces to "▁", a prefix "▁"
//                  always or at the text's start), or a Sequence (pre_tokenizers/, tokenizer/normalizer.rs)
//   decoder        tokens back to text: Replace, ByteFallback (<0xNN> runs to bytes, one U+FFFD per
//                  byte where they make no text), Fuse, Strip, Metaspace, a Sequence (decoders/).
//                  The ByteLevel decoder is the byte-level model's own (HfTokenizer::decode).
// Whatever else a file names is refused with the step's name, through `Refuse`.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::data {

class UnicodeRegex;

// Throws std::runtime_error saying `what` is not supported (never returns).
using Refuse = std::function<void(const std::string& what)>;

// A string or a regex (a tokenizer.json {"String": ...} or {"Regex": ...}), found left to right
// without overlap: [begin, end) byte ranges, empty matches skipped.
class TextPattern {
 public:
  TextPattern(const nlohmann::json& spec, const std::string& where);
  ~TextPattern();
  TextPattern(TextPattern&&) noexcept;
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& text) const;
  // The pattern as its literal string; "" for a regex.
  const std::string& literal() const { return literal_; }

 private:
  std::string literal_;
  std::unique_ptr<UnicodeRegex> regex_;
};

class HfNormalizer {
 public:
  HfNormalizer();  // none: text unchanged
  HfNormalizer(const nlohmann::json& spec, const std::string& where, const Refuse& refuse);
  ~HfNormalizer();
  HfNormalizer(HfNormalizer&&) noexcept;
  HfNormalizer& operator=(HfNormalizer&&) noexcept;
  std::string normalize(std::string text) const;
  bool empty() const { return steps_.empty(); }

 private:
  struct Step;
  std::vector<Step> steps_;
};

// How a Split step treats the matches (tokenizers' SplitDelimiterBehavior): dropped, pieces of
// their own, joined to the piece before or after, or runs of matches and of non-matches as pieces.
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// A word cut from a stretch of text; at_text_start: it begins where the encoded text begins
// (Metaspace's "first" prefix goes only there).
struct PreTokenizedWord {
  std::string text;
  bool at_text_start = false;
};

class HfPreTokenizer {
 public:
  HfPreTokenizer();  // none: the stretch is one word
  HfPreTokenizer(const nlohmann::json& spec, const std::string& where, const Refuse& refuse);
  ~HfPreTokenizer();
  HfPreTokenizer(HfPreTokenizer&&) noexcept;
  HfPreTokenizer& operator=(HfPreTokenizer&&) noexcept;
  // Empty words are dropped.
  std::vector<std::string> split(const std::string& text, bool at_text_start) const;
  // Whether a ByteLevel step is among them (the model is then byte-level).
  bool byte_level() const { return byte_level_; }

 private:
  struct Step;
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

// Decoders other than ByteLevel: token texts -> text.
class HfDecoder {
 public:
  // None: the tokens joined with spaces, as Hugging Face does. (The constructors and destructors
  // of these three are out of line: their Step is complete only there.)
  HfDecoder();
  HfDecoder(const nlohmann::json& spec, const std::string& where, const Refuse& refuse);
  ~HfDecoder();
  HfDecoder(HfDecoder&&) noexcept;
  HfDecoder& operator=(HfDecoder&&) noexcept;
  std::string decode(std::vector<std::string> tokens) const;
  bool none() const { return !present_; }

 private:
  struct Step;
  std::vector<Step> steps_;
  bool present_ = false;
};

}  // namespace fsdp::data
