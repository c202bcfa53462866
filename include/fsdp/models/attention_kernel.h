// fsdp/models/attention_kernel.h: which of CUDA's fused attention kernels libtorch's
// scaled_dot_product_attention (attention.h's Fused and FusedFp32 paths) tries first
// (train.attention_kernel).
//
//   Flash      FlashAttention-2: no mask (causal or none), fp16 and bf16, sm80 on
//   Cudnn      cuDNN's fused attention: fp16 and bf16, Hopper's own kernels where present
//   Efficient  memory-efficient attention: takes a mask (packed rows, a sliding window) and fp32
//
// libtorch's order starts as flash, efficient, math, cuDNN. At its first CUDA attention choice in
// the process libtorch settles it once: on sm90 and sm100 with a cuDNN above 9.15 (the cu13
// wheels' 9.19; torch 2.10 on) it writes cuDNN, flash, efficient, math over whatever order stood,
// unless TORCH_CUDNN_SDPA_DEPRIORITIZED=1. settle_attention_kernel_order(device) has that happen
// first, so a preference set afterwards stays, and "libtorch's order" here is the settled one.
// Preferring a kernel moves it to the front and leaves the rest in libtorch's order behind it, so
// inputs it does not take (a mask, for flash) go to the next fused kernel that does. The CPU's
// choice (its flash kernel, or math) ignores the order.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "fsdp/enum_names.h"

namespace fsdp::models {
enum class AttentionKernel { Flash, Cudnn, Efficient };
}  // namespace fsdp::models

namespace fsdp {
template <>
struct EnumNames<models::AttentionKernel> {  // train.attention_kernel's values
  static constexpr std::pair<models::AttentionKernel, const char*> values[] = {
      {models::AttentionKernel::Flash, "flash"},
      {models::AttentionKernel::Cudnn, "cudnn"},
      {models::AttentionKernel::Efficient, "efficient"},
  };
};
}  // namespace fsdp

namespace fsdp::models {

// One attention choice on tiny tensors of a CUDA `device` (nothing for another device; once per
// process), so that libtorch settles its order now (above), not over a later preference; the
// order it settles on becomes libtorch's order as restore_attention_kernel_order() restores it,
// and a preference set before it stays. Not thread-safe against the other functions here.
// Call it before preferring a kernel for a CUDA run (the trainer does; attention_kernel_takes and
// time_attention_kernels do for their inputs' device).
void settle_attention_kernel_order(at::Device device);

// Process-wide, for every later scaled_dot_product_attention call; not thread-safe against them.
void prefer_attention_kernel(AttentionKernel kernel);
// The kernel libtorch tries first, or nullopt where that is none of the three (its math: an
// order someone else set).
std::optional<AttentionKernel> preferred_attention_kernel();
// libtorch's order as first seen here, before any preference (flash, efficient, math, cuDNN in
// 2.7-2.11), or as libtorch settled it (cuDNN first on Hopper), restored.
void restore_attention_kernel_order();

// Whether libtorch, with `kernel` preferred, runs it for these inputs as attention() passes them
// (grouped k and v in place where the kernel takes them, else repeated): at::_fused_sdp_choice.
// allowed: as attention()'s (undefined: causal or none).
bool attention_kernel_takes(AttentionKernel kernel, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal, const at::Tensor& allowed = {});

// The shape of one attention call: q [batch, heads, tokens, head_dim], k and v [batch, kv_heads,
// tokens, head_dim], in `dtype` on `device`; causal, or under a mask of allowed keys (`masked`:
// two documents packed in each row, document_causal_mask's).
struct AttentionCall {
  int64_t batch = 1, heads = 1, kv_heads = 1, tokens = 1, head_dim = 1;
  bool masked = false;
};

// Seconds a forward and backward of attention() take on random inputs of that shape with each
// kernel preferred in turn, for the kernels libtorch takes for them (attention_kernel_takes; the
// others are left out): the median of `repeats` after a warm-up, the kernels alternating round by
// round so that all see the same load. What train.attention_kernel = "auto" chooses from on a GPU.
// Each kernel's output and query gradient are held against the composed attention in fp32 on one
// row of the call's length (its last 64 queries: the reference keeps their scores against every
// key): a kernel off by more than kAttentionKernelTolerance of the reference's largest magnitude (a
// wrong result, not rounding: bf16's is about 0.4% an operation), or one that throws (out of memory,
// no plan for the shape), is timed as +inf, never the fastest. The inputs come from a generator of
// their own (a resumed run's dropout draws as before). Restores the order it found, on an exception
// too.
struct AttentionKernelTiming {
  AttentionKernel kernel;
  double seconds;
  double relative_error = 0.0;  // max |result - reference| / max |reference|, output and query gradient
};
constexpr double kAttentionKernelTolerance = 0.05;
std::vector<AttentionKernelTiming> time_attention_kernels(const AttentionCall& call, at::ScalarType dtype,
                                                          at::Device device, int repeats = 5);

}  // namespace fsdp::models
