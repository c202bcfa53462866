// fsdp/nn/post_backward.h: run a function in backward once the gradients of some tensors are known.
//
//   x = fsdp::nn::after_backward_of({x}, [] { ... })[0];   // then use x as before
//
// Returns views of `inputs` that go through one autograd node; its backward runs the callback once
// every gradient flowing into those views has been computed (everything computed from them that
// leads to a gradient has run backward), then passes the gradients on unchanged. This is how a
// wrapper learns that a module's backward is over (PyTorch FSDP2's post-backward on a module's
// inputs). Only tensors that require grad take part; when none does, nothing is hooked and the
// inputs come back as they are (the callback will not run). Knows nothing of sharding.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace fsdp::nn {

// Returns the inputs (hooked ones as views), and whether the callback was installed.
std::vector<at::Tensor> after_backward_of(const std::vector<at::Tensor>& inputs, std::function<void()> callback,
                                          bool* installed = nullptr);

}  // namespace fsdp::nn
