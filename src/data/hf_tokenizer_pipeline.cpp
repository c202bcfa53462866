#include "hf_tokenizer_pipeline.h"

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <cstdlib>
#include <stdexcept>

#include "byte_level_bpe.h"  // utf8_length
#include "unicode_regex.h"

namespace fsdp::data {

namespace {

std::string replace_all(const std::string& text, const TextPattern& pattern, const std::string& content) {
  std::string out;
  size_t last = 0;
  for (const auto& [begin, end] : pattern.find_all(text)) {
    out.append(text, last, begin - last);
    out += content;
    last = end;
  }
  out.append(text, last, std::string::npos);
  return out;
}

// Every occurrence of `from` (not empty) replaced by `to`, left to right: Metaspace's and the
// decoders' replacements, done per word and per token.
std::string replace_literal(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  size_t last = 0;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, last)) {
    out.append(text, last, at - last);
    out += to;
    last = at + from.size();
  }
  out.append(text, last, std::string::npos);
  return out;
}

std::string nfc(const std::string& text, const std::string& where) {
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &composed, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {
    throw std::invalid_argument(where + ": NFC normalizer: " + utf8proc_errmsg(length));
  }
  std::string out(reinterpret_cast<const char*>(composed), static_cast<size_t>(length));
  std::free(composed);
  return out;
}

// tokenizers/src/tokenizer/normalizer.rs, NormalizedString::split: the stretches between matches
// and the matches, then joined or dropped by the behaviour; empty pieces dropped.
std::vector<std::pair<size_t, size_t>> split_ranges(const std::string& text, const TextPattern& pattern,
                                                    SplitBehavior behavior) {
  struct Entry {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Entry> entries;
  size_t last = 0;
  for (const auto& [begin, end] : pattern.find_all(text)) {
    if (begin > last) entries.push_back({last, begin, false});
    entries.push_back({begin, end, true});
    last = end;
  }
  if (last < text.size()) entries.push_back({last, text.size(), false});

  std::vector<std::pair<size_t, size_t>> pieces;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const Entry& e : entries)
        if (!e.is_match) pieces.emplace_back(e.begin, e.end);
      break;
    case SplitBehavior::Isolated:
      for (const Entry& e : entries) pieces.emplace_back(e.begin, e.end);
      break;
    case SplitBehavior::Contiguous:
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0 && entries[i].is_match == previous_match) {
          pieces.back().second = entries[i].end;
        } else {
          pieces.emplace_back(entries[i].begin, entries[i].end);
        }
        previous_match = entries[i].is_match;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const Entry& e : entries) {
        if (e.is_match && !previous_match && !pieces.empty()) {
          pieces.back().second = e.end;
        } else {
          pieces.emplace_back(e.begin, e.end);
        }
        previous_match = e.is_match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto e = entries.rbegin(); e != entries.rend(); ++e) {
        if (e->is_match && !previous_match && !pieces.empty()) {
          pieces.back().first = e->begin;
        } else {
          pieces.emplace_back(e->begin, e->end);
        }
        previous_match = e->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
  }
  return pieces;
}

// A tokenizer.json's one-character string ("content": " "), as UTF-8.
std::string one_character(const nlohmann::json& value, const std::string& what, const Refuse& refuse) {
  const std::string text = value.get<std::string>();
  if (text.empty() || utf8_length(static_cast<unsigned char>(text[0])) != text.size()) {
    refuse(what + " '" + text + "' (one character expected)");
  }
  return text;
}

std::vector<std::string> characters(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const size_t length = std::min(utf8_length(static_cast<unsigned char>(text[i])), text.size() - i);
    out.push_back(text.substr(i, length));
    i += length;
  }
  return out;
}

// The steps of a spec that may be a Sequence of them under `list_key`.
std::vector<nlohmann::json> sequence_steps(const nlohmann::json& spec, const char* list_key) {
  if (spec.at("type").get<std::string>() == "Sequence") return spec.at(list_key).get<std::vector<nlohmann::json>>();
  return {spec};
}

}  // namespace

// ---- TextPattern

TextPattern::TextPattern(const nlohmann::json& spec, const std::string& where) {
  if (spec.contains("Regex")) {
    regex_ = std::make_unique<UnicodeRegex>(spec.at("Regex").get<std::string>(), where);
  } else {
    literal_ = spec.at("String").get<std::string>();
  }
}
TextPattern::~TextPattern() = default;
TextPattern::TextPattern(TextPattern&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> TextPattern::find_all(const std::string& text) const {
  if (regex_) return regex_->find_all(text);
  std::vector<std::pair<size_t, size_t>> matches;
  if (literal_.empty()) return matches;  // an empty string matches nothing, as Hugging Face's
  for (size_t at = text.find(literal_); at != std::string::npos; at = text.find(literal_, at + literal_.size())) {
    matches.emplace_back(at, at + literal_.size());
  }
  return matches;
}

// ---- HfNormalizer

struct HfNormalizer::Step {
  enum class Kind { Replace, Prepend, Nfc } kind;
  std::unique_ptr<TextPattern> pattern;  // Replace
  std::string content;                   // Replace: the replacement; Prepend: the prefix
  std::string where;
};

HfNormalizer::HfNormalizer(const nlohmann::json& spec, const std::string& where, const Refuse& refuse) {
  for (const nlohmann::json& step : sequence_steps(spec, "normalizers")) {
    const std::string type = step.at("type").get<std::string>();
    if (type == "Replace") {
      steps_.push_back({Step::Kind::Replace,
                        std::make_unique<TextPattern>(step.at("pattern"), where + " normalizer Replace"),
                        step.at("content").get<std::string>(), where});
    } else if (type == "Prepend") {
      steps_.push_back({Step::Kind::Prepend, nullptr, step.at("prepend").get<std::string>(), where});
    } else if (type == "NFC") {
      steps_.push_back({Step::Kind::Nfc, nullptr, "", where});
    } else {
      refuse("normalizer " + type);
    }
  }
}
HfNormalizer::HfNormalizer() = default;
HfNormalizer::~HfNormalizer() = default;
HfNormalizer::HfNormalizer(HfNormalizer&&) noexcept = default;
HfNormalizer& HfNormalizer::operator=(HfNormalizer&&) noexcept = default;

std::string HfNormalizer::normalize(std::string text) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::Replace: text = replace_all(text, *step.pattern, step.content); break;
      case Step::Kind::Prepend:
        if (!text.empty()) text = step.content + text;
        break;
      case Step::Kind::Nfc: text = nfc(text, step.where); break;
    }
  }
  return text;
}

// ---- HfPreTokenizer

struct HfPreTokenizer::Step {
  enum class Kind { Split, Metaspace } kind = Kind::Split;
  std::unique_ptr<TextPattern> pattern;  // Split; Metaspace: the replacement, for its split
  SplitBehavior behavior = SplitBehavior::Isolated;
  std::string replacement;  // Metaspace: "▁"
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool metaspace_split = false;
};

HfPreTokenizer::HfPreTokenizer(const nlohmann::json& spec, const std::string& where, const Refuse& refuse) {
  for (const nlohmann::json& step : sequence_steps(spec, "pretokenizers")) {
    const std::string type = step.at("type").get<std::string>();
    if (type == "Split") {
      if (step.value("invert", false)) refuse("an inverted Split");
      const std::string behavior = step.at("behavior").get<std::string>();
      Step split;
      split.kind = Step::Kind::Split;
      split.pattern = std::make_unique<TextPattern>(step.at("pattern"), where + " pre-tokenizer");
      if (behavior == "Removed") split.behavior = SplitBehavior::Removed;
      else if (behavior == "Isolated") split.behavior = SplitBehavior::Isolated;
      else if (behavior == "MergedWithPrevious") split.behavior = SplitBehavior::MergedWithPrevious;
      else if (behavior == "MergedWithNext") split.behavior = SplitBehavior::MergedWithNext;
      else if (behavior == "Contiguous") split.behavior = SplitBehavior::Contiguous;
      else refuse("Split behaviour " + behavior);
      steps_.push_back(std::move(split));
    } else if (type == "ByteLevel") {
      if (step.value("add_prefix_space", false)) refuse("ByteLevel with add_prefix_space");
      if (step.value("use_regex", true)) {
        Step split;
        split.kind = Step::Kind::Split;
        split.pattern =
            std::make_unique<TextPattern>(nlohmann::json{{"Regex", kGpt2SplitPattern}}, "ByteLevel pre-tokenizer");
        steps_.push_back(std::move(split));
      }
      byte_level_ = true;
    } else if (type == "Metaspace") {
      Step metaspace;
      metaspace.kind = Step::Kind::Metaspace;
      metaspace.replacement = one_character(step.at("replacement"), "Metaspace replacement", refuse);
      const std::string scheme = step.value("prepend_scheme", std::string("always"));
      if (scheme == "always") metaspace.prepend = Step::Prepend::Always;
      else if (scheme == "first") metaspace.prepend = Step::Prepend::First;
      else if (scheme == "never") metaspace.prepend = Step::Prepend::Never;
      else refuse("Metaspace prepend_scheme " + scheme);
      metaspace.metaspace_split = step.value("split", true);
      metaspace.pattern = std::make_unique<TextPattern>(nlohmann::json{{"String", metaspace.replacement}}, "");
      steps_.push_back(std::move(metaspace));
    } else {
      refuse("pre-tokenizer " + type);
    }
  }
}
HfPreTokenizer::HfPreTokenizer() = default;
HfPreTokenizer::~HfPreTokenizer() = default;
HfPreTokenizer::HfPreTokenizer(HfPreTokenizer&&) noexcept = default;
HfPreTokenizer& HfPreTokenizer::operator=(HfPreTokenizer&&) noexcept = default;

std::vector<std::string> HfPreTokenizer::split(const std::string& text, bool at_text_start) const {
  std::vector<PreTokenizedWord> words{{text, at_text_start}};
  for (const Step& step : steps_) {
    std::vector<PreTokenizedWord> next;
    for (PreTokenizedWord& word : words) {
      if (step.kind == Step::Kind::Split) {
        for (const auto& [begin, end] : split_ranges(word.text, *step.pattern, step.behavior)) {
          if (end > begin) next.push_back({word.text.substr(begin, end - begin), word.at_text_start && begin == 0});
        }
        continue;
      }
      // Metaspace (pre_tokenizers/metaspace.rs): spaces become the replacement; the prefix; the split.
      std::string replaced = replace_literal(word.text, " ", step.replacement);
      const bool starts_replaced = replaced.compare(0, step.replacement.size(), step.replacement) == 0;
      if (!starts_replaced &&
          (step.prepend == Step::Prepend::Always || (step.prepend == Step::Prepend::First && word.at_text_start))) {
        replaced = step.replacement + replaced;
      }
      if (!step.metaspace_split) {
        if (!replaced.empty()) next.push_back({std::move(replaced), word.at_text_start});
        continue;
      }
      for (const auto& [begin, end] : split_ranges(replaced, *step.pattern, SplitBehavior::MergedWithNext)) {
        if (end > begin) next.push_back({replaced.substr(begin, end - begin), word.at_text_start && begin == 0});
      }
    }
    words.swap(next);
  }
  std::vector<std::string> out;
  out.reserve(words.size());
  for (auto& word : words) {
    if (!word.text.empty()) out.push_back(std::move(word.text));
  }
  return out;
}

// ---- HfDecoder

struct HfDecoder::Step {
  enum class Kind { Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
  std::string pattern, content;          // Replace: literal -> content; Strip: the character; Metaspace: replacement
  size_t start = 0, stop = 0;            // Strip: at most this many at each end
  bool drop_first_replacements = false;  // Metaspace: prepend_scheme other than never
};

HfDecoder::HfDecoder(const nlohmann::json& spec, const std::string& where, const Refuse& refuse) : present_(true) {
  (void)where;
  for (const nlohmann::json& step : sequence_steps(spec, "decoders")) {
    const std::string type = step.at("type").get<std::string>();
    Step decoded{};
    if (type == "Replace") {
      if (!step.at("pattern").contains("String")) refuse("a Replace decoder on a regex");
      decoded = {Step::Kind::Replace, step.at("pattern").at("String").get<std::string>(),
                 step.at("content").get<std::string>()};
    } else if (type == "ByteFallback") {
      decoded.kind = Step::Kind::ByteFallback;
    } else if (type == "Fuse") {
      decoded.kind = Step::Kind::Fuse;
    } else if (type == "Strip") {
      decoded = {Step::Kind::Strip, "", one_character(step.at("content"), "Strip content", refuse),
                 step.at("start").get<size_t>(), step.at("stop").get<size_t>()};
    } else if (type == "Metaspace") {
      decoded = {Step::Kind::Metaspace, "", one_character(step.at("replacement"), "Metaspace replacement", refuse)};
      decoded.drop_first_replacements = step.value("prepend_scheme", std::string("always")) != "never";
    } else {
      refuse("decoder " + type + (type == "ByteLevel" ? " inside a Sequence" : ""));
    }
    steps_.push_back(std::move(decoded));
  }
}
HfDecoder::HfDecoder() = default;
HfDecoder::~HfDecoder() = default;
HfDecoder::HfDecoder(HfDecoder&&) noexcept = default;
HfDecoder& HfDecoder::operator=(HfDecoder&&) noexcept = default;

namespace {
// "<0x41>" -> 0x41; -1 for any other token (decoders/byte_fallback.rs).
int byte_token(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int high = hex(token[3]), low = hex(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

bool valid_utf8(const std::string& bytes) {
  return utf8proc_decompose(reinterpret_cast<const utf8proc_uint8_t*>(bytes.data()),
                            static_cast<utf8proc_ssize_t>(bytes.size()), nullptr, 0, utf8proc_option_t{}) >= 0;
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  std::string bytes;
  size_t byte_tokens = 0;
  auto flush = [&] {
    if (byte_tokens == 0) return;
    if (valid_utf8(bytes)) {
      out.push_back(bytes);
    } else {
      for (size_t i = 0; i < byte_tokens; ++i) out.emplace_back("\xEF\xBF\xBD");  // U+FFFD per byte
    }
    bytes.clear();
    byte_tokens = 0;
  };
  for (auto& token : tokens) {
    if (const int byte = byte_token(token); byte >= 0) {
      bytes.push_back(static_cast<char>(byte));
      ++byte_tokens;
    } else {
      flush();
      out.push_back(std::move(token));
    }
  }
  flush();
  return out;
}
}  // namespace

std::string HfDecoder::decode(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::Replace:
        for (auto& token : tokens) {
          token = step.pattern.empty() ? token : replace_literal(token, step.pattern, step.content);
        }
        break;
      case Step::Kind::ByteFallback: tokens = byte_fallback(std::move(tokens)); break;
      case Step::Kind::Fuse: {
        std::string fused;
        for (const auto& token : tokens) fused += token;
        tokens = {fused};
        break;
      }
      case Step::Kind::Strip:
        for (auto& token : tokens) {
          std::vector<std::string> chars = characters(token);
          size_t begin = 0, end = chars.size();
          while (begin < step.start && begin < chars.size() && chars[begin] == step.content) ++begin;
          for (size_t i = 0; i < step.stop && end > begin && chars[end - 1] == step.content; ++i) --end;
          std::string stripped;
          for (size_t i = begin; i < end; ++i) stripped += chars[i];
          token = stripped;
        }
        break;
      case Step::Kind::Metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          const bool drop = i == 0 && step.drop_first_replacements;
          tokens[i] = replace_literal(tokens[i], step.content, drop ? "" : " ");
        }
        break;
    }
  }
  std::string text;
  for (const auto& token : tokens) text += token;
  return text;
}

}  // namespace fsdp::data
