// src/models/fused_kernels.h (private): launchers of fsdp.cpp's CUDA kernels (fused_kernels.cu),
// on raw device pointers, so that nvcc never compiles libtorch's headers. Every tensor is
// contiguous and on the current device; `stream` is a cudaStream_t. Arithmetic in fp32 whatever
// the storage dtype, rounded once on store. Each throws std::runtime_error on a launch failure.
#pragma once

#include <cstdint>

namespace fsdp::models::kernels {

enum class Dtype { Float32, BFloat16, Float16 };

// out = silu(gate) * up, n elements.
void swiglu_forward(const void* gate, const void* up, void* out, int64_t n, Dtype dtype, void* stream);
// grad_gate = dy * up * s * (1 + gate * (1 - s)), grad_up = dy * gate * s, s = sigmoid(gate).
void swiglu_backward(const void* grad_out, const void* gate, const void* up, void* grad_gate, void* grad_up, int64_t n,
                     Dtype dtype, void* stream);

// x [outer, t, inner, head_dim] -> out, same shape: for c < head_dim/2 and position p,
//   out[c]        = x[c] cos[p][c] - x[c + h] sin[p][c]
//   out[c + h]    = x[c + h] cos[p][c + h] + x[c] sin[p][c + h]        (h = head_dim / 2)
// inverse: the transpose of that map (the backward):
//   out[c]        = x[c] cos[p][c] + x[c + h] sin[p][c + h]
//   out[c + h]    = x[c + h] cos[p][c + h] - x[c] sin[p][c]
// cos, sin: [t, head_dim] fp32. out may not alias x.
void rotary(const void* x, const float* cos, const float* sin, void* out, int64_t outer, int64_t t, int64_t inner,
            int64_t head_dim, bool inverse, Dtype dtype, void* stream);

}  // namespace fsdp::models::kernels
