// Private to models/: the planner's terms of a CLIP tower, which CLIP and LLaVA (a CLIP image
// tower read by a Llama) share.
#pragma once

#include <cstdint>

#include "fsdp/models/clip.h"
#include "fsdp/models/plan_terms.h"
#include "plan_formulas.h"

namespace fsdp::models {

// One block of a tower: attention's four projections with biases, two LayerNorms, the MLP.
inline int64_t clip_block_params(const ClipTowerShape& s) {
  return 4 * (s.dim * s.dim + s.dim) + 4 * s.dim + 2 * s.dim * s.mlp_hidden + s.mlp_hidden + s.dim;
}

// The embeddings units: the text tower's (tokens and positions) and the image tower's (class
// token, patch projection without bias, positions).
inline int64_t clip_text_embedding_params(const ClipConfig& m) { return (m.vocab + m.context) * m.text.dim; }
inline int64_t clip_vision_embedding_params(const ClipConfig& m) {
  return m.vision.dim * (1 + m.channels * m.patch * m.patch + m.image_tokens());
}

// One block's saved activations for one sample of t tokens: what a GPT or ViT block keeps (two
// LayerNorm inputs and outputs, q, k, v and their contiguous copies, the attention output, the
// MLP's hidden before and after its activation; quick_gelu's sigmoid and product add one more
// hidden), plus the softmax's statistics or probabilities.
inline int64_t clip_block_activation_bytes(const ClipTowerShape& s, int64_t t, const ActivationSettings& a) {
  const int64_t c = a.compute_bytes;
  const int64_t fp32_attention = a.attention_fp32 && c < 4 ? 4 * 4 * t * s.dim : 0;
  return c * t * (11 * s.dim + 3 * s.mlp_hidden) + attention_softmax_bytes(s.heads, t, c, a.fused_attention) +
         fp32_attention;
}

}  // namespace fsdp::models
