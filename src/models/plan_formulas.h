// Private to models/: the planner's activation formulas that several families share (the terms
// of a stack of identical blocks under a head: GPT, Llama, ViT), each family giving its own block.
#pragma once

#include <algorithm>
#include <cstdint>

#include "fsdp/models/plan_terms.h"

namespace fsdp::models {

// The parameters of one block of a stack: the config's count less that of one block fewer.
template <class StackConfig>
int64_t one_block_params(const StackConfig& config) {
  if (config.layers <= 0) return 0;
  StackConfig fewer = config;
  fewer.layers = config.layers - 1;
  return config.parameter_count() - fewer.parameter_count();
}

// Composed attention keeps the probabilities [heads, t, t]; a fused kernel its log-sum-exp [heads, t] fp32.
inline int64_t attention_softmax_bytes(int64_t heads, int64_t t, int64_t c, bool fused_attention) {
  return fused_attention ? 4 * heads * t : c * heads * t * t;
}

// What attention keeps for one sample of t tokens, q = heads x head_dim and kv = kv_heads x
// head_dim wide (kv = q without grouped heads): a fused kernel q, k, v (grouped k and v read in
// place, not repeated to every query head: models/attention.h; a GPT's q, k, v as the views of qkv
// they are), its output (written [t, heads, head_dim] and returned transposed, so the output
// projection reads it as it is) and its log-sum-exp; in fp32 for a lower-precision compute dtype
// (FusedFp32: the fp32 copies, and the output cast back for the projection; the compute-dtype q,
// k and v are then kept by nothing). Composed attention keeps contiguous q, k and v (repeated, q
// wide each), the output's contiguous copy, and the probabilities. Measured against the blocks'
// forwards in tests/unit/block_activation_tests.cpp. Where the kernel gets k and v repeated
// (grouped_kv_repeated) they are q wide. (On CUDA, a mask or fp32 selects the memory-efficient
// kernel, which takes no groups: k and v are repeated there too; such runs keep 2 (q - kv) more
// a token than this counts.)
inline int64_t attention_activation_bytes(int64_t heads, int64_t q, int64_t kv, int64_t t,
                                          const ActivationSettings& s) {
  const int64_t c = s.compute_bytes, softmax = attention_softmax_bytes(heads, t, c, s.fused_attention);
  if (!s.fused_attention) return c * t * 4 * q + softmax;
  const int64_t k_and_v = 2 * (s.grouped_kv_repeated ? q : kv);
  if (s.attention_fp32 && c < 4) return 4 * t * (2 * q + k_and_v) + c * t * q + softmax;
  return c * t * (2 * q + k_and_v) + softmax;
}

// A GPT or ViT block for one sample of t tokens: two LayerNorm inputs and outputs (4 d), the MLP's
// hidden before and after GELU (2 ffn), and the attention (attention_activation_bytes, q = kv = d:
// 4 d fused or composed). (At 11 d for the block, gpt-fortunes-tiny's plan stood 26 MiB above the
// live bytes its step adds, 2026-12-06.)
inline int64_t layer_norm_block_activation_bytes(int64_t dim, int64_t heads, int64_t ffn, int64_t t,
                                                 const ActivationSettings& s) {
  return s.compute_bytes * t * (4 * dim + 2 * ffn) + attention_activation_bytes(heads, dim, dim, t, s);
}

// A language model's head for `t` tokens: the final norm (2 d), the logits in the compute dtype,
// their fp32 copy when that is bf16, log-softmax's output and the logits' gradient (fp32): the
// loss is computed in fp32. Chunked: the norm's input and d hidden, which the op computes in
// forward and keeps for backward (2 d); the op's one fp32 chunk buffer (logits, then their
// gradient, in place) and, in bf16, the chunk's bf16 product or gradient beside it
// (models/linear_cross_entropy.h); a GPU's row kernel keeps the chunk in the compute dtype alone.
inline int64_t language_head_activation_bytes(int64_t dim, int64_t vocab, int64_t t, const ActivationSettings& s) {
  const int64_t c = s.compute_bytes;
  const int64_t logits_per_token = c * vocab + (c == 4 ? 0 : 4 * vocab) + 8 * vocab;
  if (s.loss_chunk_tokens <= 0) return t * (2 * c * dim + logits_per_token);
  const int64_t chunk_per_logit = s.loss_rows_in_compute_dtype ? c : 4 + (c == 4 ? 0 : c);
  return t * 2 * c * dim + std::min(t, s.loss_chunk_tokens) * chunk_per_logit * vocab;
}

// A stack of `layers` blocks of `width` over `tokens` tokens a sample, each keeping `per_block`
// bytes a sample, under a head keeping `head` bytes a micro-batch. Backward of the last block
// holds its activations' gradients beside everything saved: one block more (with checkpointing,
// the block being recomputed and its gradients). A recomputed block keeps only its input; every
// k-th block is (layers / k of them). `per_block` counts the attention's fp32 copies (FusedFp32) itself.
inline int64_t block_stack_activation_bytes(int64_t layers, int64_t width, int64_t tokens, int64_t per_block,
                                            int64_t head, const ActivationSettings& s) {
  const int64_t c = s.compute_bytes;
  const int64_t block_inputs = c * tokens * width;
  const int64_t recomputed = s.checkpointing ? layers / s.checkpointing_every : 0;
  // The recomputed block plus its gradients (+2) is the peak only when backward meets a recomputed
  // block first (the last, when layers % k == 0); else the last block and its gradients (+1).
  const bool last_recomputed = recomputed > 0 && layers % s.checkpointing_every == 0;
  const int64_t blocks =
      recomputed * block_inputs + (layers - recomputed) * per_block + (last_recomputed ? 2 : 1) * per_block;
  return s.micro_batch * blocks + head;
}

}  // namespace fsdp::models
