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
//   3. Optionally, announce other large modules once built (the token embedding, the output head)
//      with fsdp::nn::announce_built(module, name), for the same reason.
//   4. Optionally, inside a module's forward, say that this call's backward reads none of the
//      module's parameters, its children's included, with
//      fsdp::nn::backward_reads_no_parameters(*this) (an embedding lookup; a loss whose gradients
//      forward already computed), so that a wrapper need not gather them again for backward. Say
//      it only where true: their memory may be gone by then. A call run under activation
//      checkpointing recomputes its forward in backward, and is never taken at its word.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/container/modulelist.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fsdp/nn/checkpoint.h"
#include "fsdp/nn/post_backward.h"

namespace fsdp::nn {

struct ForwardHooks {
  std::function<void()> pre_forward;                                         // before module->forward
  std::function<void(const std::vector<at::Tensor>& outputs)> post_forward;  // after, with the outputs
  // After each call's forward, before post_forward: whether this call's backward may read the
  // module's parameters (false when its forward said backward_reads_no_parameters).
  std::function<void(bool backward_reads_parameters)> backward_reads_parameters;
  // Run the forward under activation checkpointing (checkpoint.h) when grad mode is on: its
  // activations are recomputed in backward. The module's forward must return one tensor.
  bool checkpoint_activations = false;
  // Asked at each call made with grad mode on whose tensor inputs include one that requires grad:
  // returns the function to run in backward once the gradients of this call's inputs are
  // computed, i.e. once the module's backward for this call is over (post_backward.h). An empty
  // result hooks nothing.
  std::function<std::function<void()>()> post_backward_of_inputs;
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
T* raw(const std::shared_ptr<T>& module) {
  return module.get();
}
template <class T>
T* raw(const torch::nn::ModuleHolder<T>& module) {
  return module.ptr().get();
}
}  // namespace detail

// See 4. above: `module` is the one whose forward is running (a nested module speaks for itself).
void backward_reads_no_parameters(const torch::nn::Module& module);

namespace detail {
// The module that said backward_reads_no_parameters during the innermost hooked call (nullptr:
// none). Each hooked call clears it and restores the caller's on leaving, so a nested call's word
// stays its own.
const torch::nn::Module* parameter_free_backward_said();
const torch::nn::Module* exchange_parameter_free_backward(const torch::nn::Module* module);

struct ParameterFreeBackwardScope {
  ParameterFreeBackwardScope() : outer_(exchange_parameter_free_backward(nullptr)) {}
  ~ParameterFreeBackwardScope() { exchange_parameter_free_backward(outer_); }
  bool said_by(const torch::nn::Module* module) const { return parameter_free_backward_said() == module; }
  const torch::nn::Module* outer_;
};
}  // namespace detail

namespace detail {
// Runs the forward (checkpointed when asked) and the post-forward hook; args are the call's own.
template <class Impl, class... Args>
auto hooked_forward(Impl* impl, const ForwardHooks* hooks, Args&&... args)
    -> decltype(impl->forward(std::forward<Args>(args)...)) {
  using Output = decltype(impl->forward(std::forward<Args>(args)...));
  const ParameterFreeBackwardScope scope;
  bool recomputed = false;  // checkpointed: backward runs the forward again, on the parameters
  Output output = [&]() -> Output {
    if constexpr (std::is_same_v<Output, at::Tensor>) {
      if (hooks->checkpoint_activations && at::GradMode::is_enabled()) {
        recomputed = true;
        return detail::checkpointed_forward(impl, args...);
      }
    } else {
      if (hooks->checkpoint_activations && at::GradMode::is_enabled()) {
        throw std::invalid_argument("activation checkpointing needs a module whose forward returns one tensor");
      }
    }
    return impl->forward(std::forward<Args>(args)...);
  }();
  if (hooks->backward_reads_parameters) hooks->backward_reads_parameters(recomputed || !scope.said_by(impl));
  if (hooks->post_forward) {
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    hooks->post_forward(tensors);
  }
  return output;
}
}  // namespace detail

// module: a ModuleHolder (nn::Linear, a TORCH_MODULE type) or a std::shared_ptr to a module.
template <class ModulePtr, class... Args>
auto call(const ModulePtr& module, Args&&... args)
    -> decltype(detail::raw(module)->forward(std::forward<Args>(args)...)) {
  auto* impl = detail::raw(module);
  const ForwardHooks* hooks = find_forward_hooks(impl);
  if (hooks == nullptr) return impl->forward(std::forward<Args>(args)...);
  if (hooks->pre_forward) hooks->pre_forward();
  if (hooks->post_backward_of_inputs && at::GradMode::is_enabled()) {
    std::vector<at::Tensor> tensors;
    (detail::collect_tensor_arg(args, tensors), ...);
    bool any_requires_grad = false;
    for (const at::Tensor& t : tensors) any_requires_grad |= t.defined() && t.requires_grad();
    if (any_requires_grad) {
      if (std::function<void()> callback = hooks->post_backward_of_inputs()) {
        tensors = after_backward_of(tensors, std::move(callback));
        // The same arguments with the tensors replaced by their hooked views (left to right).
        size_t next = 0;
        std::tuple<std::decay_t<Args>...> substituted{detail::substitute_tensor_arg(args, tensors, next)...};
        return std::apply([&](auto&... a) { return detail::hooked_forward(impl, hooks, a...); }, substituted);
      }
    }
  }
  return detail::hooked_forward(impl, hooks, std::forward<Args>(args)...);
}

// Construction notices. A listener installed on this thread sees every block given to push_block
// (after it is added to its list; `name` is "") and every module given to announce_built (with its
// name) until the listener is removed.
using BlockBuiltListener =
    std::function<void(const std::shared_ptr<torch::nn::Module>& module, const std::string& name)>;

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
// A module other than a block that its model is done building: registered as `name` in the module
// whose constructor runs, its parameters initialised (and frozen or not), and not touched again by
// that constructor. A wrapper whose policy makes it a unit may shard it at once: a Llama's token
// embedding and head (each a few blocks' worth) are then never whole together while it is built.
// Not a block: it is called through fsdp::nn::call like one, but never checkpointed.
void announce_built(const std::shared_ptr<torch::nn::Module>& module, const std::string& name);
// Was `module` added to its model with push_block (and is it still alive)? Such blocks are called
// through fsdp::nn::call by contract, so a size-based wrap policy may choose them.
bool is_pushed_block(const torch::nn::Module* module);

template <class ModuleHolderT>
void push_block(torch::nn::ModuleList& list, const ModuleHolderT& block) {
  list->push_back(block);
  notify_block_built(block.ptr());
}

}  // namespace fsdp::nn
