#include "bpe_model.h"

#include <array>
#include <atomic>
#include <climits>
#include <stdexcept>

namespace fsdp::data {

namespace {
constexpr size_t kCachedWords = size_t{1} << 18;  // per thread and instance
constexpr size_t kCachedInstances = 4;
std::atomic<uint64_t> g_next_instance{1};
}  // namespace

BpeMerges::BpeMerges(const std::vector<std::string>& merges) {
  int32_t rank = 0;
  for (const auto& pair : merges) rank_.emplace(pair, rank++);
}

void BpeMerges::apply(std::vector<std::string>& symbols) const {
  while (symbols.size() > 1) {
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = rank_.find(symbols[i] + " " + symbols[i + 1]);
      if (it != rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) return;
    const std::string left = symbols[best], right = symbols[best + 1];
    std::vector<std::string> merged;
    merged.reserve(symbols.size());
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
}

std::vector<std::string> tokens_by_id(const std::unordered_map<std::string, int32_t>& token_to_id,
                                      const std::string& source) {
  const int64_t size = static_cast<int64_t>(token_to_id.size());
  int32_t largest = -1;
  for (const auto& [token, id] : token_to_id) {
    if (id < 0 || id >= size) {
      throw std::runtime_error(source + ": token '" + token + "' has id " + std::to_string(id) +
                               ", expected an id in [0, " + std::to_string(size) + ") (the vocabulary's size)");
    }
    largest = std::max(largest, id);
  }
  std::vector<std::string> tokens(static_cast<size_t>(largest + 1));
  for (const auto& [token, id] : token_to_id) tokens[static_cast<size_t>(id)] = token;
  return tokens;
}

uint64_t new_bpe_instance() { return g_next_instance++; }

BpeWordCache& this_threads_word_cache(uint64_t instance) {
  thread_local std::array<std::pair<uint64_t, BpeWordCache>, kCachedInstances> slots;
  thread_local size_t next_slot = 0;
  for (auto& slot : slots) {
    if (slot.first == instance) return slot.second;
  }
  auto& slot = slots[next_slot++ % kCachedInstances];  // the oldest instance's gives way
  slot.first = instance;
  slot.second.clear();
  return slot.second;
}

void remember_word(BpeWordCache& cache, const std::string& word, const std::vector<int32_t>& ids) {
  if (cache.size() > kCachedWords) cache.clear();
  cache.emplace(word, ids);
}

}  // namespace fsdp::data
