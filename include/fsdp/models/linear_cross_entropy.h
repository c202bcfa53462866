// fsdp/models/linear_cross_entropy.h: a language model's head and its cross-entropy in one op, a
// chunk of tokens at a time, so the [tokens x vocab] logits are never whole (Llama 3 1B at
// 4 x 2048 tokens: 4.2 GB of fp32 logits, as much again for their gradient).
//
//   loss = sum over rows i with targets[i] != -100 of  logsumexp(z_i) - z_i[targets[i]],
//   z = (hidden @ weight^T) in hidden's dtype, then fp32   (as linear + .to(float) + cross_entropy)
//
// Forward keeps hidden, weight, targets and the fp32 logsumexp per row [n]; backward recomputes each
// chunk's logits. Every chunk of a call uses one fp32 buffer [chunk_rows, vocab]: the logits, their
// log-sum-exp computed in place, then in backward the logits' gradient in place. Peak extra memory:
// chunk_rows x vocab x fp32 bytes, plus, for bf16, a chunk's bf16 product or gradient beside it
// (chunk_rows x vocab x 2), where the composed head holds tokens x vocab x (compute + 3 x fp32)
// from forward to backward. Backward
// also holds the weight's gradient [vocab, dim] in fp32 while it sums the chunks, and, for a bf16
// weight under native bf16 GEMMs, each chunk's [vocab, dim] bf16 product until it is added.
#pragma once

#include <ATen/ATen.h>

namespace fsdp::models {

// hidden [n, dim] (fp32 or bf16, on weight's device), weight [vocab, dim] (hidden's dtype), targets
// [n] int64 (-100: not counted). Returns the summed loss, an fp32 scalar; gradients flow to hidden
// and weight (fp32-accumulated over chunks, then in their dtype). chunk_rows > 0.
at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                    int64_t chunk_rows);

}  // namespace fsdp::models
