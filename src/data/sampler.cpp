#include "fsdp/data/sampler.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>

namespace fsdp::data {

GlobalBatchSampler::GlobalBatchSampler(int64_t items, int64_t global_batch, uint64_t seed)
    : items_(items), global_batch_(global_batch), seed_(seed) {
  if (items < 1) throw std::invalid_argument("sampler: the dataset is empty (0 samples)");
  if (global_batch < 1) throw std::invalid_argument("sampler: global batch must be positive");
}

const std::vector<int64_t>& GlobalBatchSampler::permutation(int64_t epoch) const {
  if (epoch != cached_epoch_) {
    cached_.resize(items_);
    for (int64_t i = 0; i < items_; ++i) cached_[i] = i;
    // mt19937_64 and a hand-written Fisher-Yates: both fully specified, so the order is the
    // same on every platform and library version (std::shuffle's algorithm is not specified).
    std::mt19937_64 generator(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    for (int64_t i = items_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(generator() % static_cast<uint64_t>(i + 1));
      std::swap(cached_[i], cached_[j]);
    }
    cached_epoch_ = epoch;
  }
  return cached_;
}

std::vector<int64_t> GlobalBatchSampler::indices(int64_t step, int rank, int world) const {
  if (world < 1 || global_batch_ % world != 0) {
    throw std::invalid_argument("sampler: global batch " + std::to_string(global_batch_) +
                                " is not divisible by the number of ranks " + std::to_string(world));
  }
  if (rank < 0 || rank >= world) throw std::invalid_argument("sampler: rank out of range");
  const int64_t local = global_batch_ / world;
  std::vector<int64_t> out;
  out.reserve(local);
  for (int64_t k = 0; k < local; ++k) {
    const int64_t position = step * global_batch_ + rank * local + k;  // in the endless stream of epochs
    out.push_back(permutation(position / items_)[position % items_]);
  }
  return out;
}

}  // namespace fsdp::data
