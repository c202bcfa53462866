// CUDA kernels behind fsdp/models/fused_ops.h (launchers: fused_kernels.h). Elementwise, memory
// bound: one grid-stride loop each, fp32 arithmetic, one rounding on store.
#include "fused_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace fsdp::models::kernels {
namespace {

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

// sigmoid as PyTorch's CUDA silu computes it: 1 / (1 + exp(-x)), in fp32.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = load(gate, i);
    store(out, i, g * sigmoid(g) * load(up, i));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* grad_out, const T* gate, const T* up, T* grad_gate, T* grad_up,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float dy = load(grad_out, i), g = load(gate, i), u = load(up, i);
    const float s = sigmoid(g);
    store(grad_gate, i, dy * u * s * (1.0f + g * (1.0f - s)));
    store(grad_up, i, dy * g * s);
  }
}

// One thread per pair (c, c + h) of one row; rows are [outer, t, inner] in that order.
template <typename T>
__global__ void rotary_kernel(const T* x, const float* cos, const float* sin, T* out, int64_t pairs, int64_t t,
                              int64_t inner, int64_t half, bool inverse) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = p / half, c = p % half;
    const int64_t position = (row / inner) % t;
    const int64_t a = row * 2 * half + c, b = a + half;
    const int64_t table_a = position * 2 * half + c, table_b = table_a + half;
    const float xa = load(x, a), xb = load(x, b);
    if (!inverse) {
      store(out, a, xa * cos[table_a] - xb * sin[table_a]);
      store(out, b, xb * cos[table_b] + xa * sin[table_b]);
    } else {
      store(out, a, xa * cos[table_a] + xb * sin[table_b]);
      store(out, b, xb * cos[table_b] - xa * sin[table_a]);
    }
  }
}

constexpr int kThreads = 256;

int blocks_for(int64_t work) {
  // Enough blocks to fill any current GPU several times over; the grid-stride loops take the rest.
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, 65536)));
}

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("fused kernel ") + kernel + ": launch failed: " + cudaGetErrorString(status));
  }
}

template <typename Launch>
void by_dtype(Dtype dtype, Launch&& launch) {
  switch (dtype) {
    case Dtype::Float32: launch(static_cast<float*>(nullptr)); break;
    case Dtype::BFloat16: launch(static_cast<__nv_bfloat16*>(nullptr)); break;
    case Dtype::Float16: launch(static_cast<__half*>(nullptr)); break;
  }
}

}  // namespace

void swiglu_forward(const void* gate, const void* up, void* out, int64_t n, Dtype dtype, void* stream) {
  if (n == 0) return;
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    swiglu_forward_kernel<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(const void* grad_out, const void* gate, const void* up, void* grad_gate, void* grad_up, int64_t n,
                     Dtype dtype, void* stream) {
  if (n == 0) return;
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    swiglu_backward_kernel<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(grad_out), static_cast<const T*>(gate), static_cast<const T*>(up),
        static_cast<T*>(grad_gate), static_cast<T*>(grad_up), n);
  });
  check_launch("swiglu_backward");
}

void rotary(const void* x, const float* cos, const float* sin, void* out, int64_t outer, int64_t t, int64_t inner,
            int64_t head_dim, bool inverse, Dtype dtype, void* stream) {
  const int64_t half = head_dim / 2, pairs = outer * t * inner * half;
  if (pairs == 0) return;
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    rotary_kernel<T><<<blocks_for(pairs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), cos, sin, static_cast<T*>(out), pairs, t, inner, half, inverse);
  });
  check_launch(inverse ? "rotary (backward)" : "rotary");
}

}  // namespace fsdp::models::kernels
