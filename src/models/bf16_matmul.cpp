#include "fsdp/models/bf16_matmul.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <atomic>
#include <stdexcept>

namespace fsdp::models {

namespace {

std::atomic<Bf16Matmul>& mode() {
  static std::atomic<Bf16Matmul> chosen{Bf16Matmul::Native};
  return chosen;
}

bool widened(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 && mode().load() == Bf16Matmul::Fp32; }

// y = x W^T + b for bf16 x, W, b by fp32 GEMMs; saves the bf16 x and W (what at::linear saves).
struct WidenedLinear : torch::autograd::Function<WidenedLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    const bool has_bias = bias.numel() > 0;  // an empty stand-in when there is none (see linear())
    ctx->saved_data["has_bias"] = has_bias;
    const at::Tensor b = has_bias ? bias.to(at::kFloat) : at::Tensor();
    return at::linear(x.to(at::kFloat), weight.to(at::kFloat), b).to(x.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const int64_t out = weight.size(0), in = weight.size(1);
    const at::Tensor g = grad_outputs[0].to(at::kFloat).reshape({-1, out});  // [rows, out] fp32
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_x = at::mm(g, weight.to(at::kFloat)).to(x.scalar_type()).reshape(x.sizes());
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight = at::mm(g.t(), x.reshape({-1, in}).to(at::kFloat)).to(weight.scalar_type());
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      grad_bias = g.sum(0).to(weight.scalar_type());
    }
    return {grad_x, grad_weight, grad_bias};
  }
};

}  // namespace

const char* to_string(Bf16Matmul m) { return m == Bf16Matmul::Native ? "native" : "fp32"; }

Bf16Matmul bf16_matmul_from_string(const std::string& text) {
  if (text == "native") return Bf16Matmul::Native;
  if (text == "fp32") return Bf16Matmul::Fp32;
  throw std::invalid_argument("bf16 matmul mode '" + text + "' (expected native or fp32)");
}

void set_bf16_matmul(Bf16Matmul m) { mode().store(m); }
Bf16Matmul bf16_matmul() { return mode().load(); }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!widened(x)) return at::linear(x, weight, bias);
  // autograd::Function cannot take an undefined tensor: no bias is an empty one.
  return WidenedLinear::apply(x, weight, bias.defined() ? bias : at::empty({0}, x.options()));
}

at::Tensor matmul_in_compute_dtype(const at::Tensor& a, const at::Tensor& b) {
  if (!widened(a)) return at::matmul(a, b);
  return at::matmul(a.to(at::kFloat), b.scalar_type() == at::kFloat ? b : b.to(at::kFloat)).to(a.scalar_type());
}

at::Tensor matmul_operand(const at::Tensor& t) { return widened(t) ? t.to(at::kFloat) : t; }

}  // namespace fsdp::models
