#include "fsdp/models/layers.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "fsdp/compat.h"

namespace fsdp::models {

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: q, k, v must be [b, heads, t, hd]");
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "attention: ", heads, " query heads are not a multiple of ",
              kv_heads, " key/value heads");
  at::Tensor keys = k, values = v;
  if (kv_heads != heads) {
    // [b, kv, t, hd] -> [b, kv * group, t, hd]: query head h reads key/value head h / group.
    keys = k.repeat_interleave(heads / kv_heads, 1);
    values = v.repeat_interleave(heads / kv_heads, 1);
  }
  return compat::scaled_dot_product_attention(q, keys, values, causal);
}

std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t t, int64_t head_dim, double theta, const RopeScaling& scaling) {
  TORCH_CHECK(head_dim % 2 == 0, "rotary_tables: head_dim ", head_dim, " must be even");
  // fp32 like transformers' _compute_default_rope_parameters: 1 / theta^(arange(0, hd, 2) / hd).
  auto exponents = torch::arange(0, head_dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(head_dim);
  auto inverse_frequency = 1.0 / torch::pow(theta, exponents);  // [hd/2] fp32
  if (scaling.enabled) {
    // transformers' _compute_llama3_parameters, step for step.
    const double old_context = static_cast<double>(scaling.original_context);
    const double low_freq_wavelength = old_context / scaling.low_freq_factor;
    const double high_freq_wavelength = old_context / scaling.high_freq_factor;
    auto wavelength = 2.0 * M_PI / inverse_frequency;
    auto scaled = torch::where(wavelength > low_freq_wavelength, inverse_frequency / scaling.factor, inverse_frequency);
    auto smooth = (old_context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
    auto smoothed = (1.0 - smooth) * scaled / scaling.factor + smooth * scaled;
    auto medium = (wavelength >= high_freq_wavelength).logical_and(wavelength <= low_freq_wavelength);
    inverse_frequency = torch::where(medium, smoothed, scaled);
  }
  auto angles = torch::outer(torch::arange(t, torch::kFloat), inverse_frequency);  // [t, hd/2] fp32
  angles = torch::cat({angles, angles}, 1);                                         // [t, hd]
  return {angles.cos(), angles.sin()};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto first = x.narrow(-1, 0, half), second = x.narrow(-1, half, half);
  auto rotated_half = torch::cat({-second, first}, -1);
  return x * cos.to(x.scalar_type()) + rotated_half * sin.to(x.scalar_type());
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  // Normalise in fp32 even when x is bf16, as the reference implementations do.
  auto x32 = x.to(torch::kFloat);
  auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return normed.to(x.scalar_type()) * weight.to(x.scalar_type());
}

void require_positive(const char* family, int64_t value, const char* field) {
  if (value <= 0) {
    throw std::invalid_argument(std::string(family) + ": " + field + " must be positive, got " + std::to_string(value));
  }
}

TokenEmbeddingImpl::TokenEmbeddingImpl(int64_t vocab, int64_t dim) {
  weight = register_parameter("weight", torch::empty({vocab, dim}));
  // The same draw as torch::nn::Embedding's reset(), so a model keeps its initial values.
  torch::nn::init::normal_(weight);
}

at::Tensor TokenEmbeddingImpl::forward(const at::Tensor& ids_or_hidden) {
  if (!at::isFloatingType(ids_or_hidden.scalar_type())) return at::embedding(weight, ids_or_hidden);
  return torch::matmul(ids_or_hidden, weight.t());
}

void init_normal(torch::nn::Module& module, double std) {
  torch::NoGradGuard no_grad;
  // include_self=false: this runs inside constructors, before the module is owned by a shared_ptr;
  // the module itself is a container, not a Linear or an Embedding.
  for (auto& child : module.modules(/*include_self=*/false)) {
    if (auto* linear = child->as<torch::nn::Linear>()) {
      linear->weight.normal_(0.0, std);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = child->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0.0, std);
    } else if (auto* tokens = child->as<TokenEmbedding>()) {
      tokens->weight.normal_(0.0, std);
    }
  }
}

}  // namespace fsdp::models
