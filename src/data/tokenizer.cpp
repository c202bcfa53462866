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
#include "tokenizer_files.h"
#include "utf8_repair.h"
#include "unicode_regex.h"

namespace fsdp::data {

uint32_t files_checksum(std::initializer_list<std::string> paths) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()));
  }
  return static_cast<uint32_t>(crc) & 0xFFFFFFu;
}

nlohmann::json read_json(const std::string& path, const std::string& what) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error(what + ": cannot open '" + path + "'");
  try {
    return nlohmann::json::parse(file);
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": '" + path + "' is not valid JSON: " + e.what());
  }
}

const char* tokenizer_kind_name(TokenizerKind kind) { return kind == TokenizerKind::Unknown ? "" : enum_name(kind); }

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
  static const UnicodeRegex regex(kGpt2SplitPattern, "gpt2 pre-tokenizer");
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

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& vocab_json,
                                          const std::string& merges_txt, const std::string& tokenizer_json) {
  switch (kind) {
    case TokenizerKind::Byte: return std::make_unique<ByteTokenizer>();
    case TokenizerKind::Hf:
      if (tokenizer_json.empty()) throw std::invalid_argument("tokenizer 'hf' needs a tokenizer.json path");
      return std::make_unique<HfTokenizer>(tokenizer_json);
    case TokenizerKind::Gpt2:
      if (vocab_json.empty() || merges_txt.empty()) {
        throw std::invalid_argument("tokenizer 'gpt2' needs a vocab.json and a merges.txt path");
      }
      return std::make_unique<Gpt2BpeTokenizer>(vocab_json, merges_txt);
    case TokenizerKind::Unknown: break;
  }
  throw std::invalid_argument("an unknown tokenizer kind");
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json,
                                          const std::string& merges_txt, const std::string& tokenizer_json) {
  TokenizerKind known;
  try {
    known = enum_from_name<TokenizerKind>(kind);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("unknown tokenizer ") + e.what());
  }
  return make_tokenizer(known, vocab_json, merges_txt, tokenizer_json);
}

}  // namespace fsdp::data
