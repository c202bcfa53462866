#include "byte_level_bpe.h"

#include <array>
#include <atomic>
#include <climits>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace fsdp::data {

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

// Word caches: each thread keeps its own for the last few tokenizer instances it encoded with,
// named by an instance number that is never reused (an address could be, by a later instance).
using WordCache = std::unordered_map<std::string, std::vector<int32_t>>;
constexpr size_t kCachedWords = size_t{1} << 18;  // per thread and instance
constexpr size_t kCachedInstances = 4;
std::atomic<uint64_t> g_next_instance{1};

WordCache& this_threads_cache(uint64_t instance) {
  thread_local std::array<std::pair<uint64_t, WordCache>, kCachedInstances> slots;
  thread_local size_t next_slot = 0;
  for (auto& slot : slots) {
    if (slot.first == instance) return slot.second;
  }
  auto& slot = slots[next_slot++ % kCachedInstances];  // the oldest instance's gives way
  slot.first = instance;
  slot.second.clear();
  return slot.second;
}
}  // namespace

const std::string& byte_level_symbol(uint8_t byte) {
  static const std::vector<std::string> symbols = [] {
    std::vector<std::string> table(256);
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      table[static_cast<size_t>(b)] = utf8(printable ? b : 256 + next_extra++);
    }
    return table;
  }();
  return symbols[byte];
}

ByteLevelBpe::ByteLevelBpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::string>& merges,
                           bool ignore_merges, const std::string& source)
    : token_to_id_(std::move(vocab)), ignore_merges_(ignore_merges), instance_(g_next_instance++) {
  for (int b = 0; b < 256; ++b) {
    byte_to_symbol_[b] = byte_level_symbol(static_cast<uint8_t>(b));
    symbol_to_byte_[byte_to_symbol_[b]] = static_cast<uint8_t>(b);
  }
  // Ids index id_to_token_: each must lie in [0, vocabulary size) (the layout every BPE file has),
  // or a crafted file would index out of bounds (found by tests/fuzz/fuzz_tokenizer_json).
  const int64_t size = static_cast<int64_t>(token_to_id_.size());
  int32_t largest = -1;
  for (const auto& [token, id] : token_to_id_) {
    if (id < 0 || id >= size) {
      throw std::runtime_error(source + ": token '" + token + "' has id " + std::to_string(id) +
                               ", expected an id in [0, " + std::to_string(size) + ") (the vocabulary's size)");
    }
    largest = std::max(largest, id);
  }
  id_to_token_.resize(static_cast<size_t>(largest + 1));
  for (const auto& [token, id] : token_to_id_) id_to_token_[static_cast<size_t>(id)] = token;
  for (int b = 0; b < 256; ++b) {
    if (!token_to_id_.count(byte_to_symbol_[b])) {
      throw std::runtime_error(source + " lacks the token for byte " + std::to_string(b) +
                               " (a byte-level BPE vocabulary has all 256)");
    }
  }
  int32_t rank = 0;
  for (const auto& pair : merges) merge_rank_.emplace(pair, rank++);
}

int32_t ByteLevelBpe::id_of(const std::string& token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::vector<int32_t> ByteLevelBpe::encode_word(const std::string& word) const {
  WordCache& cache = this_threads_cache(instance_);
  if (auto it = cache.find(word); it != cache.end()) return it->second;
  std::vector<int32_t> ids = merge(word);
  if (cache.size() > kCachedWords) cache.clear();  // bounded: a long corpus of unique words
  cache.emplace(word, ids);
  return ids;
}

void ByteLevelBpe::encode_words(const std::vector<std::string>& words, std::vector<int32_t>& ids) const {
  for (const auto& word : words) {
    const std::vector<int32_t> word_ids = encode_word(word);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  }
}

std::vector<int32_t> ByteLevelBpe::merge(const std::string& word) const {
  std::vector<std::string> symbols;
  for (unsigned char b : word) symbols.push_back(byte_to_symbol_[b]);
  if (ignore_merges_) {
    std::string whole;
    for (const auto& s : symbols) whole += s;
    if (auto it = token_to_id_.find(whole); it != token_to_id_.end()) return {it->second};
  }
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

bool ByteLevelBpe::token_bytes(int32_t id, std::string& out) const {
  if (id < 0 || id >= id_limit() || id_to_token_[static_cast<size_t>(id)].empty()) return false;
  const std::string& token = id_to_token_[static_cast<size_t>(id)];
  std::string bytes;
  for (size_t i = 0; i < token.size(); i += utf8_length(token[i])) {
    auto it = symbol_to_byte_.find(token.substr(i, utf8_length(token[i])));
    if (it == symbol_to_byte_.end()) return false;
    bytes.push_back(static_cast<char>(it->second));
  }
  out += bytes;
  return true;
}

}  // namespace fsdp::data
