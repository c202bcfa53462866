// fsdp/models/gpt.h: GPT-2 (Radford et al. 2019) as nanoGPT and Hugging Face write it: learned
// position embeddings, pre-norm blocks of causal self-attention and a GELU MLP (4x wide unless
// mlp_hidden says otherwise),
// LayerNorm, and an output head tied to the token embedding. Module names follow Hugging Face's
// (wte, wpe, h.<i>.attn.c_attn, ...) so published weights map by name.
//
// Initialisation as in GPT-2: weights normal(0, 0.02), the two residual projections of each block
// (attn.c_proj, mlp.c_proj) normal(0, 0.02 / sqrt(2 * layers)), biases zero, LayerNorm ones/zeros.
#pragma once

#include "fsdp/models/layers.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <string>

namespace fsdp::models {

class ModelFamily;

struct GptConfig {
  int64_t vocab = 50257;
  int64_t context = 1024;  // longest sequence (rows of wpe)
  int64_t dim = 768;
  int64_t heads = 12;
  int64_t layers = 12;
  double dropout = 0.0;    // after attention, MLP and embeddings (0: off, as in fine-tuning)
  bool qkv_bias = true;    // GPT-2 has biases on every Linear
  int64_t mlp_hidden = 0;  // the MLP's width; 0: 4 x dim, GPT-2's (Hugging Face's n_inner)
  double norm_eps = 1e-5;  // LayerNorm epsilon (Hugging Face's layer_norm_epsilon)
  LoraSpec lora;           // adapters on c_attn, c_proj (attention's and the MLP's), c_fc

  int64_t mlp_width() const { return mlp_hidden > 0 ? mlp_hidden : 4 * dim; }
  static const std::vector<std::string>& linear_layers();  // what LoRA may target

  static const ModelFamily& family();    // its spec (gpt_family.cpp)
  void validate() const;                 // throws std::invalid_argument naming the bad field
  int64_t parameter_count() const;       // the base (adapters not included)
  int64_t lora_parameter_count() const;  // the adapters: rank x (in + out) per targeted layer
  int64_t linear_weight_count() const;   // the blocks' linear weights (a QLoRA base's NF4 part)
  // Training FLOPs (forward + backward) per token at sequence length `seq`: 6 per weight of every
  // matmul (embeddings are lookups, the tied head is a matmul) plus 12 * layers * seq * dim for the
  // attention scores and their weighted sum (PaLM's accounting, causal mask not discounted).
  double flops_per_token(int64_t seq) const;
};

struct GptAttentionImpl : torch::nn::Module {
  explicit GptAttentionImpl(const GptConfig& config);
  // [b, t, dim] -> [b, t, dim]; allowed: document_causal_mask's [b, 1, t, t] for packed rows,
  // undefined for causal attention over the whole row
  at::Tensor forward(const at::Tensor& x, const at::Tensor& allowed = {});
  AdaptedLinear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};
  int64_t heads;
};
TORCH_MODULE(GptAttention);

struct GptMlpImpl : torch::nn::Module {
  explicit GptMlpImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x);
  AdaptedLinear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(GptMlp);

// One transformer block: the FSDP unit (wrap policy module type "GptBlock").
struct GptBlockImpl : torch::nn::Module {
  explicit GptBlockImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& allowed = {});
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GptAttention attn{nullptr};
  GptMlp mlp{nullptr};
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& config);
  // ids [b, t] int64 (t <= context) -> logits [b, t, vocab] in the compute dtype. positions [b, t]
  // int64 (packed rows): each token's position in its own example, restarting at 0 where one
  // starts; wpe looks them up and attention stays within each example. Undefined: 0..t-1.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& positions = {});
  // ids, targets [b, t] (-100: not counted) -> the summed token loss, fp32 scalar, through the
  // chunked head (linear_cross_entropy.h): no [b * t, vocab] logits.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& targets, const ChunkedLoss& chunks,
                     const at::Tensor& positions = {});
  const GptConfig& config() const { return config_; }

  TokenEmbedding wte{nullptr};  // also the tied output head
  torch::nn::Embedding wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h;
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  at::Tensor hidden_states(const at::Tensor& ids, const at::Tensor& positions);  // -> ln_f's output [b, t, dim]
  GptConfig config_;
};
TORCH_MODULE(Gpt);

}  // namespace fsdp::models
