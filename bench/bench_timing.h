// bench/bench_timing.h: the device benchmarks' timing (nf4_decode_bench, fused_ops_bench): the
// median of repeated samples, each after the device's queue has drained.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace fsdp_bench {

inline void synchronize(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? 0 : device.index());
}

// The median over `repeats` of the seconds one call of `fn` takes (`inner` calls per sample), after
// one call of warm-up (allocations, first copies).
inline double median_seconds(const at::Device& device, int repeats, int inner, const std::function<void()>& fn) {
  fn();
  synchronize(device);
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) fn();
    synchronize(device);
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / inner);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace fsdp_bench
