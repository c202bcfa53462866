// CUDA kernels behind fsdp/models/fused_ops.h (launchers: fused_kernels.h). Memory bound:
// elementwise ones are one grid-stride loop each; the norms and the loss rows take one block per
// row (a block-wide sum for the row's statistics). Where the pointers and sizes allow, 16 bytes a
// load or store (8 bf16, Pack below). fp32 arithmetic, one rounding on store.
#include "fused_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
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

// kWidth consecutive elements moved as one access: 16 bytes (8 bf16 or fp16, 4 fp32) where every
// pointer is 16-byte aligned, else one element (kWidth 1).
template <typename T, int kWidth>
struct alignas(sizeof(T) * kWidth) Pack {
  T v[kWidth];
};

// The elementwise kernels below take element i of n in packs of kWidth: thread j the packs j,
// j + stride, ...; then the n % kWidth elements past the last whole pack, one each.
template <typename T, int kWidth>
__device__ __forceinline__ void swiglu_forward_at(const T* gate, const T* up, T* out, int64_t i) {
  const Pack<T, kWidth> g = reinterpret_cast<const Pack<T, kWidth>*>(gate)[i];
  const Pack<T, kWidth> u = reinterpret_cast<const Pack<T, kWidth>*>(up)[i];
  Pack<T, kWidth> o;
#pragma unroll
  for (int k = 0; k < kWidth; ++k) {
    const float gk = load(g.v, k);
    store(o.v, k, gk * sigmoid(gk) * load(u.v, k));
  }
  reinterpret_cast<Pack<T, kWidth>*>(out)[i] = o;
}

// Rows of `cols` elements: row r of gate and up at r * stride (the two halves of one stacked
// [rows, 2 cols] product have stride 2 cols; a contiguous tensor is one row), of out at r * cols.
// Rows to blockIdx.y (striding by gridDim.y), columns to the grid-stride loop.
template <typename T, int kWidth>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* out, int64_t rows, int64_t cols, int64_t stride) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x, packs = cols / kWidth;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T *g = gate + row * stride, *u = up + row * stride;
    T* o = out + row * cols;
    for (int64_t i = first; i < packs; i += step) swiglu_forward_at<T, kWidth>(g, u, o, i);
    for (int64_t i = packs * kWidth + first; i < cols; i += step) swiglu_forward_at<T, 1>(g, u, o, i);
  }
}

template <typename T, int kWidth>
__device__ __forceinline__ void swiglu_backward_at(const T* grad_out, const T* gate, const T* up, T* grad_gate,
                                                   T* grad_up, int64_t i) {
  const Pack<T, kWidth> dy = reinterpret_cast<const Pack<T, kWidth>*>(grad_out)[i];
  const Pack<T, kWidth> g = reinterpret_cast<const Pack<T, kWidth>*>(gate)[i];
  const Pack<T, kWidth> u = reinterpret_cast<const Pack<T, kWidth>*>(up)[i];
  Pack<T, kWidth> dg, du;
#pragma unroll
  for (int k = 0; k < kWidth; ++k) {
    const float dyk = load(dy.v, k), gk = load(g.v, k), uk = load(u.v, k);
    const float s = sigmoid(gk);
    store(dg.v, k, dyk * uk * s * (1.0f + gk * (1.0f - s)));
    store(du.v, k, dyk * gk * s);
  }
  reinterpret_cast<Pack<T, kWidth>*>(grad_gate)[i] = dg;
  reinterpret_cast<Pack<T, kWidth>*>(grad_up)[i] = du;
}

// Rows as swiglu_forward_kernel's: grad_out's at r * cols, the others' at r * stride.
template <typename T, int kWidth>
__global__ void swiglu_backward_kernel(const T* grad_out, const T* gate, const T* up, T* grad_gate, T* grad_up,
                                       int64_t rows, int64_t cols, int64_t stride) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x, packs = cols / kWidth;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* dy = grad_out + row * cols;
    const T *g = gate + row * stride, *u = up + row * stride;
    T *dg = grad_gate + row * stride, *du = grad_up + row * stride;
    for (int64_t i = first; i < packs; i += step) swiglu_backward_at<T, kWidth>(dy, g, u, dg, du, i);
    for (int64_t i = packs * kWidth + first; i < cols; i += step) swiglu_backward_at<T, 1>(dy, g, u, dg, du, i);
  }
}

// A row of head_dim elements (rows are [outer, t, inner] in that order) to each blockDim.x lanes,
// blockDim.y rows to a block; lane l takes the pairs (c, c + h) for c = l, l + blockDim.x, ... < h.
// The row's position is found once per row, and in 32-bit arithmetic where every offset fits
// (Index uint32_t): 64-bit division and remainder are long instruction sequences on a GPU.
// x's rows of one token (its `inner` heads) are x_token_stride elements after the token before
// (inner * head_dim where x is contiguous; a stacked q, k, v product's row where x is its q part).
template <typename T, typename Index>
__global__ void rotary_kernel(const T* x, const float* cos, const float* sin, T* out, Index rows, Index t, Index inner,
                              Index half, Index x_token_stride, bool inverse) {
  const Index rows_per_step = static_cast<Index>(gridDim.x) * blockDim.y;
  for (Index row = static_cast<Index>(blockIdx.x) * blockDim.y + threadIdx.y; row < rows; row += rows_per_step) {
    const Index token = row / inner;
    const Index position = token % t;
    const T* xr = x + token * x_token_stride + (row - token * inner) * 2 * half;
    T* outr = out + row * 2 * half;
    const float* cos_row = cos + position * 2 * half;
    const float* sin_row = sin + position * 2 * half;
    for (Index c = threadIdx.x; c < half; c += blockDim.x) {
      const Index b = c + half;
      const float xa = load(xr, c), xb = load(xr, b);
      if (!inverse) {
        store(outr, c, xa * cos_row[c] - xb * sin_row[c]);
        store(outr, b, xb * cos_row[b] + xa * sin_row[b]);
      } else {
        store(outr, c, xa * cos_row[c] + xb * sin_row[b]);
        store(outr, b, xb * cos_row[b] - xa * sin_row[c]);
      }
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

// One block per row (striding over rows); the row in packs of kWidth (kWidth divides dim and every
// pointer is 16-byte aligned, the launcher's condition), thread k taking packs k, k + blockDim.x,
// ... in both passes, so it reads back only the sums it stored itself.
template <typename T, int kWidth>
__global__ void add_rms_norm_forward_kernel(const T* x, const T* delta, const T* weight, T* sum, T* normed, float* rstd,
                                            int64_t rows, int64_t dim, float eps) {
  using P = Pack<T, kWidth>;
  const int64_t packs = dim / kWidth;
  const P* weight_packs = reinterpret_cast<const P*>(weight);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * packs;  // in packs
    const P* x_packs = reinterpret_cast<const P*>(x) + base;
    const P* delta_packs = reinterpret_cast<const P*>(delta) + base;
    P* sum_packs = reinterpret_cast<P*>(sum) + base;
    P* normed_packs = reinterpret_cast<P*>(normed) + base;
    float squares = 0.0f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P a = x_packs[p], d = delta_packs[p];
      P h;
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        store(h.v, k, load(a.v, k) + load(d.v, k));
        const float hk = load(h.v, k);  // as stored (rounded): the residual the norm sees
        squares += hk * hk;
      }
      sum_packs[p] = h;
    }
    const float r = rsqrtf(block_sum(squares) / static_cast<float>(dim) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P h = sum_packs[p], w = weight_packs[p];
      P o;
#pragma unroll
      for (int k = 0; k < kWidth; ++k) store(o.v, k, load(h.v, k) * r * load(w.v, k));
      normed_packs[p] = o;
    }
  }
}

// kColumns > 0: dim <= kColumns blockDim.x, and thread k's columns k, k + blockDim.x, ... keep their
// weight partials in registers over the block's rows, stored once at the end; kColumns 0 (a wider
// row): they are added into weight_partials row by row.
template <typename T, int kColumns>
__global__ void add_rms_norm_backward_kernel(const T* grad_normed, const T* grad_sum, const T* sum, const T* weight,
                                             const float* rstd, T* grad_sum_out, float* weight_partials, int64_t rows,
                                             int64_t dim) {
  float* partial = weight_partials == nullptr ? nullptr : weight_partials + blockIdx.x * dim;
  float kept[kColumns > 0 ? kColumns : 1] = {};
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * dim;
    const float r = rstd[row];
    float dot = 0.0f;  // sum over the row of g hat
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      dot += load(grad_normed, base + c) * load(weight, c) * (load(sum, base + c) * r);
    }
    const float mean_dot = block_sum(dot) / static_cast<float>(dim);
    const auto column = [&](int64_t c) {  // returns grad_normed hat, this column's weight partial
      const float dy = load(grad_normed, base + c), hat = load(sum, base + c) * r;
      float grad = r * (dy * load(weight, c) - hat * mean_dot);
      if (grad_sum != nullptr) grad += load(grad_sum, base + c);
      store(grad_sum_out, base + c, grad);
      return dy * hat;
    };
    if constexpr (kColumns > 0) {
#pragma unroll
      for (int k = 0; k < kColumns; ++k) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (c < dim) kept[k] += column(c);
      }
    } else {
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
        const float product = column(c);
        if (partial != nullptr) partial[c] += product;  // column c is this thread's alone in this block
      }
    }
  }
  if constexpr (kColumns > 0) {
    if (partial == nullptr) return;
#pragma unroll
    for (int k = 0; k < kColumns; ++k) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (c < dim) partial[c] += kept[k];
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
// loss, then the gradient in a second read and one write. The row in packs of kWidth (kWidth divides
// vocab and z is 16-byte aligned, the launcher's condition: every row starts aligned). 32-bit
// column indices: a row of a vocabulary is far below 2^31 elements. Launched with 512 threads
// (kRowThreads): the bound keeps nvcc within 128 registers a thread, or the launch would fail.
template <typename T, int kWidth>
__global__ void __launch_bounds__(512) cross_entropy_rows_kernel(T* z, const int64_t* targets, float* row_loss,
                                                                 int64_t rows, int vocab, float scale, bool gradient) {
  const int packs = vocab / kWidth;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    Pack<T, kWidth>* zr = reinterpret_cast<Pack<T, kWidth>*>(z + row * static_cast<int64_t>(vocab));
    MaxSum mine;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const Pack<T, kWidth> v = zr[p];
#pragma unroll
      for (int k = 0; k < kWidth; ++k) mine.add(load(v.v, k));
    }
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
    const float picked = counted ? load(zr[target / kWidth].v, target % kWidth) : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) row_loss[row] = counted ? lse - picked : 0.0f;
    if (!gradient) continue;
    const float factor = counted ? scale : 0.0f;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      Pack<T, kWidth> v = zr[p];
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        float q = expf(load(v.v, k) - lse);
        if (p * kWidth + k == target) q -= 1.0f;
        store(v.v, k, q * factor);
      }
      zr[p] = v;
    }
  }
}

constexpr int kThreads = 256;
constexpr int kNormThreads = 256;  // per row: 8 columns per thread at dim 2048
constexpr int kRowThreads = 512;   // cross_entropy_rows: a row of 128,256 logits is 251 per thread
static_assert(kRowThreads == 512, "cross_entropy_rows_kernel's __launch_bounds__ is its launch's thread count");
constexpr int kNormBackwardBlocks = 1024;  // the weight partials: [1024, dim] fp32 at most (8 MiB at dim 2048)

int blocks_for(int64_t work) {
  // Enough blocks to fill any current GPU several times over; the grid-stride loops take the rest.
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, 65536)));
}

// Whether every pointer is 16-byte aligned: the packed kernels' condition.
bool aligned16(std::initializer_list<const void*> pointers) {
  return std::all_of(pointers.begin(), pointers.end(),
                     [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; });
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
    constexpr int kWidth = 16 / sizeof(T);
    const auto launch = [&](auto kernel) {
      kernel<<<blocks, kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(x), static_cast<const T*>(delta), static_cast<const T*>(weight), static_cast<T*>(sum),
          static_cast<T*>(normed), rstd, rows, dim, eps);
    };
    if (dim % kWidth == 0 && aligned16({x, delta, weight, sum, normed})) {
      launch(add_rms_norm_forward_kernel<T, kWidth>);
    } else {
      launch(add_rms_norm_forward_kernel<T, 1>);
    }
  });
  check_launch("add_rms_norm_forward");
}

void add_rms_norm_backward(const void* grad_normed, const void* grad_sum, const void* sum, const void* weight,
                           const float* rstd, void* grad_sum_out, float* weight_partials, int64_t rows, int64_t dim,
                           int blocks, Dtype dtype, void* stream) {
  if (rows == 0 || dim == 0) return;
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const auto launch = [&](auto kernel) {
      kernel<<<blocks, kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(grad_normed), static_cast<const T*>(grad_sum), static_cast<const T*>(sum),
          static_cast<const T*>(weight), rstd, static_cast<T*>(grad_sum_out), weight_partials, rows, dim);
    };
    // The weight partials in registers up to 32 columns a thread (dim 8192); 8 for dim <= 2048.
    if (dim <= 8 * kNormThreads) {
      launch(add_rms_norm_backward_kernel<T, 8>);
    } else if (dim <= 32 * kNormThreads) {
      launch(add_rms_norm_backward_kernel<T, 32>);
    } else {
      launch(add_rms_norm_backward_kernel<T, 0>);
    }
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
    constexpr int kWidth = 16 / sizeof(T);
    const auto launch = [&](auto kernel) {
      kernel<<<blocks, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<T*>(z), targets, row_loss, rows,
                                                                            static_cast<int>(vocab), scale, gradient);
    };
    if (vocab % kWidth == 0 && aligned16({z})) {
      launch(cross_entropy_rows_kernel<T, kWidth>);
    } else {
      launch(cross_entropy_rows_kernel<T, 1>);
    }
  });
  check_launch("cross_entropy_rows");
}

namespace {

// The elementwise kernels' grid over rows of cols: columns by blocks_for, rows to gridDim.y
// (at most 65535), about 65536 blocks in all.
dim3 row_grid(int64_t rows, int64_t column_work) {
  const int columns = blocks_for(column_work);
  const int64_t row_blocks = std::min<int64_t>({rows, 65535, std::max<int64_t>(1, 65536 / columns)});
  return dim3(columns, static_cast<unsigned>(std::max<int64_t>(1, row_blocks)));
}

// 16-byte packs fit when every pointer is aligned and so is every row's start (or there is one row).
template <typename T>
bool packs_fit(std::initializer_list<const void*> pointers, int64_t rows, int64_t cols, int64_t stride) {
  constexpr int64_t kWidth = 16 / sizeof(T);
  return aligned16(pointers) && (rows == 1 || (cols % kWidth == 0 && stride % kWidth == 0));
}

}  // namespace

void swiglu_forward(const void* gate, const void* up, void* out, int64_t rows, int64_t cols, int64_t stride,
                    Dtype dtype, void* stream) {
  if (rows == 0 || cols == 0) return;
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    constexpr int kWidth = 16 / sizeof(T);
    const auto launch = [&](auto kernel, int64_t column_work) {
      kernel<<<row_grid(rows, column_work), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), rows, cols, stride);
    };
    if (packs_fit<T>({gate, up, out}, rows, cols, stride)) {
      launch(swiglu_forward_kernel<T, kWidth>, (cols + kWidth - 1) / kWidth);
    } else {
      launch(swiglu_forward_kernel<T, 1>, cols);
    }
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(const void* grad_out, const void* gate, const void* up, void* grad_gate, void* grad_up,
                     int64_t rows, int64_t cols, int64_t stride, Dtype dtype, void* stream) {
  if (rows == 0 || cols == 0) return;
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    constexpr int kWidth = 16 / sizeof(T);
    const auto launch = [&](auto kernel, int64_t column_work) {
      kernel<<<row_grid(rows, column_work), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(grad_out), static_cast<const T*>(gate), static_cast<const T*>(up),
          static_cast<T*>(grad_gate), static_cast<T*>(grad_up), rows, cols, stride);
    };
    if (packs_fit<T>({grad_out, gate, up, grad_gate, grad_up}, rows, cols, stride)) {
      launch(swiglu_backward_kernel<T, kWidth>, (cols + kWidth - 1) / kWidth);
    } else {
      launch(swiglu_backward_kernel<T, 1>, cols);
    }
  });
  check_launch("swiglu_backward");
}

void rotary(const void* x, const float* cos, const float* sin, void* out, int64_t outer, int64_t t, int64_t inner,
            int64_t head_dim, int64_t x_token_stride, bool inverse, Dtype dtype, void* stream) {
  const int64_t half = head_dim / 2, rows = outer * t * inner;
  if (rows == 0 || half == 0) return;
  // Lanes per row: half rounded up to a power of two, at most a warp; 256 threads a block.
  int lanes = 1;
  while (lanes < half && lanes < 32) lanes *= 2;
  const dim3 threads(lanes, kThreads / lanes);
  const int64_t rows_per_block = kThreads / lanes;
  const int blocks =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((rows + rows_per_block - 1) / rows_per_block, 65536)));
  const bool offsets_fit_32_bits = rows * head_dim <= static_cast<int64_t>(UINT32_MAX) &&
                                   outer * t * x_token_stride <= static_cast<int64_t>(UINT32_MAX);
  by_dtype(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const auto launch = [&](auto index) {
      using Index = decltype(index);
      rotary_kernel<T, Index><<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(x), cos, sin, static_cast<T*>(out), static_cast<Index>(rows), static_cast<Index>(t),
          static_cast<Index>(inner), static_cast<Index>(half), static_cast<Index>(x_token_stride), inverse);
    };
    if (offsets_fit_32_bits) {
      launch(uint32_t{0});
    } else {
      launch(int64_t{0});
    }
  });
  check_launch(inverse ? "rotary (backward)" : "rotary");
}

}  // namespace fsdp::models::kernels
