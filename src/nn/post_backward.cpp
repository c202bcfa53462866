#include "fsdp/nn/post_backward.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

namespace fsdp::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Callback final : torch::CustomClassHolder {
  std::function<void()> run;
};

// Identity on the tensors; its backward calls the callback. A custom Function returning its inputs
// unmodified gets them back as views with this node as their gradient function.
struct AfterBackward : torch::autograd::Function<AfterBackward> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<Callback> callback) {
    ctx->saved_data["callback"] = c10::IValue::make_capsule(callback);
    return variable_list(inputs.begin(), inputs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto callback = c10::static_intrusive_pointer_cast<Callback>(ctx->saved_data["callback"].toCapsule());
    callback->run();
    grads.emplace_back();  // for the callback argument
    return grads;
  }
};

}  // namespace

std::vector<at::Tensor> after_backward_of(const std::vector<at::Tensor>& inputs, std::function<void()> callback,
                                          bool* installed) {
  if (installed) *installed = false;
  std::vector<size_t> hooked;
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      hooked.push_back(i);
      tensors.push_back(inputs[i]);
    }
  }
  if (tensors.empty() || !torch::GradMode::is_enabled()) return inputs;
  auto holder = c10::make_intrusive<Callback>();
  holder->run = std::move(callback);
  variable_list outputs = AfterBackward::apply(at::TensorList(tensors), holder);
  std::vector<at::Tensor> result = inputs;
  for (size_t k = 0; k < hooked.size(); ++k) result[hooked[k]] = outputs[k];
  if (installed) *installed = true;
  return result;
}

}  // namespace fsdp::nn
