// fsdp/models/linear_cross_entropy.h: a language model's head and its cross-entropy in one op, a
// chunk of tokens at a time, so the [tokens x vocab] logits are never whole (Llama 3 1B at
// 4 x 2048 tokens: 4.2 GB of fp32 logits, as much again for their gradient).
//
//   loss = sum over rows i with targets[i] != -100 of  logsumexp(z_i) - z_i[targets[i]],
//   z = (hidden @ weight^T) in hidden's dtype, then fp32   (as linear + .to(float) + cross_entropy)
//
// Forward computes each chunk's logits once: their log-sum-exp, and, when autograd will want them,
// their gradient and from it d hidden and d weight (no head GEMM in backward; Liger-Kernel's and
// cut-cross-entropy's fused linear cross-entropy). On the host every chunk of a call uses one fp32
// buffer [chunk_rows, vocab]: the logits, their softmax in place, then their gradient in place; peak
// extra memory chunk_rows x vocab x fp32 bytes, plus, for bf16, a chunk's bf16 product or gradient
// beside it (chunk_rows x vocab x 2). On a GPU with fsdp.cpp's kernels the buffer is in the compute
// dtype alone (fused_ops.h: cross_entropy_rows). The composed head holds tokens x vocab x
// (compute + 3 x fp32) from forward to backward. From forward to backward the op keeps the two gradients (d hidden
// [n, dim] in hidden's dtype; d weight [vocab, dim] in fp32, or the weight's dtype when wider),
// and no input; for a bf16 weight under native bf16 GEMMs, each chunk's [vocab, dim] bf16 product
// lives until it is added.
#pragma once

#include <ATen/ATen.h>

namespace fsdp::models {

// How the head and loss run in chunks: `rows` tokens at a time, and `gradient`, the factor the
// caller's backward will bring to the summed loss (the trainer's N / counted targets, times float16's
// loss scale). Forward computes the gradients already multiplied by it, before they are rounded to
// the compute dtype (float16's scaled gradients stay clear of underflow, as a recomputing backward
// kept them); backward corrects by (its actual factor / gradient), which is 1 exactly when the
// caller said it right, and stays right when it did not (a gradient of 0, inf or NaN is computed
// for 1 and left to the correction). From a row count alone: gradient 1.
struct ChunkedLoss {
  ChunkedLoss(int64_t rows, double gradient = 1.0) : rows(rows), gradient(gradient) {}  // NOLINT: implicit on purpose
  int64_t rows;                                                                         // > 0
  double gradient;                                                                      // finite, not 0
};

// hidden [n, dim] (fp32 or bf16, on weight's device), weight [vocab, dim] (hidden's dtype), targets
// [n] int64 (-100: not counted). Returns the summed loss, an fp32 scalar; gradients flow to hidden
// and weight (fp32-accumulated over chunks, then in their dtype). One backward per forward.
at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                    const ChunkedLoss& chunks);

}  // namespace fsdp::models
