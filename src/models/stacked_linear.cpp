#include "fsdp/models/stacked_linear.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <numeric>
#include <sstream>
#include <stdexcept>

#include "fsdp/models/bf16_matmul.h"

namespace fsdp::models {

namespace {

// The first weight that does not continue the rows before it, or weights.size() if all do.
size_t first_apart(const std::vector<at::Tensor>& weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    if (!w.defined() || w.dim() != 2 || !w.is_contiguous()) return i;
    if (i == 0) continue;
    const at::Tensor& before = weights[i - 1];
    const bool continues = w.scalar_type() == before.scalar_type() && w.device() == before.device() &&
                           w.size(1) == before.size(1) && w.storage().is_alias_of(before.storage()) &&
                           w.storage_offset() == before.storage_offset() + before.numel();
    if (!continues) return i;
  }
  return weights.size();
}

// The weights [out_i, in] back to back as one [sum out_i, in] view of their storage (no copy).
at::Tensor stacked_view(const std::vector<at::Tensor>& weights) {
  const int64_t rows = std::accumulate(weights.begin(), weights.end(), int64_t{0},
                                       [](int64_t sum, const at::Tensor& w) { return sum + w.size(0); });
  const int64_t in = weights[0].size(1);
  return weights[0].detach().as_strided({rows, in}, {in, 1}, weights[0].storage_offset());
}

// y = x W^T for the stacked W; saves x and the weights (views of the unit's buffer, as a linear
// layer saves its weight), not the stacked view: backward stacks them again.
struct StackedLinear : torch::autograd::Function<StackedLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, at::TensorList weights) {
    std::vector<at::Tensor> saved{x};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    const at::Tensor stacked = stacked_view(weights.vec());
    // [rows, sum out], widened to fp32 for bf16 where train.bf16_matmul says so, as models::linear.
    const at::Tensor y = matmul_in_compute_dtype(x.reshape({-1, x.size(-1)}), stacked.t());
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = stacked.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const std::vector<at::Tensor> weights(saved.begin() + 1, saved.end());
    if (first_apart(weights) != weights.size()) {
      throw std::logic_error("stacked_linear backward: the weights are no longer back to back in one buffer");
    }
    const at::Tensor stacked = stacked_view(weights);
    const int64_t in = stacked.size(1);
    const at::Tensor dy = grad_outputs[0].to(x.scalar_type()).reshape({-1, stacked.size(0)});  // [rows, sum out]
    torch::autograd::variable_list grads(saved.size());
    if (ctx->needs_input_grad(0)) {
      grads[0] = matmul_in_compute_dtype(dy, stacked).view(x.sizes());
    }
    bool any_weight = false;
    for (size_t i = 0; i < weights.size(); ++i) any_weight = any_weight || ctx->needs_input_grad(i + 1);
    if (any_weight) {
      // [sum out, in]: each weight's gradient is its rows (a contiguous view).
      const at::Tensor grad_stacked = matmul_in_compute_dtype(dy.t(), x.reshape({-1, in})).to(weights[0].scalar_type());
      int64_t row = 0;
      for (size_t i = 0; i < weights.size(); ++i) {
        if (ctx->needs_input_grad(i + 1)) grads[i + 1] = grad_stacked.narrow(0, row, weights[i].size(0));
        row += weights[i].size(0);
      }
    }
    return grads;
  }
};

}  // namespace

bool weights_back_to_back(const std::vector<at::Tensor>& weights) {
  return weights.size() >= 2 && first_apart(weights) == weights.size();
}

at::Tensor stacked_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights) {
  if (weights.empty()) throw std::invalid_argument("stacked_linear: no weights");
  const size_t apart = first_apart(weights);
  if (apart != weights.size()) {
    std::ostringstream what;
    what << "stacked_linear: weight " << apart << " (" << weights[apart].sizes()
         << ") does not continue the rows of the weights before it in one buffer";
    throw std::invalid_argument(what.str());
  }
  if (x.dim() < 1 || x.size(-1) != weights[0].size(1) || x.scalar_type() != weights[0].scalar_type()) {
    std::ostringstream what;
    what << "stacked_linear: x " << x.sizes() << " " << x.scalar_type() << " does not match weights [out, "
         << weights[0].size(1) << "] " << weights[0].scalar_type();
    throw std::invalid_argument(what.str());
  }
  return StackedLinear::apply(x, at::TensorList(weights));
}

}  // namespace fsdp::models
