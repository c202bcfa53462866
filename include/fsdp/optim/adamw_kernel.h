// fsdp/optim/adamw_kernel.h: how ShardedAdamW updates a shard (optimizer.kernel, AdamWOptions::kernel).
#pragma once

#include "fsdp/enum_names.h"

namespace fsdp::optim {
// Fused: libtorch's _fused_adamw_ over every shard, weight decay inside the kernel, one pass; it
// also takes the step's skip flag on the device (ShardedOptimizer::step_unless), so the host never
// waits for the gradient norm. Its rounding differs from the composed update by about 1 ulp a step.
// Composed: torch::optim::AdamW's element-wise passes, bit for bit.
enum class AdamWKernel { Fused, Composed };
}  // namespace fsdp::optim

namespace fsdp {
template <>
struct EnumNames<optim::AdamWKernel> {
  static constexpr std::pair<optim::AdamWKernel, const char*> values[] = {
      {optim::AdamWKernel::Fused, "fused"},
      {optim::AdamWKernel::Composed, "composed"},
  };
};
}  // namespace fsdp
