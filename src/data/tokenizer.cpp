#include "fsdp/data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <climits>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fsdp::data {

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
  return text;
}

namespace {

std::string utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

// Length in bytes of the UTF-8 character starting with `lead` (1 for a stray continuation byte).
size_t utf8_length(unsigned char lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

enum class CharClass { Letter, Digit, Space, Other };

CharClass classify(const std::string& text, size_t i) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  if (c >= 0x80) return CharClass::Letter;  // no Unicode tables: non-ASCII counts as a letter
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::Letter;
  if (c >= '0' && c <= '9') return CharClass::Digit;
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return CharClass::Space;
  return CharClass::Other;
}

size_t next_char(const std::string& text, size_t i) { return std::min(text.size(), i + utf8_length(text[i])); }

}  // namespace

std::vector<std::string> Gpt2BpeTokenizer::split_words(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    // 's 't 're 've 'm 'll 'd
    if (text[i] == '\'') {
      static const char* const contractions[] = {"ll", "re", "ve", "s", "t", "m", "d"};
      bool matched = false;
      for (const char* suffix : contractions) {
        const size_t len = std::char_traits<char>::length(suffix);
        if (text.compare(i + 1, len, suffix) == 0) {
          words.push_back(text.substr(i, len + 1));
          i += len + 1;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    // ' ?' followed by a run of one class (letters, digits, or other non-space characters).
    size_t start = i;
    size_t j = i;
    if (text[j] == ' ' && j + 1 < n && classify(text, j + 1) != CharClass::Space) ++j;
    const CharClass run = classify(text, j);
    if (run != CharClass::Space) {
      while (j < n && classify(text, j) == run) j = next_char(text, j);
      words.push_back(text.substr(start, j - start));
      i = j;
      continue;
    }
    // Whitespace: \s+(?!\S) leaves the last space to the following word; \s+ takes a lone one.
    j = i;
    while (j < n && classify(text, j) == CharClass::Space) ++j;
    if (j < n && j - i > 1) --j;
    words.push_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_json_path, const std::string& merges_txt_path) {
  // GPT-2's byte -> printable character map: printable Latin-1 bytes map to themselves, the other
  // 68 bytes to code points 256, 257, ... in byte order.
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_to_symbol_[b] = utf8(printable ? b : 256 + next_extra++);
    symbol_to_byte_[byte_to_symbol_[b]] = static_cast<uint8_t>(b);
  }

  std::ifstream vocab_file(vocab_json_path);
  if (!vocab_file) throw std::runtime_error("gpt2 tokenizer: cannot open vocabulary '" + vocab_json_path + "'");
  nlohmann::json vocab;
  try {
    vocab_file >> vocab;
  } catch (const std::exception& e) {
    throw std::runtime_error("gpt2 tokenizer: '" + vocab_json_path + "' is not valid JSON: " + e.what());
  }
  if (!vocab.is_object() || vocab.empty()) {
    throw std::runtime_error("gpt2 tokenizer: '" + vocab_json_path + "' must be a JSON object of token -> id");
  }
  id_to_token_.resize(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(vocab.size())) {
      throw std::runtime_error("gpt2 tokenizer: '" + vocab_json_path + "': token '" + token + "' has id " + id.dump() +
                               ", expected an integer in [0, " + std::to_string(vocab.size()) + ")");
    }
    const int32_t index = id.get<int32_t>();
    if (!id_to_token_[index].empty()) {
      throw std::runtime_error("gpt2 tokenizer: '" + vocab_json_path + "': id " + std::to_string(index) + " appears twice");
    }
    id_to_token_[index] = token;
    token_to_id_[token] = index;
  }
  for (int b = 0; b < 256; ++b) {
    if (!token_to_id_.count(byte_to_symbol_[b])) {
      throw std::runtime_error("gpt2 tokenizer: '" + vocab_json_path + "' lacks the token for byte " + std::to_string(b) +
                               " (a byte-level BPE vocabulary has all 256)");
    }
  }
  if (auto it = token_to_id_.find("<|endoftext|>"); it != token_to_id_.end()) end_of_text_ = it->second;

  std::ifstream merges_file(merges_txt_path);
  if (!merges_file) throw std::runtime_error("gpt2 tokenizer: cannot open merges '" + merges_txt_path + "'");
  std::string line;
  int line_number = 0;
  int32_t rank = 0;
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
    merge_rank_.emplace(line, rank++);
  }
}

std::vector<int32_t> Gpt2BpeTokenizer::encode_word(const std::string& word) const {
  // Symbols: GPT-2's printable stand-ins for the word's bytes, then merged pairwise by priority.
  std::vector<std::string> symbols;
  for (unsigned char b : word) symbols.push_back(byte_to_symbol_[b]);
  while (symbols.size() > 1) {
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank_.find(symbols[i] + " " + symbols[i + 1]);
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    // Merge every occurrence of the best pair, left to right, as the reference does.
    const std::string left = symbols[best], right = symbols[best + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
        merged.push_back(left + right);
        ++i;
      } else {
        merged.push_back(symbols[i]);
      }
    }
    symbols.swap(merged);
  }
  std::vector<int32_t> ids;
  for (const auto& symbol : symbols) {
    auto it = token_to_id_.find(symbol);
    if (it != token_to_id_.end()) {
      ids.push_back(it->second);
    } else {
      // A merge whose result is not in the vocabulary: fall back to the symbol's bytes.
      for (size_t i = 0; i < symbol.size(); i += utf8_length(symbol[i])) {
        ids.push_back(token_to_id_.at(symbol.substr(i, utf8_length(symbol[i]))));
      }
    }
  }
  return ids;
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const auto& word : split_words(text)) {
    auto word_ids = encode_word(word);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  }
  return ids;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range("gpt2 tokenizer: id " + std::to_string(id) + " outside the vocabulary of " +
                              std::to_string(vocab_size()));
    }
    const std::string& token = id_to_token_[id];
    if (id == end_of_text_) {
      text += token;
      continue;
    }
    for (size_t i = 0; i < token.size(); i += utf8_length(token[i])) {
      auto it = symbol_to_byte_.find(token.substr(i, utf8_length(token[i])));
      if (it == symbol_to_byte_.end()) {
        throw std::runtime_error("gpt2 tokenizer: token " + std::to_string(id) + " ('" + token +
                                 "') is not made of byte symbols");
      }
      text.push_back(static_cast<char>(it->second));
    }
  }
  return text;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json,
                                          const std::string& merges_txt) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "gpt2") {
    if (vocab_json.empty() || merges_txt.empty()) {
      throw std::invalid_argument("tokenizer 'gpt2' needs a vocab.json and a merges.txt path");
    }
    return std::make_unique<Gpt2BpeTokenizer>(vocab_json, merges_txt);
  }
  throw std::invalid_argument("unknown tokenizer '" + kind + "' (known: byte, gpt2)");
}

}  // namespace fsdp::data
