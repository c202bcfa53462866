#include "fsdp/train/attention_kernel_choice.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "fsdp/comm/agreement.h"
#include "fsdp/enum_names.h"

namespace fsdp::train {

std::vector<models::AttentionKernelTiming> rank0_attention_timings(
    const std::vector<models::AttentionKernelTiming>& mine, const comm::ProcessGroupPtr& world) {
  // [seconds per kernel, in EnumNames order]; NaN: not timed.
  const auto& kernels = EnumNames<models::AttentionKernel>::values;
  at::Tensor seconds = at::full({static_cast<int64_t>(std::size(kernels))}, std::nan(""), at::kDouble);
  for (const models::AttentionKernelTiming& t : mine) {
    for (size_t i = 0; i < std::size(kernels); ++i) {
      if (kernels[i].first == t.kernel) seconds[static_cast<int64_t>(i)] = t.seconds;
    }
  }
  if (world->size() > 1) world->broadcast(seconds, 0)->wait();
  std::vector<models::AttentionKernelTiming> agreed;
  for (size_t i = 0; i < std::size(kernels); ++i) {
    const double s = seconds[static_cast<int64_t>(i)].item<double>();
    if (!std::isnan(s)) agreed.push_back({kernels[i].first, s});
  }
  return agreed;
}

std::optional<models::AttentionKernel> fastest_attention_kernel(
    const std::vector<models::AttentionKernelTiming>& timings) {
  const auto fastest = std::min_element(timings.begin(), timings.end(),
                                        [](const auto& a, const auto& b) { return a.seconds < b.seconds; });
  if (fastest == timings.end() || !std::isfinite(fastest->seconds)) return std::nullopt;
  return fastest->kernel;
}

std::optional<AttentionKernelChoice> choose_attention_kernel_for(const std::optional<models::AttentionKernel>& named,
                                                                 const std::optional<models::AttentionCall>& call,
                                                                 at::ScalarType dtype, at::Device device,
                                                                 const comm::ProcessGroupPtr& world) {
  AttentionKernelChoice choice;
  if (call) choice.call = *call;
  if (named) {
    choice.kernel = *named;
    if (call) {
      const auto options = at::TensorOptions().dtype(dtype).device(device);
      // Requiring gradients, as in training: libtorch's rules for a kernel depend on it.
      const at::Tensor q =
          at::empty({call->batch, call->heads, call->tokens, call->head_dim}, options).requires_grad_(true);
      const at::Tensor kv =
          at::empty({call->batch, call->kv_heads, call->tokens, call->head_dim}, options).requires_grad_(true);
      at::Tensor allowed;
      if (call->masked) allowed = at::ones({call->batch, 1, call->tokens, call->tokens}, options.dtype(at::kBool));
      choice.taken = models::attention_kernel_takes(*named, q, kv, kv, /*causal=*/!call->masked, allowed);
    }
    models::prefer_attention_kernel(*named);
    return choice;
  }
  if (!call) return std::nullopt;
  std::vector<models::AttentionKernelTiming> mine;
  comm::on_every_rank(world, "timing CUDA's attention kernels (train.attention_kernel = auto)",
                      [&] { mine = models::time_attention_kernels(*call, dtype, device); });
  choice.timings = rank0_attention_timings(mine, world);
  choice.measured = true;
  const std::optional<models::AttentionKernel> fastest = fastest_attention_kernel(choice.timings);
  // None taken, or none right: libtorch's own order (the choice says what was measured).
  choice.kernel_preferred = fastest.has_value();
  if (fastest) {
    choice.kernel = *fastest;
    models::prefer_attention_kernel(choice.kernel);
  }
  return choice;
}

}  // namespace fsdp::train
