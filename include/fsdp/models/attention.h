// fsdp/models/attention.h: softmax(q k^T / sqrt(hd)) v, by one of three paths, chosen per compute
// dtype for the whole process (models call attention(); the trainer chooses, train.attention):
//
//   Fused      libtorch's scaled_dot_product_attention in the inputs' dtype (flash or
//              memory-efficient kernels on a GPU, a blocked kernel on the CPU): keeps q, k, v, the
//              output and one log-sum-exp per query
//   FusedFp32  the same kernel in fp32 for lower-precision inputs, cast back: on the CPU, libtorch
//              2.11's bf16 flash backward is far slower than its fp32 one on short sequences (ViT's
//              17 tokens: 104.7 ms against 6.1 ms per step, 2026-12-02); keeps fp32 q, k, v, output
//   Math       matmul, softmax in fp32, matmul, in the inputs' dtype (autograd's composition):
//              keeps the probabilities [b, heads, t, t] as well
//
// Every path computes the same function; they differ in rounding (fp32 paths less) and speed.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "fsdp/enum_names.h"

namespace fsdp::models {

enum class AttentionPath { Fused, FusedFp32, Math };
}  // namespace fsdp::models

namespace fsdp {
template <>
struct EnumNames<models::AttentionPath> {  // train.attention's values
  static constexpr std::pair<models::AttentionPath, const char*> values[] = {
      {models::AttentionPath::Fused, "fused"},
      {models::AttentionPath::FusedFp32, "fused_fp32"},
      {models::AttentionPath::Math, "math"},
  };
};
}  // namespace fsdp

namespace fsdp::models {

// q [b, heads, t, hd], k and v [b, kv_heads, t, hd] (heads a multiple of kv_heads) ->
// [b, heads, t, hd], in q's dtype. causal: position i attends to positions <= i. Each group of
// heads/kv_heads query heads shares one key/value head (grouped-query attention): the fused
// kernels that take grouped heads read the kv_heads heads in place (enable_gqa; the CPU's from
// libtorch 2.8 on, CUDA's flash and cuDNN), so nothing kv_heads -> heads is copied or kept for
// backward; the composed path, libtorch 2.7's CPU kernel and CUDA's memory-efficient kernel (with
// a mask, or in fp32) get them repeated to every query head
// (compat::fused_kernel_takes_grouped_heads asks libtorch which it takes).
// allowed (instead of causal, which must then be false): bool [b, 1, t, t], true where query i may
// attend key j; every query must be allowed at least one key (document_causal_mask allows itself).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     const at::Tensor& allowed = {});

// Packed rows (several examples or documents back to back in one row of t tokens):
// positions [b, t] int64, each token's position in its own example, 0 where an example starts ->
// bool [b, 1, t, t], true where key j <= query i and both are in the same example (block-diagonal
// causal attention: an example never sees its neighbours). A row's padding tail, positions
// restarting at 0 too, is an example of its own.
at::Tensor document_causal_mask(const at::Tensor& positions);

// Sliding-window causal attention (Mistral): bool [1, 1, t, t] on `device`, true where key j may be
// seen from query i: i - window < j <= i (the `window` latest positions, i itself included, as
// transformers' sliding_window_overlay). And-ed with document_causal_mask for packed rows.
at::Tensor sliding_window_mask(int64_t t, int64_t window, const at::Device& device);

// The path attention() takes for inputs of `dtype` (default Fused for every dtype). Set before
// training; not thread-safe against concurrent attention() calls.
void set_attention_path(at::ScalarType dtype, AttentionPath path);
AttentionPath attention_path(at::ScalarType dtype);

// Forward and backward of attention() on random inputs of this shape and dtype on `device`, for
// each path, in seconds (median of `repeats` after one warm-up): what train.attention = "auto"
// chooses from.
struct AttentionTiming {
  AttentionPath path;
  double seconds;
};
std::vector<AttentionTiming> time_attention_paths(int64_t batch, int64_t heads, int64_t kv_heads, int64_t t,
                                                  int64_t head_dim, bool causal, at::ScalarType dtype,
                                                  at::Device device, int repeats = 5);

}  // namespace fsdp::models
