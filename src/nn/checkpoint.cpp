#include "fsdp/nn/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <mutex>

namespace fsdp::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved inputs: the closure and the generator state of the first run.
struct Recompute final : torch::CustomClassHolder {
  RecomputeFn run;
  at::Tensor rng_state;          // the generator's state before the first run
  at::Device device = at::kCPU;  // whose generator: the inputs' device (dropout on a GPU draws from its own)
  size_t num_inputs = 0;
};

at::Generator generator_of(at::Device device) {
  if (device.is_cpu()) return at::detail::getDefaultCPUGenerator();
  return at::globalContext().defaultGenerator(device);  // CUDA: registered by a CUDA libtorch
}

at::Tensor rng_state(at::Device device) {
  at::Generator generator = generator_of(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state(at::Device device, const at::Tensor& state) {
  at::Generator generator = generator_of(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // inputs: the region's tensor inputs, then (possibly) one empty tensor that requires grad so
  // that the output is part of the graph even when no real input requires grad.
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<Recompute> recompute) {
    for (size_t i = 0; i < recompute->num_inputs; ++i) {
      if (inputs[i].defined()) {
        recompute->device = inputs[i].device();
        break;
      }
    }
    recompute->rng_state = rng_state(recompute->device);
    std::vector<at::Tensor> real(inputs.begin(), inputs.begin() + static_cast<int64_t>(recompute->num_inputs));
    at::Tensor output;
    {
      torch::NoGradGuard no_grad;
      output = recompute->run(real);
    }
    ctx->save_for_backward(variable_list(inputs.begin(), inputs.end()));
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    return {output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> detached;
    for (size_t i = 0; i < recompute->num_inputs; ++i) {
      const at::Tensor& input = saved[i];
      detached.push_back(input.defined() ? input.detach().requires_grad_(input.requires_grad()) : at::Tensor());
    }
    at::Tensor output;
    {
      // The generator continues from where it is now once the recomputation is done.
      const at::Tensor now = rng_state(recompute->device);
      set_rng_state(recompute->device, recompute->rng_state);
      torch::AutoGradMode grad_on(true);
      output = recompute->run(detached);
      set_rng_state(recompute->device, now);
    }
    if (output.requires_grad()) {
      // A nested backward: parameters' gradients accumulate (their hooks fire), inputs' are read below.
      torch::autograd::backward({output}, {grad_outputs[0]});
    }
    variable_list grads;
    for (size_t i = 0; i < saved.size(); ++i) {
      grads.push_back(i < detached.size() && detached[i].defined() && detached[i].requires_grad() ? detached[i].grad()
                                                                                                  : at::Tensor());
    }
    grads.emplace_back();  // for the Recompute argument
    return grads;
  }
};

}  // namespace

at::Tensor checkpoint(RecomputeFn run, const std::vector<at::Tensor>& inputs) {
  if (!torch::GradMode::is_enabled()) return run(inputs);
  // An autograd function takes defined tensors only ("tensor does not have a device"): undefined
  // inputs (an optional argument left out, such as a mask) are put back in their places for each run.
  std::vector<bool> defined;
  std::vector<at::Tensor> given;
  for (const at::Tensor& input : inputs) {
    defined.push_back(input.defined());
    if (input.defined()) given.push_back(input);
  }
  if (given.size() != inputs.size()) {
    run = [whole = std::move(run), defined](const std::vector<at::Tensor>& some) {
      std::vector<at::Tensor> all;
      size_t next = 0;
      for (bool is_defined : defined) all.push_back(is_defined ? some.at(next++) : at::Tensor());
      return whole(all);
    };
  }
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->run = std::move(run);
  recompute->num_inputs = given.size();
  std::vector<at::Tensor> with_anchor = given;
  bool any_requires_grad = false;
  for (const at::Tensor& input : given) any_requires_grad |= input.requires_grad();
  if (!any_requires_grad) with_anchor.push_back(at::empty({0}).requires_grad_(true));
  return CheckpointFunction::apply(at::TensorList(with_anchor), recompute)[0];
}

}  // namespace fsdp::nn
