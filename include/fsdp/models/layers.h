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

// Token embedding whose table can also serve as the output head (tied weights, as GPT-2 and the small
// Llamas have): forward(ids) looks rows up, forward(hidden) projects onto the vocabulary. One module
// for both uses, so a wrapper that shards it as a unit of its own (called through fsdp::nn::call)
// sees both uses. Parameter "weight" [vocab, dim], like torch::nn::Embedding's, so checkpoint
// names are unchanged.
//   ids [b, t] int64       -> [b, t, dim]
//   hidden [b, t, dim] any floating dtype -> logits [b, t, vocab] in that dtype
struct TokenEmbeddingImpl : torch::nn::Module {
  TokenEmbeddingImpl(int64_t vocab, int64_t dim);
  at::Tensor forward(const at::Tensor& ids_or_hidden);
  at::Tensor weight;  // [vocab, dim]
};
TORCH_MODULE(TokenEmbedding);

// Config checks shared by the model families: throws std::invalid_argument("<family>: <field> must
// be positive, got <value>").
void require_positive(const char* family, int64_t value, const char* field);

// Reference initialisation: every Linear and Embedding weight of `module` (recursively) drawn from
// normal(0, std), Linear biases zeroed; norms keep their ones and zeros.
void init_normal(torch::nn::Module& module, double std);

}  // namespace fsdp::models
