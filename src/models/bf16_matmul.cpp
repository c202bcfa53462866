#include "fsdp/models/bf16_matmul.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
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

bool matmul_widens(const at::Tensor& t) { return widened(t); }

Bf16MatmulTimes time_bf16_matmuls(const std::vector<LinearShape>& shapes, int repeats) {
  // Restores the mode it found, on an exception too.
  struct Restore {
    Bf16Matmul before = bf16_matmul();
    ~Restore() { set_bf16_matmul(before); }
  } restore;
  const torch::AutoGradMode grad_mode(true);
  // Its own generator: the global one drives dropout, and a resumed run restores it exactly.
  auto generator = at::detail::createCPUGenerator(1);
  std::vector<at::Tensor> xs, weights, grads;
  for (const LinearShape& s : shapes) {
    xs.push_back(at::randn({s.rows, s.in}, generator).to(at::kBFloat16).requires_grad_(true));
    weights.push_back((at::randn({s.out, s.in}, generator) * 0.02).to(at::kBFloat16).requires_grad_(true));
    grads.push_back(at::randn({s.rows, s.out}, generator).to(at::kBFloat16));
  }
  auto round = [&](Bf16Matmul m) {
    set_bf16_matmul(m);
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < shapes.size(); ++i) {
      models::linear(xs[i], weights[i]).backward(grads[i]);
      xs[i].mutable_grad().reset();
      weights[i].mutable_grad().reset();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> native, fp32;
  // Warm-up: allocations, the GEMM libraries' first calls. A model whose layers take over a second
  // each way gets one timed round (a start-up measurement, not a benchmark).
  const double warm_up = round(Bf16Matmul::Native) + round(Bf16Matmul::Fp32);
  if (warm_up > 2.0) repeats = 1;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    native.push_back(round(Bf16Matmul::Native));
    fp32.push_back(round(Bf16Matmul::Fp32));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(native), median(fp32)};
}

}  // namespace fsdp::models
