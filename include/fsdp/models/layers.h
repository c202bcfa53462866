// fsdp/models/layers.h: the pieces the model zoo shares: causal self-attention (with grouped-query
// heads), rotary position embeddings (Hugging Face's rotate-half layout, so published Llama weights
// load unchanged), RMSNorm, and the initialisation helpers of the reference implementations.
// Plain libtorch; nothing here knows of sharding.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "fsdp/models/attention.h"
#include "fsdp/models/linear_cross_entropy.h"

#include <string>
#include <vector>

namespace fsdp::models {

// Attention itself, and the paths it may take: fsdp/models/attention.h.

// Llama 3.1's frequency scaling for long contexts (Hugging Face's rope_scaling with rope_type
// "llama3"): wavelengths longer than original_context / low_freq_factor are stretched by `factor`,
// those shorter than original_context / high_freq_factor kept, and the band between blended
// smoothly. Off (factor 1) unless enabled.
struct RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_context = 8192;
};

// Rotary embedding tables for positions [0, t): cos and sin, each [t, head_dim] fp32, where
// column c holds position * f(c mod head_dim/2), f(i) = theta^(-2i / head_dim), rescaled by
// `scaling` where enabled. The frequencies are computed in fp32, as Hugging Face computes them, so
// published weights see the same angles.
std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t t, int64_t head_dim, double theta,
                                                const RopeScaling& scaling = {});
// Applying them: fsdp::models::rotary (fused_ops.h).

// Root-mean-square norm with a learned scale (Llama): x / sqrt(mean(x^2) + eps) * weight
// (fsdp::models::rms_norm, fused_ops.h: one kernel each way on a GPU).
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
  // As the tied output head: hidden [b, t, dim], targets [b, t] -> the summed token loss (fp32
  // scalar), chunks.rows tokens at a time (linear_cross_entropy.h).
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& targets, const ChunkedLoss& chunks);
  at::Tensor weight;  // [vocab, dim]
};
TORCH_MODULE(TokenEmbedding);

// An untied output head: parameter "weight" [vocab, dim], no bias (drawn as torch::nn::Linear
// draws it). forward(hidden) gives logits [..., vocab]; forward(hidden, targets, chunks) the
// summed token loss without materialising them (linear_cross_entropy.h).
struct LmHeadImpl : torch::nn::Module {
  LmHeadImpl(int64_t dim, int64_t vocab);
  at::Tensor forward(const at::Tensor& hidden);
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& targets, const ChunkedLoss& chunks);
  at::Tensor weight;  // [vocab, dim]
};
TORCH_MODULE(LmHead);

// Low-rank adapters (LoRA, Hu et al. 2021) as PEFT defines them: a targeted linear layer computes
//   y = x W^T + b + scale * B(A(dropout(x))),   scale = alpha / rank (rsLoRA: alpha / sqrt(rank))
// with A [rank, in] drawn as nn.Linear draws its weight (kaiming-uniform) and B [out, rank] zeros,
// so a model starts equal to its base. With adapters, everything else (the base) is frozen.
struct LoraSpec {
  // PEFT's target_modules = "all-linear": every linear layer of the blocks (the output head is not one).
  static constexpr const char* kAllLinear = "all-linear";

  int64_t rank = 0;  // 0: no adapters
  double alpha = 16.0;
  double dropout = 0.0;
  bool rslora = false;  // rank-stabilised scale alpha / sqrt(rank) (Kalajdzievski 2023; PEFT's use_rslora)
  std::vector<std::string>
      targets;  // linear layers by name: q_proj, v_proj (Llama), c_attn (GPT-2), ...; or {"all-linear"}
  bool enabled() const { return rank > 0; }
  bool all_linear() const { return targets.size() == 1 && targets.front() == kAllLinear; }
  bool targets_layer(const std::string& name) const;
  double scale() const;  // what B A is multiplied by
  // The layer names targeted, "all-linear" expanded to `layers` (the family's linear layers).
  std::vector<std::string> target_layers(const std::vector<std::string>& layers) const;
  // "q_proj v_proj" or "q_proj,v_proj" -> {"q_proj", "v_proj"} (config files and fsdp-plan's flag).
  static std::vector<std::string> parse_targets(const std::string& text);
  // Throws std::invalid_argument for rank <= 0 with targets, no targets, "all-linear" beside other
  // names, or a target none of `layers` (the family's linear layers) is called.
  void validate(const char* family, const std::vector<std::string>& layers) const;
};

// A linear layer with parameters "weight" [out, in] and "bias" [out] (as torch::nn::Linear, same
// initial draws) that can take LoRA adapters: submodules "lora_A" and "lora_B" (PEFT's names).
struct AdaptedLinearImpl : torch::nn::Module {
  AdaptedLinearImpl(int64_t in, int64_t out, bool bias);
  // Adds lora_A and lora_B (the caller freezes the base).
  void add_adapter(const LoraSpec& spec);
  at::Tensor forward(const at::Tensor& x);  // [..., in] -> [..., out]
  // scale * B(A(dropout(x))) [..., out], what the adapter adds to the base's product; undefined without one.
  at::Tensor adapter_term(const at::Tensor& x);
  at::Tensor weight, bias;  // bias undefined without one
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  torch::nn::Dropout lora_dropout{nullptr};
  double lora_scale = 0.0;  // LoraSpec::scale()
};
TORCH_MODULE(AdaptedLinear);

// Linear layers reading one x (attention's q, k, v; the MLP's gate and up) as one GEMM: where
// none has a bias, their base weights are back to back in one buffer (an FSDP unit's gathered
// parameters: stacked_linear.h) and fused operations are on (train.fused_ops).
// stacked_projections: the layers' outputs side by side, [..., sum out], where none has an
// adapter either; undefined otherwise (the caller calls each layer).
// projections: each layer's output [..., out_i], always: narrow views of the one product (an
// adapter's term added to its layer's) where the base weights stack, else each layer's forward.
at::Tensor stacked_projections(const at::Tensor& x, const std::vector<AdaptedLinearImpl*>& linears);
std::vector<at::Tensor> projections(const at::Tensor& x, const std::vector<AdaptedLinearImpl*>& linears);

// The seven projections of a block with grouped-query attention and a gated MLP (Llama's decoder,
// Gemma 3), by Hugging Face's names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
const std::vector<std::string>& gated_block_linear_layers();
// LoRA's parameters over `layers` such blocks (width dim, q heads x head_dim = q wide, keys and
// values kv wide, MLP ffn wide): rank x (in + out) for each projection `spec` targets.
int64_t gated_block_lora_parameters(const LoraSpec& spec, int64_t layers, int64_t dim, int64_t q, int64_t kv,
                                    int64_t ffn);

// Adds adapters to every AdaptedLinear of `module` (recursively) whose name spec targets, then
// freezes every parameter of `module` that is not an adapter's. Does nothing when !spec.enabled().
void apply_lora(torch::nn::Module& module, const LoraSpec& spec);

// Config checks shared by the model families: throws std::invalid_argument("<family>: <field> must
// be positive, got <value>").
void require_positive(const char* family, int64_t value, const char* field);

// Reference initialisation: every Linear and Embedding weight of `module` (recursively) drawn from
// normal(0, std), Linear biases zeroed; norms keep their ones and zeros.
void init_normal(torch::nn::Module& module, double std);

}  // namespace fsdp::models
