// fsdp/models/gemma3.h: the Gemma 3 family's text model (Gemma Team 2025; Hugging Face's
// Gemma3ForCausalLM, model_type "gemma3_text"). Beside Llama's decoder it has
//   - RMSNorm scaled by (1 + w), computed in fp32 and cast after the scale (weights start at 0);
//   - four norms a block: before and after attention, before and after the MLP (the "sandwich");
//   - GeGLU with the tanh approximation of GELU (gelu_pytorch_tanh) instead of SwiGLU;
//   - token embeddings multiplied by sqrt(dim) (rounded to the weights' dtype, as transformers does);
//   - per-head RMSNorm on q and k before rotary (q_norm, k_norm), heads of their own width;
//   - attention scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2;
//   - local layers (sliding window, rotary base 10,000) and global ones (full attention, base 1e6,
//     linear rope scaling in the 4B-27B models): every sliding_window_pattern-th layer is global;
//   - the head tied to the embedding.
// Module names follow Hugging Face's (embed_tokens, layers.<i>.self_attn.q_proj, ...,
// pre_feedforward_layernorm), so its files load by name.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "fsdp/models/layers.h"

namespace fsdp::models {

class ModelFamily;

struct Gemma3Config {
  int64_t vocab = 262144;
  int64_t context = 32768;
  int64_t dim = 1152;
  int64_t heads = 4;
  int64_t kv_heads = 1;
  int64_t head_dim = 256;
  int64_t layers = 26;
  int64_t ffn_hidden = 6912;
  double norm_eps = 1e-6;
  int64_t query_pre_attn_scalar = 256;
  int64_t sliding_window = 512;        // the local layers' window (positions seen, itself included)
  int64_t sliding_window_pattern = 6;  // layer i is global when (i + 1) % pattern == 0
  double rope_theta = 1000000.0;       // global layers
  double rope_local_theta = 10000.0;   // local layers
  double rope_linear_factor = 1.0;     // global layers' linear scaling (4B-27B: 8)
  LoraSpec lora;                       // adapters on q, k, v, o, gate, up, down projections

  static const std::vector<std::string>& linear_layers();

  static const ModelFamily& family();  // its spec (gemma3_family.cpp)
  void validate() const;               // throws std::invalid_argument naming the bad field
  bool is_global_layer(int64_t layer) const { return (layer + 1) % sliding_window_pattern == 0; }
  int64_t parameter_count() const;
  int64_t lora_parameter_count() const;
  int64_t linear_weight_count() const;
  double flops_per_token(int64_t seq) const;
};

// Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + weight), in fp32, cast back to x's dtype.
struct Gemma3RMSNormImpl : torch::nn::Module {
  Gemma3RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;  // [dim] fp32, initialised to zeros (a scale of 1)
  double eps;
};
TORCH_MODULE(Gemma3RMSNorm);

struct Gemma3AttentionImpl : torch::nn::Module {
  explicit Gemma3AttentionImpl(const Gemma3Config& config);
  // x [b, t, dim]; cos, sin [t, head_dim] (or [b * t, head_dim] for packed rows); allowed: bool
  // [b or 1, 1, t, t] or undefined (causal) -> [b, t, dim]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& allowed);
  AdaptedLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  Gemma3RMSNorm q_norm{nullptr}, k_norm{nullptr};  // [head_dim] each
  int64_t heads, kv_heads, head_dim;
  double query_scale;  // multiplies q so that attention's 1/sqrt(head_dim) becomes 1/sqrt(query_pre_attn_scalar)
};
TORCH_MODULE(Gemma3Attention);

struct Gemma3MlpImpl : torch::nn::Module {
  explicit Gemma3MlpImpl(const Gemma3Config& config);
  at::Tensor forward(const at::Tensor& x);  // down(gelu_tanh(gate(x)) * up(x))
  AdaptedLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Gemma3Mlp);

// One decoder layer: the FSDP unit (wrap policy module type "Gemma3Block"), local or global.
struct Gemma3BlockImpl : torch::nn::Module {
  explicit Gemma3BlockImpl(const Gemma3Config& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& allowed);
  Gemma3RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Gemma3RMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};
  Gemma3Attention self_attn{nullptr};
  Gemma3Mlp mlp{nullptr};
};
TORCH_MODULE(Gemma3Block);

struct Gemma3Impl : torch::nn::Module {
  explicit Gemma3Impl(const Gemma3Config& config);
  // ids [b, t] int64 -> logits [b, t, vocab]; positions [b, t] int64 for packed rows (undefined: 0..t-1).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& positions = {});
  // ids, targets [b, t] (-100: not counted) -> the summed token loss, fp32 scalar (chunked head).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& targets, const ChunkedLoss& chunks,
                     const at::Tensor& positions = {});
  const Gemma3Config& config() const { return config_; }

  TokenEmbedding embed_tokens{nullptr};  // also the output head (tied)
  torch::nn::ModuleList layers;
  Gemma3RMSNorm norm{nullptr};

 private:
  at::Tensor hidden_states(const at::Tensor& ids, const at::Tensor& positions);  // -> [b, t, dim]

  Gemma3Config config_;
  // [context, head_dim] fp32 each, computed once: the global layers' and the local layers' angles.
  at::Tensor global_cos_, global_sin_, local_cos_, local_sin_;
};
TORCH_MODULE(Gemma3);

}  // namespace fsdp::models
