// src/models/fused_kernels.h (private): launchers of fsdp.cpp's CUDA kernels (fused_kernels.cu),
// on raw device pointers, so that nvcc never compiles libtorch's headers. Every tensor is
// contiguous and on the current device; `stream` is a cudaStream_t. Arithmetic in fp32 whatever
// the storage dtype, rounded once on store. Each throws std::runtime_error on a launch failure.
#pragma once

#include <cstdint>

namespace fsdp::models::kernels {

enum class Dtype { Float32, BFloat16, Float16 };

// out = silu(gate) * up over rows of cols elements: out [rows, cols] contiguous; gate and up rows
// `stride` elements apart (cols where contiguous; 2 cols for the halves of one stacked [rows,
// 2 cols] product, up = gate + cols). A contiguous tensor of n elements is one row: (1, n, n).
void swiglu_forward(const void* gate, const void* up, void* out, int64_t rows, int64_t cols, int64_t stride,
                    Dtype dtype, void* stream);
// grad_gate = dy * up * s * (1 + gate * (1 - s)), grad_up = dy * gate * s, s = sigmoid(gate):
// grad_out [rows, cols] contiguous; gate, up, grad_gate and grad_up rows `stride` apart.
void swiglu_backward(const void* grad_out, const void* gate, const void* up, void* grad_gate, void* grad_up,
                     int64_t rows, int64_t cols, int64_t stride, Dtype dtype, void* stream);

// x [outer, t, inner, head_dim] -> out, same shape: for c < head_dim/2 and position p,
//   out[c]        = x[c] cos[p][c] - x[c + h] sin[p][c]
//   out[c + h]    = x[c + h] cos[p][c + h] + x[c] sin[p][c + h]        (h = head_dim / 2)
// inverse: the transpose of that map (the backward):
//   out[c]        = x[c] cos[p][c] + x[c + h] sin[p][c + h]
//   out[c + h]    = x[c + h] cos[p][c + h] - x[c] sin[p][c]
// cos, sin: [t, head_dim] fp32. out contiguous; x's heads contiguous, each token's row of them
// x_token_stride elements after the one before (inner * head_dim where x is contiguous). out may
// not alias x.
void rotary(const void* x, const float* cos, const float* sin, void* out, int64_t outer, int64_t t, int64_t inner,
            int64_t head_dim, int64_t x_token_stride, bool inverse, Dtype dtype, void* stream);

// The residual add and RMSNorm after it, one block per row of [rows, dim] (x, delta, weight, sum,
// normed in one dtype; rstd [rows] fp32):
//   sum = x + delta (rounded to the dtype: the norm sees the stored residual),
//   rstd = 1 / sqrt(mean(sum^2) + eps),  normed = sum rstd weight.
void add_rms_norm_forward(const void* x, const void* delta, const void* weight, void* sum, void* normed, float* rstd,
                          int64_t rows, int64_t dim, float eps, Dtype dtype, void* stream);
// Its backward, one block per row, `blocks` blocks striding over the rows: with hat = sum rstd and
// g = grad_normed weight,
//   grad_sum_out = rstd (g - hat mean(g hat)) + grad_sum   (grad_sum may be null: no gradient reached the sum);
//   weight_partials [blocks, dim] fp32, zeroed by the caller (or null: no weight gradient): row b
//   accumulates sum of grad_normed hat over block b's rows; the caller sums the rows.
void add_rms_norm_backward(const void* grad_normed, const void* grad_sum, const void* sum, const void* weight,
                           const float* rstd, void* grad_sum_out, float* weight_partials, int64_t rows, int64_t dim,
                           int blocks, Dtype dtype, void* stream);
// The number of blocks add_rms_norm_backward should take for `rows` rows (the weight partials' rows).
int rms_norm_backward_blocks(int64_t rows);

// The cross-entropy of rows of logits z [rows, vocab] (the head's product, in the dtype), one block
// per row, reading each row twice: targets [rows] int64 in [0, vocab), or -100 for a row not
// counted; row_loss [rows] fp32 gets logsumexp(z_row) - z_row[target] (0 for a row not counted).
// With `gradient`, z is then overwritten in place by the loss's gradient times `scale`:
// (exp(z - logsumexp) - onehot(target)) x scale on counted rows, 0 on the others, rounded once.
void cross_entropy_rows(void* z, const int64_t* targets, float* row_loss, int64_t rows, int64_t vocab, float scale,
                        bool gradient, Dtype dtype, void* stream);

}  // namespace fsdp::models::kernels
