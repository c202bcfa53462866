#include "fsdp/data/tokenizer.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <limits>
#include <climits>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "byte_level_bpe.h"
#include "utf8_repair.h"
#include "unicode_regex.h"

namespace fsdp::data {

namespace {
// The low 24 bits of the crc32 of the files' contents, in order (TokenizerStamp::checksum).
uint32_t files_checksum(std::initializer_list<std::string> paths) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()));
  }
  return static_cast<uint32_t>(crc) & 0xFFFFFFu;
}
}  // namespace

const char* tokenizer_kind_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::Byte: return "byte";
    case TokenizerKind::Gpt2: return "gpt2";
    case TokenizerKind::Hf: return "hf";
    case TokenizerKind::Unknown: break;
  }
  return "";
}

std::string TokenizerStamp::describe() const {
  if (kind == TokenizerKind::Unknown) return "an unknown tokenizer";
  if (kind == TokenizerKind::Byte) return "the byte tokenizer";
  char text[96];
  std::snprintf(text, sizeof(text), "the %s tokenizer (%s crc32 ...%06x)", tokenizer_kind_name(kind),
                kind == TokenizerKind::Hf ? "tokenizer.json's" : "vocab.json and merges.txt's", checksum);
  return text;
}

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id > 255) throw std::out_of_range("byte tokenizer: id " + std::to_string(id) + " is not a byte");
    text.push_back(static_cast<char>(id));
  }
  return replace_invalid_utf8(text);
}

namespace {

// GPT-2's pre-tokenisation pattern (its encoder.py), with Unicode classes.
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

nlohmann::json read_json(const std::string& path, const std::string& what) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error(what + ": cannot open '" + path + "'");
  try {
    return nlohmann::json::parse(file);
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": '" + path + "' is not valid JSON: " + e.what());
  }
}

// Cuts `text` at every match of `regex`: the matches and the stretches between them, in order,
// each a piece (Hugging Face's Split with behaviour Isolated).
void split_isolated(const UnicodeRegex& regex, const std::string& text, std::vector<std::string>& out) {
  size_t last = 0;
  for (const auto& [begin, end] : regex.find_all(text)) {
    if (begin > last) out.push_back(text.substr(last, begin - last));
    out.push_back(text.substr(begin, end - begin));
    last = end;
  }
  if (last < text.size()) out.push_back(text.substr(last));
}

const UnicodeRegex& gpt2_regex() {
  static const UnicodeRegex regex(kGpt2Pattern, "gpt2 pre-tokenizer");
  return regex;
}

}  // namespace

std::vector<std::string> Gpt2BpeTokenizer::split_words(const std::string& text) {
  std::vector<std::string> words;
  split_isolated(gpt2_regex(), text, words);
  return words;
}

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_json_path, const std::string& merges_txt_path)
    : checksum_(files_checksum({vocab_json_path, merges_txt_path})) {
  const nlohmann::json vocab = read_json(vocab_json_path, "gpt2 tokenizer");
  if (!vocab.is_object() || vocab.empty()) {
    throw std::runtime_error("gpt2 tokenizer: '" + vocab_json_path + "' must be a JSON object of token -> id");
  }
  std::unordered_map<std::string, int32_t> token_to_id;
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(vocab.size())) {
      throw std::runtime_error("gpt2 tokenizer: '" + vocab_json_path + "': token '" + token + "' has id " + id.dump() +
                               ", expected an integer in [0, " + std::to_string(vocab.size()) + ")");
    }
    const int32_t index = id.get<int32_t>();
    if (seen[static_cast<size_t>(index)]) {
      throw std::runtime_error("gpt2 tokenizer: '" + vocab_json_path + "': id " + std::to_string(index) +
                               " appears twice");
    }
    seen[static_cast<size_t>(index)] = true;
    token_to_id[token] = index;
  }
  if (auto it = token_to_id.find("<|endoftext|>"); it != token_to_id.end()) end_of_text_ = it->second;

  std::ifstream merges_file(merges_txt_path);
  if (!merges_file) throw std::runtime_error("gpt2 tokenizer: cannot open merges '" + merges_txt_path + "'");
  std::vector<std::string> merges;
  std::string line;
  int line_number = 0;
  while (std::getline(merges_file, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      throw std::runtime_error("gpt2 tokenizer: " + merges_txt_path + ":" + std::to_string(line_number) +
                               ": expected two symbols separated by one space, got '" + line + "'");
    }
    merges.push_back(line);
  }
  bpe_ = std::make_unique<ByteLevelBpe>(std::move(token_to_id), merges, /*ignore_merges=*/false,
                                        "gpt2 tokenizer: '" + vocab_json_path + "'");
}

Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

int64_t Gpt2BpeTokenizer::vocab_size() const { return bpe_->id_limit(); }

std::vector<int32_t> Gpt2BpeTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  bpe_->encode_words(split_words(text), ids);
  return ids;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range("gpt2 tokenizer: id " + std::to_string(id) + " outside the vocabulary of " +
                              std::to_string(vocab_size()));
    }
    if (id == end_of_text_) {
      text += bpe_->token(id);
      continue;
    }
    if (!bpe_->token_bytes(id, text)) {
      throw std::runtime_error("gpt2 tokenizer: token " + std::to_string(id) + " ('" + bpe_->token(id) +
                               "') is not made of byte symbols");
    }
  }
  return replace_invalid_utf8(text);
}

// One Split(Regex) step of a tokenizer.json pre-tokenizer.
struct HfTokenizer::SplitStep {
  std::unique_ptr<UnicodeRegex> regex;
};

HfTokenizer::HfTokenizer(const std::string& path)
    : source_("tokenizer.json '" + path + "'"), checksum_(files_checksum({path})) {
  const nlohmann::json root = read_json(path, "hf tokenizer");
  auto refuse = [&](const std::string& what) {
    throw std::runtime_error("hf tokenizer: " + source_ + ": " + what +
                             " is not supported (byte-level BPE only: Llama 3, GPT-2, Qwen2's model)");
  };
  try {
    if (!root.is_object() || !root.contains("model")) throw std::runtime_error("no \"model\"");
    if (root.contains("normalizer") && !root["normalizer"].is_null()) {
      refuse("normalizer " + root["normalizer"].value("type", std::string("?")));
    }
    // The pre-tokenizer: Split(Regex, Isolated) steps and one ByteLevel (no prefix space).
    bool byte_level = false;
    auto add_step = [&](const nlohmann::json& step) {
      const std::string type = step.at("type").get<std::string>();
      if (type == "Split") {
        if (!step.at("pattern").contains("Regex")) refuse("a Split on a plain string");
        if (step.at("behavior").get<std::string>() != "Isolated")
          refuse("Split behaviour " + step.at("behavior").dump());
        if (step.value("invert", false)) refuse("an inverted Split");
        SplitStep split;
        split.regex = std::make_unique<UnicodeRegex>(step.at("pattern").at("Regex").get<std::string>(),
                                                     "hf tokenizer: " + source_ + " pre-tokenizer");
        splits_.push_back(std::move(split));
      } else if (type == "ByteLevel") {
        if (step.value("add_prefix_space", false)) refuse("ByteLevel with add_prefix_space");
        if (step.value("use_regex", true)) {
          SplitStep split;
          split.regex = std::make_unique<UnicodeRegex>(kGpt2Pattern, "hf tokenizer: ByteLevel");
          splits_.push_back(std::move(split));
        }
        byte_level = true;
      } else {
        refuse("pre-tokenizer " + type);
      }
    };
    const nlohmann::json& pre = root.at("pre_tokenizer");
    if (pre.at("type").get<std::string>() == "Sequence") {
      for (const auto& step : pre.at("pretokenizers")) add_step(step);
    } else {
      add_step(pre);
    }
    if (!byte_level) refuse("a pre-tokenizer without ByteLevel");
    if (root.at("decoder").at("type").get<std::string>() != "ByteLevel") {
      refuse("decoder " + root.at("decoder").at("type").get<std::string>());
    }

    const nlohmann::json& model = root.at("model");
    if (model.value("type", std::string("BPE")) != "BPE") refuse("model " + model.value("type", std::string("?")));
    if (model.value("byte_fallback", false)) refuse("BPE byte_fallback");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
      if (model.contains(key) && !model[key].is_null()) refuse(std::string("BPE ") + key);
    }
    // An id is a JSON integer in [0, limit): anything else (5.5, 1e122, "7", 2^64 - 1) is refused
    // before a conversion, which would truncate it or, out of range, be undefined behaviour.
    auto id_below = [&](const nlohmann::json& id, int64_t limit, const std::string& what, const std::string& expected) {
      const bool fits = id.is_number_unsigned()  ? id.get<uint64_t>() < static_cast<uint64_t>(limit)
                        : id.is_number_integer() ? id.get<int64_t>() >= 0 && id.get<int64_t>() < limit
                                                 : false;
      if (!fits) {
        throw std::runtime_error("hf tokenizer: " + source_ + ": " + what + " has id " + id.dump() +
                                 ", expected an id in [0, " + std::to_string(limit) + ")" + expected);
      }
      return static_cast<int32_t>(id.get<int64_t>());
    };
    std::unordered_map<std::string, int32_t> vocab;
    const int64_t vocab_entries = static_cast<int64_t>(model.at("vocab").size());
    for (const auto& [token, id] : model.at("vocab").items()) {
      vocab[token] = id_below(id, vocab_entries, "token '" + token + "'", "");
    }
    std::vector<std::string> merges;
    merges.reserve(model.at("merges").size());
    for (const auto& merge : model.at("merges")) {
      // "left right" (older files) or ["left", "right"] (newer ones).
      merges.push_back(merge.is_string() ? merge.get<std::string>()
                                         : merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>());
    }
    bpe_ = std::make_unique<ByteLevelBpe>(std::move(vocab), merges, model.value("ignore_merges", false),
                                          "hf tokenizer: " + source_);
    vocab_size_ = bpe_->id_limit();

    for (const auto& token : root.value("added_tokens", nlohmann::json::array())) {
      const std::string content = token.at("content").get<std::string>();
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        if (token.value(flag, false)) refuse("added token " + content + " with " + flag);
      }
      // Added tokens extend the vocabulary (Llama 3's 256 after 128000) or name some of its tokens
      // (GPT-2's <|endoftext|>): at most one new id per added token.
      const int64_t limit = bpe_->id_limit() + static_cast<int64_t>(root.at("added_tokens").size());
      const int32_t id =
          id_below(token.at("id"), limit, "added token '" + content + "'", " (the vocabulary plus the added tokens)");
      added_[content] = id;
      added_by_id_[id] = content;
      if (!content.empty()) starts_added_[static_cast<unsigned char>(content[0])] = true;
      vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("hf tokenizer: " + source_ + ": unexpected layout: " + e.what());
  }
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>"}) {
    if (auto it = added_.find(name); it != added_.end()) {
      end_of_text_ = it->second;
      break;
    }
  }
}

HfTokenizer::~HfTokenizer() = default;

int32_t HfTokenizer::token_id(const std::string& token) const {
  if (auto it = added_.find(token); it != added_.end()) return it->second;
  return bpe_->id_of(token);
}

std::vector<std::string> HfTokenizer::pre_tokenize(const std::string& text) const {
  std::vector<std::string> pieces{text};
  for (const SplitStep& step : splits_) {
    std::vector<std::string> next;
    for (const auto& piece : pieces) split_isolated(*step.regex, piece, next);
    pieces.swap(next);
  }
  return pieces;
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text) const {
  // Added tokens first: the leftmost occurrence of any, the longest at that position; the text
  // between them goes through the pre-tokenizer and the model.
  std::vector<int32_t> ids;
  size_t plain_start = 0, i = 0;
  while (i < text.size()) {
    int32_t found = -1;
    size_t found_length = 0;
    if (starts_added_[static_cast<unsigned char>(text[i])]) {
      // Candidates share the first byte: the map's range of keys that start with it.
      const std::string first(1, text[i]);
      for (auto it = added_.lower_bound(first); it != added_.end() && it->first[0] == text[i]; ++it) {
        if (it->first.size() > found_length && text.compare(i, it->first.size(), it->first) == 0) {
          found = it->second;
          found_length = it->first.size();
        }
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    if (i > plain_start) bpe_->encode_words(pre_tokenize(text.substr(plain_start, i - plain_start)), ids);
    ids.push_back(found);
    i += found_length;
    plain_start = i;
  }
  if (plain_start < text.size()) bpe_->encode_words(pre_tokenize(text.substr(plain_start)), ids);
  return ids;
}

std::vector<int32_t> HfTokenizer::encode_plain(const std::string& text) const {
  std::vector<int32_t> ids;
  if (!text.empty()) bpe_->encode_words(pre_tokenize(text), ids);
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      text += it->second;
    } else if (!bpe_->token_bytes(id, text)) {
      throw std::out_of_range("hf tokenizer: " + source_ + ": id " + std::to_string(id) + " is no token of it");
    }
  }
  return replace_invalid_utf8(text);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json,
                                          const std::string& merges_txt, const std::string& tokenizer_json) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "hf") {
    if (tokenizer_json.empty()) throw std::invalid_argument("tokenizer 'hf' needs a tokenizer.json path");
    return std::make_unique<HfTokenizer>(tokenizer_json);
  }
  if (kind == "gpt2") {
    if (vocab_json.empty() || merges_txt.empty()) {
      throw std::invalid_argument("tokenizer 'gpt2' needs a vocab.json and a merges.txt path");
    }
    return std::make_unique<Gpt2BpeTokenizer>(vocab_json, merges_txt);
  }
  throw std::invalid_argument("unknown tokenizer '" + kind + "' (known: byte, gpt2, hf)");
}

}  // namespace fsdp::data
