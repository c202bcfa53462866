// fsdp/nn/hooks.h: forward hooks and construction notices for libtorch modules.
//
// libtorch's nn::Module has no forward hooks (Python's has register_forward_pre_hook and
// friends). This header supplies the two things a wrapper such as FSDP needs, with no knowledge
// of sharding. The whole contract for model code:
//
//   1. Call every module that may be wrapped (a transformer block, say) through
//      fsdp::nn::call(block, args...) instead of block->forward(args...). Without hooks
//      registered it is exactly block->forward(args...).
//   2. Add repeated blocks to their container with fsdp::nn::push_block(list, block), after the
//      block initialised its own parameters in its constructor, and touch them no more in the
//      model's constructor. This lets a wrapper shard each block as soon as it is built, so a
//      model larger than one rank's memory can be constructed.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/container/modulelist.h>

#include <functional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fsdp/nn/checkpoint.h"

namespace fsdp::nn {

struct ForwardHooks {
  std::function<void()> pre_forward;                                  // before module->forward
  std::function<void(const std::vector<at::Tensor>& outputs)> post_forward;  // after, with the outputs
  // Run the forward under activation checkpointing (checkpoint.h) when grad mode is on: its
  // activations are recomputed in backward. The module's forward must return one tensor.
  bool checkpoint_activations = false;
};

// Hooks are keyed by module identity. Registering twice replaces; clearing an absent entry is a no-op.
void set_forward_hooks(const torch::nn::Module* module, ForwardHooks hooks);
void clear_forward_hooks(const torch::nn::Module* module);
// nullptr when the module has no hooks. The pointer stays valid until the hooks are replaced or cleared.
const ForwardHooks* find_forward_hooks(const torch::nn::Module* module);

namespace detail {
inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect_tensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <class T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}  // non-tensor outputs carry no hooks
template <class... Ts>
void collect_tensors(const std::tuple<Ts...>& tuple, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... items) { (collect_tensors(items, out), ...); }, tuple);
}
// The module behind a holder or a shared_ptr, non-const (forward is not a const method).
template <class T>
T* raw(const std::shared_ptr<T>& module) { return module.get(); }
template <class T>
T* raw(const torch::nn::ModuleHolder<T>& module) { return module.ptr().get(); }
}  // namespace detail

// module: a ModuleHolder (nn::Linear, a TORCH_MODULE type) or a std::shared_ptr to a module.
template <class ModulePtr, class... Args>
auto call(const ModulePtr& module, Args&&... args)
    -> decltype(detail::raw(module)->forward(std::forward<Args>(args)...)) {
  auto* impl = detail::raw(module);
  const ForwardHooks* hooks = find_forward_hooks(impl);
  if (hooks == nullptr) return impl->forward(std::forward<Args>(args)...);
  if (hooks->pre_forward) hooks->pre_forward();
  using Output = decltype(impl->forward(std::forward<Args>(args)...));
  Output output = [&]() -> Output {
    if constexpr (std::is_same_v<Output, at::Tensor>) {
      if (hooks->checkpoint_activations && at::GradMode::is_enabled()) return detail::checkpointed_forward(impl, args...);
    } else {
      if (hooks->checkpoint_activations && at::GradMode::is_enabled()) {
        throw std::invalid_argument("activation checkpointing needs a module whose forward returns one tensor");
      }
    }
    return impl->forward(std::forward<Args>(args)...);
  }();
  if (hooks->post_forward) {
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    hooks->post_forward(tensors);
  }
  return output;
}

// Construction notices. A listener installed on this thread sees every block given to push_block
// (after it is added to its list) until the listener is removed.
using BlockBuiltListener = std::function<void(const std::shared_ptr<torch::nn::Module>& block)>;

class ScopedBlockBuiltListener {
 public:
  explicit ScopedBlockBuiltListener(BlockBuiltListener listener);
  ~ScopedBlockBuiltListener();
  ScopedBlockBuiltListener(const ScopedBlockBuiltListener&) = delete;
  ScopedBlockBuiltListener& operator=(const ScopedBlockBuiltListener&) = delete;

 private:
  BlockBuiltListener previous_;
};

void notify_block_built(const std::shared_ptr<torch::nn::Module>& block);

template <class ModuleHolderT>
void push_block(torch::nn::ModuleList& list, const ModuleHolderT& block) {
  list->push_back(block);
  notify_block_built(block.ptr());
}

}  // namespace fsdp::nn
