// fsdp/data/sampler.h: which samples each rank trains on at each step.
//
// The data is a list of `items` (fixed-length token windows, or images). Epoch e visits them in a
// random order drawn from (seed, e); the steps read that stream in consecutive global batches, and
// rank r of N takes the r-th of N equal slices of each global batch. So the ranks' shares are
// disjoint, the global batch is the same whatever N is, and the indices of any step follow from
// the step number alone: resuming at step s needs nothing but s.
#pragma once

#include <cstdint>
#include <vector>

namespace fsdp::data {

class GlobalBatchSampler {
 public:
  // Throws std::invalid_argument when items < 1 or global_batch < 1.
  GlobalBatchSampler(int64_t items, int64_t global_batch, uint64_t seed);

  // Indices (into the items) of rank `rank`'s share of step `step`: global_batch / world of them.
  // Throws std::invalid_argument when world does not divide global_batch.
  std::vector<int64_t> indices(int64_t step, int rank, int world) const;

  int64_t items() const { return items_; }
  int64_t global_batch() const { return global_batch_; }
  int64_t epoch_of_step(int64_t step) const { return step * global_batch_ / items_; }

 private:
  const std::vector<int64_t>& permutation(int64_t epoch) const;

  int64_t items_;
  int64_t global_batch_;
  uint64_t seed_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_;
};

}  // namespace fsdp::data
