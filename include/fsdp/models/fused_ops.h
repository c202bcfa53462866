// fsdp/models/fused_ops.h: the elementwise and normalisation steps of a Llama block as fused
// operations, each with its composed libtorch reference (what the models computed before, and
// what the tests compare against).
//
// On a CUDA tensor each is one kernel forward and one backward, keeping only its inputs for
// backward: RMSNorm is libtorch's own (at::rms_norm, whose CUDA kernels are fused in the
// libtorch versions that have them, 2.11 among them);
// SwiGLU, rotary and the residual add + RMSNorm are fsdp.cpp's (src/models/fused_kernels.cu),
// compiled where the build has a CUDA compiler (FSDP_CUDA=ON); fused_kernels_compiled() says
// whether they were (without them, or for a dtype they do not take, CUDA tensors compute the
// composed reference). On the CPU the forward computes exactly the reference's operations (same
// values, bit for bit); the backward is the closed form the CUDA kernels compute, in fp32 (fp64
// for fp64), so SwiGLU keeps its two inputs and not silu(gate) as well; rotary keeps only its
// tables (as the composed one does); the norms keep their input and one fp32 1/rms per row, not
// the reference's fp32 copy of the input and its normalised output.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::models {

// x [..., dim] any floating dtype, weight [dim] -> x / sqrt(mean(x^2) + eps) * weight, in x's
// dtype; the statistics in fp32.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps);

// The residual add and the norm after it (a Llama block's post-attention norm) in one pass:
// x, delta [..., dim] one dtype, weight [dim] -> {h = x + delta, rms_norm(h, weight, eps)}, both
// in x's dtype. The sum h is the block's residual stream (its caller adds the MLP's output to it).
struct AddRmsNorm {
  at::Tensor sum;     // h = x + delta
  at::Tensor normed;  // rms_norm(h, weight, eps)
};
AddRmsNorm add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
AddRmsNorm add_rms_norm_reference(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);

// gate, up: same shape and dtype -> silu(gate) * up (Llama's MLP; silu(g) = g * sigmoid(g)).
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up);
// The same of one stacked product's halves (stacked_linear of gate_proj and up_proj): gate_up
// [..., 2 cols], gate the first cols, up the rest -> [..., cols]. Backward writes both halves'
// gradients into one [..., 2 cols] tensor, which the stacked product's backward takes as it is
// (swiglu of two narrow views would have autograd concatenate their gradients: a copy).
at::Tensor swiglu_stacked(const at::Tensor& gate_up);

// Rotary position embedding in Hugging Face's rotate-half layout, on the projection's own layout:
// x [b, t, heads, head_dim] (q_proj(x).view(b, t, heads, head_dim), or the q part of a stacked q, k,
// v product: read in place where each token's heads are contiguous), cos and sin
// [t, head_dim] fp32 (rotary_tables) -> [b, t, heads, head_dim], pairs (c, c + head_dim/2) of
// each position's row rotated by its angles.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rotary_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The chunked head's row step (linear_cross_entropy.h) in one CUDA kernel: logits [rows, vocab]
// (a contiguous CUDA tensor in the compute dtype, from the head's GEMM), targets [rows] int64
// (contiguous; -100: not counted) -> row_loss [rows] fp32 = logsumexp(row) - row[target] (0 where
// not counted), and, with `gradient`, the logits replaced in place by (softmax - onehot(target)) x
// scale (0 where not counted). Two reads of the logits and one write, where the host composes about
// eight passes over an fp32 copy. cross_entropy_rows_take says whether logits like `like` (same
// device and dtype) take it: a CUDA tensor of this build's kernels, fused ops on.
bool cross_entropy_rows_take(const at::Tensor& like);
void cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& row_loss, double scale,
                        bool gradient);

// Process-wide switch (default on; fsdp-train sets it from train.fused_ops): off, every operation
// here computes its reference, for comparisons. Set it before building a model.
void set_fused_ops(bool enabled);
bool fused_ops_enabled();

// Whether this build holds fsdp.cpp's CUDA kernels (SwiGLU, rotary, add + RMSNorm, the head's cross-entropy
// rows); without them CUDA tensors take the reference path.
bool fused_kernels_compiled();

}  // namespace fsdp::models
