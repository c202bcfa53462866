// fsdp/train/attention_kernel_choice.h: train.attention_kernel on a GPU (the trainer's choice at start).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/attention_kernel.h"

namespace fsdp::train {

// What the run prefers (models::prefer_attention_kernel, process-wide), and why.
struct AttentionKernelChoice {
  models::AttentionKernel kernel = models::AttentionKernel::Flash;
  bool kernel_preferred = true;  // false: measured, but no kernel taken and right; libtorch's own order
  bool measured = false;         // chosen by timing (auto), or named by the config
  // Where measured: rank 0's seconds, forward and backward of `call`, for each kernel libtorch
  // takes for it (+inf: its result was wrong, models::time_attention_kernels).
  std::vector<models::AttentionKernelTiming> timings;
  // Where named: whether libtorch takes it for the model's attention (else it runs the next kernel
  // in its order; unknown, true, where the family gives no attention shape).
  bool taken = true;
  models::AttentionCall call;
};

// named: the config's kernel, preferred as it is (nullopt: auto). call: the model's attention for a
// micro-batch (models::attention_call with its batch and mask), nullopt where the family gives none.
// Auto with a call: every rank times the kernels libtorch takes for it at once (as it will
// train), all take rank 0's timings (so that all ranks compute alike) and prefer the fastest right
// one. Auto without one: nothing preferred, libtorch's own order, nullopt. On a GPU; collective.
std::optional<AttentionKernelChoice> choose_attention_kernel_for(const std::optional<models::AttentionKernel>& named,
                                                                 const std::optional<models::AttentionCall>& call,
                                                                 at::ScalarType dtype, at::Device device,
                                                                 const comm::ProcessGroupPtr& world);

// Rank 0's timings on every rank (a kernel rank 0 did not time stays out). Collective.
std::vector<models::AttentionKernelTiming> rank0_attention_timings(
    const std::vector<models::AttentionKernelTiming>& mine, const comm::ProcessGroupPtr& world);

// The fastest of `timings` whose time is finite (a wrong kernel's is +inf); nullopt where none is.
std::optional<models::AttentionKernel> fastest_attention_kernel(
    const std::vector<models::AttentionKernelTiming>& timings);

}  // namespace fsdp::train
