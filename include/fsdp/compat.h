// fsdp/compat.h: the one place that knows libtorch versions apart (Debian's 1.13 CPU build here,
// CUDA builds of 2.x on GPU machines). Nowhere else checks TORCH_VERSION_*.
#pragma once

#include <torch/version.h>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <cmath>
#include <limits>

namespace fsdp::compat {

// Raw mutable pointer of a storage: 1.13 has data_ptr(), 2.x renamed it mutable_data_ptr().
inline void* storage_data(c10::StorageImpl& storage) {
#if TORCH_VERSION_MAJOR >= 2
  return storage.mutable_data_ptr().get();
#else
  return storage.data_ptr().get();
#endif
}

// softmax(q k^T / sqrt(hd)) v for q, k, v [b, heads, t, hd], causal or not. 2.x has a fused kernel
// (flash or memory-efficient attention on CUDA); 1.13 has none, so it is composed here.
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               bool causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, causal);
#else
  auto scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (causal) {
    const int64_t t = q.size(-2), s = k.size(-2);
    auto future = at::ones({t, s}, q.options().dtype(at::kBool)).triu(s - t + 1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  }
  return at::matmul(at::softmax(scores, -1), v);
#endif
}

// AdamW over lists of tensors in one fused CUDA kernel (decoupled weight decay left to the caller;
// `steps` are read, not advanced: the caller sets them to the step being taken, 1 first):
// at::_fused_adamw_ exists from libtorch 2.1. Returns false,
// doing nothing, where it does not (kHasFusedAdamW says so beforehand).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
constexpr bool kHasFusedAdamW = true;
#else
constexpr bool kHasFusedAdamW = false;
#endif
inline bool fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                        at::TensorList steps, double lr, double beta1, double beta2, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2,
                    /*weight_decay=*/0.0, eps, /*amsgrad=*/false, /*maximize=*/false);
  return true;
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr, (void)beta1, (void)beta2, (void)eps;
  return false;
#endif
}

}  // namespace fsdp::compat
