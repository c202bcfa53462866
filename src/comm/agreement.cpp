#include "fsdp/comm/agreement.h"

#include <ATen/ATen.h>

namespace fsdp::comm {

void agree_on_failure(const ProcessGroupPtr& group, const std::string& local_error, const std::string& stage) {
  const int n = group->size(), rank = group->rank();
  // Two maxima in one reduction: (n - lowest failing rank), and whether rank 0 failed.
  at::Tensor flags = at::zeros({2}, at::kDouble);
  if (!local_error.empty()) {
    flags[0] = static_cast<double>(n - rank);
    if (rank == 0) flags[1] = 1.0;
  }
  if (n > 1) group->all_reduce(flags, ReduceOp::Max)->wait();
  const double highest = flags[0].item<double>();
  if (highest == 0.0) return;
  const int first_failed = n - static_cast<int>(highest);
  const bool rank0_failed = flags[1].item<double>() > 0.0;
  if (!local_error.empty() && (rank == first_failed || !rank0_failed)) {
    throw AgreedStop(n > 1 && rank != 0 ? "rank " + std::to_string(rank) + ": " + local_error : local_error, true);
  }
  throw AgreedStop("stopped while " + stage + ": rank " + std::to_string(first_failed) + " failed", false);
}

}  // namespace fsdp::comm
