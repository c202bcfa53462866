// fsdp/models/layers.h: the pieces the model zoo shares: causal self-attention (with grouped-query
// heads), rotary position embeddings (Hugging Face's rotate-half layout, so published Llama weights
// load unchanged), RMSNorm, and the initialisation helpers of the reference implementations.
// Plain libtorch; nothing here knows of sharding.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace fsdp::models {

// q [b, heads, t, hd], k and v [b, kv_heads, t, hd] (heads a multiple of kv_heads) ->
// [b, heads, t, hd]. causal: position i attends to positions <= i. Each group of heads/kv_heads
// query heads shares one key/value head (grouped-query attention; kv_heads == heads is plain
// multi-head attention).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal);

// Rotary embedding tables for positions [0, t): cos and sin, each [t, head_dim] fp32, where
// column c holds position * theta^(-2 (c mod head_dim/2) / head_dim).
std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t t, int64_t head_dim, double theta);
// x [b, heads, t, head_dim]: rotates pairs (c, c + head_dim/2) by the table's angles.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Root-mean-square norm with a learned scale (Llama): x / sqrt(mean(x^2) + eps) * weight.
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;  // [dim] fp32, initialised to ones
  double eps;
};
TORCH_MODULE(RMSNorm);

// Config checks shared by the model families: throws std::invalid_argument("<family>: <field> must
// be positive, got <value>").
void require_positive(const char* family, int64_t value, const char* field);

// Reference initialisation: every Linear and Embedding weight of `module` (recursively) drawn from
// normal(0, std), Linear biases zeroed; norms keep their ones and zeros.
void init_normal(torch::nn::Module& module, double std);

}  // namespace fsdp::models
