// fsdp/compat.h: the one place that knows libtorch versions apart. Nowhere else checks TORCH_VERSION_*.
//
// Supported: libtorch 2.7 and newer, the first PyPI `torch` wheels built with the C++11 ABI (which
// Debian's C++ libraries, toml++ and GoogleTest, need). scripts/setup.sh pins the version CI builds
// against; scripts/test-oldest-torch.sh builds and tests the oldest. Debian's libtorch 1.13 was
// dropped on 2026-12-01 (docs/building.md): it lacked the fused attention and AdamW kernels
// below and kept PyTorch's own FSDP out of the comparisons. Between 2.7 and the pinned version no
// API fsdp.cpp uses differs; when one does, its two spellings go here, behind TORCH_VERSION_*.
#pragma once

#include <torch/version.h>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7),
              "fsdp.cpp needs libtorch >= 2.7 (scripts/setup.sh installs the pinned torch wheel into .venv/)");

namespace fsdp::compat {

// softmax(q k^T / sqrt(hd)) v for q, k, v [b, heads, t, hd], causal or not, or under `allowed` (bool,
// broadcastable to [b, heads, t, t]; true where a query may attend a key): the fused kernel (flash or
// memory-efficient attention on CUDA, a blocked one on the CPU, which takes a mask since 2.3).
// grouped_query (enable_gqa, from 2.5): k and v have fewer heads, [b, kv_heads, t, hd], each read by
// heads / kv_heads query heads in place.
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               bool causal, const at::Tensor& allowed = {},
                                               bool grouped_query = false) {
  return at::scaled_dot_product_attention(q, k, v,
                                          allowed.defined() ? std::optional<at::Tensor>(allowed) : std::nullopt,
                                          /*dropout_p=*/0.0, causal, /*scale=*/std::nullopt, grouped_query);
}

// Whether scaled_dot_product_attention runs grouped k and v [b, kv_heads, t, hd] (enable_gqa) in a
// fused kernel rather than its composed math, as libtorch itself chooses (0 is its math, -1 none).
// The CPU's flash kernel takes them from libtorch 2.8 on; 2.7 sends them to its math, which
// repeats k and v and keeps the [b, h, t, t] scores (a Llama block held 33% more than the plan,
// block_activation_tests under scripts/test-oldest-torch.sh). On CUDA flash and cuDNN take them
// (fp16 and bf16, no mask, sm80 and later), memory-efficient attention does not.
inline bool fused_kernel_takes_grouped_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                             const at::Tensor& allowed = {}) {
  return at::_fused_sdp_choice(q, k, v, allowed.defined() ? std::optional<at::Tensor>(allowed) : std::nullopt,
                               /*dropout_p=*/0.0, causal, /*scale=*/std::nullopt, /*enable_gqa=*/true) > 0;
}

// AdamW over lists of tensors in one fused kernel (libtorch's CUDA kernel, or its CPU one),
// decoupled weight decay inside it (param -= lr x weight_decay x param, before the update); `steps`
// are read, not advanced: the caller sets them to the step being taken, 1 first.
inline void fused_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                        double weight_decay, double eps, const at::Tensor& found_inf) {
  // found_inf ([1] float32, may be undefined): the kernel skips the whole update where it holds 1.
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay,
                    eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                    found_inf.defined() ? std::optional<at::Tensor>(found_inf) : std::nullopt);
}

// While alive, on this thread, every tensor made (factories included: torch::empty, the parameters
// of torch::nn::Linear) is a meta tensor: shape and dtype, no storage, no values drawn. The C++
// counterpart of Python's `with torch.device("meta")`, which libtorch's C++ API lacks. How: the
// thread's dispatch keys include Meta, which outranks CPU, and exclude BackendSelect, through which
// a factory would otherwise pick its kernel from its TensorOptions' device (CPU) alone. The thread's
// key sets are saved whole and put back whole: IncludeDispatchKeyGuard's restore subtracts key sets,
// which keeps backend bits, and left Meta's behind (every later op ran its meta kernel). Dispatcher
// internals: tests/dist/meta_construction_test.cpp checks both on the libtorch built against.
class MetaDeviceConstruction {
 public:
  MetaDeviceConstruction()
      : saved_(c10::impl::tls_local_dispatch_key_set()),
        enclosing_(own_keys()),
        meta_(saved_.included_ | c10::DispatchKeySet(c10::DispatchKey::Meta),
              saved_.excluded_ | c10::DispatchKeySet(c10::DispatchKey::BackendSelect)) {
    own_keys() = &saved_;
  }
  ~MetaDeviceConstruction() { own_keys() = enclosing_; }  // then meta_ puts the thread's keys back
  MetaDeviceConstruction(const MetaDeviceConstruction&) = delete;
  MetaDeviceConstruction& operator=(const MetaDeviceConstruction&) = delete;

  // The thread's key sets from before the innermost live guard; null outside one.
  static const c10::impl::LocalDispatchKeySet*& own_keys() {
    static thread_local const c10::impl::LocalDispatchKeySet* keys = nullptr;
    return keys;
  }

 private:
  c10::impl::LocalDispatchKeySet saved_;
  const c10::impl::LocalDispatchKeySet* enclosing_;
  c10::impl::ForceDispatchKeyGuard meta_;  // sets the keys above; puts the thread's own back when destroyed
};

// Inside a MetaDeviceConstruction, the thread's own key sets again while alive: what a host
// collective over MPI makes for itself (an agreement's flags) is then the CPU's. No effect outside.
class OutsideMetaDeviceConstruction {
 public:
  OutsideMetaDeviceConstruction() {
    if (const c10::impl::LocalDispatchKeySet* own = MetaDeviceConstruction::own_keys()) restore_.emplace(*own);
  }

 private:
  std::optional<c10::impl::ForceDispatchKeyGuard> restore_;
};

// Whether the CPU's fused attention takes grouped k and v in place (fused_kernel_takes_grouped_heads
// of CPU tensors: libtorch 2.8 on; 2.7 has them repeated): asked once, of small CPU tensors (made
// outside any meta construction), for the memory planner, which has no tensors to ask with.
inline bool cpu_fused_attention_takes_grouped_heads() {
  static const bool takes = [] {
    OutsideMetaDeviceConstruction outside;
    const at::Tensor q = at::zeros({1, 4, 8, 16}, at::kFloat), kv = at::zeros({1, 2, 8, 16}, at::kFloat);
    return fused_kernel_takes_grouped_heads(q, kv, kv, /*causal=*/true);
  }();
  return takes;
}

}  // namespace fsdp::compat
