// fsdp/nn/checkpoint.h: activation checkpointing (libtorch has none).
//
// checkpoint(run, inputs) returns run(inputs) but keeps only the inputs for backward: the
// activations inside `run` are not saved. When backward reaches the output, `run` is executed
// again with gradients on, from the saved inputs and with the CPU random generator restored to
// its state at the first run (so dropout draws the same masks), and the gradient is propagated
// through that recomputation: parameters used by `run` get their .grad accumulated as usual,
// inputs get theirs returned. Memory: the inputs of each checkpointed region instead of every
// intermediate tensor; cost: one more forward of the region in backward.
//
// Model code does not call this: fsdp::nn::call does, for modules marked with
// ForwardHooks::checkpoint_activations (see hooks.h). Knows nothing of sharding.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace fsdp::nn {

using RecomputeFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

// Runs run(inputs) without saving activations, and recomputes it in backward (see above).
// Undefined inputs are allowed (passed through). Without grad mode it is just run(inputs).
at::Tensor checkpoint(RecomputeFn run, const std::vector<at::Tensor>& inputs);

namespace detail {

template <class T>
void collect_tensor_arg(const T& arg, std::vector<at::Tensor>& out) {
  if constexpr (std::is_same_v<T, at::Tensor>) out.push_back(arg);
}

// The argument itself, or for a tensor argument the next of `tensors`.
template <class T>
T substitute_tensor_arg(const T& arg, const std::vector<at::Tensor>& tensors, size_t& next) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return tensors.at(next++);
  } else {
    return arg;
  }
}

// impl->forward(args...) under checkpoint(): tensor arguments are the checkpoint's inputs, the
// others are copied into the recompute closure. The forward must return one tensor.
template <class Impl, class... Args>
at::Tensor checkpointed_forward(Impl* impl, const Args&... args) {
  std::vector<at::Tensor> tensors;
  (collect_tensor_arg(args, tensors), ...);
  auto saved = std::make_tuple(std::decay_t<Args>(args)...);
  RecomputeFn run = [impl, saved](const std::vector<at::Tensor>& inputs) -> at::Tensor {
    size_t next = 0;
    // Braced initialisation evaluates left to right, so tensors are taken in argument order.
    auto substituted = std::apply(
        [&](const auto&... a) {
          return std::tuple<std::decay_t<decltype(a)>...>{substitute_tensor_arg(a, inputs, next)...};
        },
        saved);
    return std::apply([&](const auto&... a) -> at::Tensor { return impl->forward(a...); }, substituted);
  };
  return checkpoint(std::move(run), tensors);
}

}  // namespace detail
}  // namespace fsdp::nn
