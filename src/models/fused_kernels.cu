// CUDA kernels behind fsdp/models/fused_ops.h (launchers: fused_kernels.h). Memory bound:
// elementwise ones are one grid-stride loop each; the norms take one block per row (a block-wide
// sum for the row's statistics). fp32 arithmetic, one rounding on store.
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

// The sum of v over the block, returned to every thread. blockDim.x is a multiple of 32 (at most
// 1024). Safe to call repeatedly: the first barrier keeps a new call's writes behind the last
// call's reads.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// One block per row (striding over rows); thread k takes columns k, k + blockDim.x, ... in both
// passes, so it reads back only the sums it stored itself.
template <typename T>
__global__ void add_rms_norm_forward_kernel(const T* x, const T* delta, const T* weight, T* sum, T* normed, float* rstd,
                                            int64_t rows, int64_t dim, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * dim;
    float squares = 0.0f;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      store(sum, base + c, load(x, base + c) + load(delta, base + c));
      const float h = load(sum, base + c);  // as stored (rounded): the residual the norm sees
      squares += h * h;
    }
    const float r = rsqrtf(block_sum(squares) / static_cast<float>(dim) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      store(normed, base + c, load(sum, base + c) * r * load(weight, c));
    }
  }
}

template <typename T>
__global__ void add_rms_norm_backward_kernel(const T* grad_normed, const T* grad_sum, const T* sum, const T* weight,
                                             const float* rstd, T* grad_sum_out, float* weight_partials, int64_t rows,
                                             int64_t dim) {
  float* partial = weight_partials == nullptr ? nullptr : weight_partials + blockIdx.x * dim;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * dim;
    const float r = rstd[row];
    float dot = 0.0f;  // sum over the row of g hat
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      dot += load(grad_normed, base + c) * load(weight, c) * (load(sum, base + c) * r);
    }
    const float mean_dot = block_sum(dot) / static_cast<float>(dim);
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      const float dy = load(grad_normed, base + c), hat = load(sum, base + c) * r;
      float grad = r * (dy * load(weight, c) - hat * mean_dot);
      if (grad_sum != nullptr) grad += load(grad_sum, base + c);
      store(grad_sum_out, base + c, grad);
      if (partial != nullptr) partial[c] += dy * hat;  // column c is this thread's alone in this block
    }
  }
}

// A running (max, sum of exp(v - max)) pair, as online softmax keeps it: `add` takes one value,
// `merge` another pair. An empty pair is (-inf, 0); -inf values add nothing, NaN makes the sum NaN,
// and a value equal to the max (+inf included, where v - max would be NaN) adds exp(0) = 1.
struct MaxSum {
  float max = -INFINITY, sum = 0.0f;
  __device__ void add(float v) {
    if (v == -INFINITY) return;
    if (v > max) {
      sum = sum * expf(max - v) + 1.0f;  // expf(-inf) = 0 for the first value
      max = v;
    } else if (v == max) {
      sum += 1.0f;
    } else {
      sum += expf(v - max);  // NaN stays NaN
    }
  }
  __device__ void merge(float other_max, float other_sum) {
    if (other_max == -INFINITY) {
      sum += other_sum;  // 0, or NaN carried along
    } else if (other_max > max) {
      sum = sum * expf(max - other_max) + other_sum;
      max = other_max;
    } else if (other_max == max) {
      sum += other_sum;
    } else {
      sum += other_sum * expf(other_max - max);  // a NaN max makes the sum NaN
    }
  }
};

// The block's merged pair, returned to every thread (blockDim.x a multiple of 32, at most 1024).
__device__ MaxSum block_max_sum(MaxSum mine) {
  __shared__ float maxes[32], sums[32];
  __shared__ float total_max, total_sum;  // plain floats: a __shared__ variable takes no initializer
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(0xffffffffu, mine.max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, mine.sum, offset);
    mine.merge(other_max, other_sum);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // a previous row's readers of the totals are done
  if (lane == 0) {
    maxes[warp] = mine.max;
    sums[warp] = mine.sum;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum v;
    if (lane < warps) v = MaxSum{maxes[lane], sums[lane]};
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other_max = __shfl_xor_sync(0xffffffffu, v.max, offset);
      const float other_sum = __shfl_xor_sync(0xffffffffu, v.sum, offset);
      v.merge(other_max, other_sum);
    }
    if (lane == 0) {
      total_max = v.max;
      total_sum = v.sum;
    }
  }
  __syncthreads();
  return MaxSum{total_max, total_sum};
}

// One block per row (striding over rows): the row's (max, sum) in one read, its log-sum-exp, the
// loss, then the gradient in a second read and one write. 32-bit column indices: a row of a
// vocabulary is far below 2^31 elements.
template <typename T>
__global__ void cross_entropy_rows_kernel(T* z, const int64_t* targets, float* row_loss, int64_t rows, int vocab,
                                          float scale, bool gradient) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T* zr = z + row * static_cast<int64_t>(vocab);
    MaxSum mine;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) mine.add(load(zr, c));
    const MaxSum all = block_max_sum(mine);
    // As at::logsumexp answers: NaN anywhere gives NaN; else an infinite max gives itself.
    float lse = logf(all.sum) + all.max;
    if (isnan(all.sum)) {
      lse = NAN;
    } else if (isinf(all.max)) {
      lse = all.max;
    }
    const int64_t target = targets[row];
    const bool counted = target != -100;
    // Every thread reads the target's logit before any thread overwrites the row.
    const float picked = counted ? load(zr, target) : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) row_loss[row] = counted ? lse - picked : 0.0f;
    if (!gradient) continue;
    const float factor = counted ? scale : 0.0f;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
      float p = expf(load(zr, c) - lse);
      if (c == target) p -= 1.0f;
      store(zr, c, p * factor);
    }
  }
}

constexpr int kThreads = 256;
constexpr int kNormThreads = 256;          // per row: 8 columns per thread at dim 2048
constexpr int kRowThreads = 512;           // cross_entropy_rows: a row of 128,256 logits is 251 per thread
constexpr int kNormBackwardBlocks = 1024;  // the weight partials: [1024, dim] fp32 at most (8 MiB at dim 2048)

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

int rms_norm_backward_blocks(int64_t rows) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(rows, kNormBackwardBlocks)));
}

void add_rms_norm_forward(const void* x, const void* delta, const void* weight, void* sum, void* normed, float* rstd,
                          int64_t rows, int64_t dim, float eps, Dtype dtype, void* stream) {
  if (rows == 0 || dim == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 65536));
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    add_rms_norm_forward_kernel<T><<<blocks, kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(delta), static_cast<const T*>(weight), static_cast<T*>(sum),
        static_cast<T*>(normed), rstd, rows, dim, eps);
  });
  check_launch("add_rms_norm_forward");
}

void add_rms_norm_backward(const void* grad_normed, const void* grad_sum, const void* sum, const void* weight,
                           const float* rstd, void* grad_sum_out, float* weight_partials, int64_t rows, int64_t dim,
                           int blocks, Dtype dtype, void* stream) {
  if (rows == 0 || dim == 0) return;
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    add_rms_norm_backward_kernel<T><<<blocks, kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(grad_normed), static_cast<const T*>(grad_sum), static_cast<const T*>(sum),
        static_cast<const T*>(weight), rstd, static_cast<T*>(grad_sum_out), weight_partials, rows, dim);
  });
  check_launch("add_rms_norm_backward");
}

void cross_entropy_rows(void* z, const int64_t* targets, float* row_loss, int64_t rows, int64_t vocab, float scale,
                        bool gradient, Dtype dtype, void* stream) {
  if (rows == 0) return;
  if (vocab <= 0 || vocab > (int64_t{1} << 30)) {
    throw std::invalid_argument("cross_entropy_rows: a vocabulary of " + std::to_string(vocab) +
                                " is outside (0, 2^30]");
  }
  const int blocks = static_cast<int>(std::min<int64_t>(rows, 65536));
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    cross_entropy_rows_kernel<T><<<blocks, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<T*>(z), targets, row_loss, rows, static_cast<int>(vocab), scale, gradient);
  });
  check_launch("cross_entropy_rows");
}

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
