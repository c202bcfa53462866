// fsdp/models/llama.h: the Llama family (Touvron et al. 2023; Llama 3, 2024): RMSNorm, rotary
// position embeddings, SwiGLU MLP, grouped-query attention, no biases, an untied output head
// (tied only where the published model ties it, as Llama 3.2 1B does). Module names follow Hugging
// Face's (embed_tokens, layers.<i>.self_attn.q_proj, ..., lm_head), and rotary embeddings use its
// rotate-half layout, so published weights load by name.
//
// Initialisation: weights normal(0, 0.02) (Hugging Face's initializer_range), the residual
// projections (o_proj, down_proj) normal(0, 0.02 / sqrt(2 * layers)) as in GPT-2, norms ones.
// Rotary frequencies take Llama 3.1's long-context scaling (rope_scaling) where a config asks for it.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "fsdp/models/layers.h"

namespace fsdp::models {

class ModelFamily;

struct LlamaConfig {
  int64_t vocab = 128256;
  int64_t context = 8192;
  int64_t dim = 4096;
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t layers = 32;
  int64_t ffn_hidden = 14336;
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
  bool tie_embeddings = false;
  RopeScaling rope_scaling;  // Llama 3.1 and 3.2: factor 32 (3.2) or 8 (3.1) over 8192 positions
  LoraSpec lora;             // adapters on q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj

  // The variations of this decoder that other families take (each family's spec fixes or reads
  // them; Llama's are all off): a head width of its own (0: dim / heads; Qwen3's 128 beside a
  // 1024-wide stream), biases on q_proj, k_proj and v_proj (Qwen2), an RMSNorm over each head of q
  // and k before rotary (Qwen3's q_norm, k_norm), and sliding-window attention (Mistral: a query
  // attends the `sliding_window` latest positions, itself included; 0: every earlier position).
  int64_t head_dim = 0;
  bool qkv_bias = false;
  bool qk_norm = false;
  int64_t sliding_window = 0;
  int64_t head_size() const { return head_dim > 0 ? head_dim : dim / heads; }

  static const std::vector<std::string>& linear_layers();  // what LoRA may target

  static const ModelFamily& family();  // its spec (llama_family.cpp)
  void validate() const;               // throws std::invalid_argument naming the bad field
  // The same, naming `family` in its messages (the families built on this decoder).
  void validate_as(const std::string& family) const;
  int64_t parameter_count() const;       // the base (adapters not included)
  int64_t lora_parameter_count() const;  // the adapters: rank x (in + out) per targeted layer
  int64_t linear_weight_count() const;   // the blocks' linear weights (a QLoRA base's NF4 part)
  // Training FLOPs per token at sequence length seq (see GptConfig::flops_per_token).
  double flops_per_token(int64_t seq) const;
};

struct LlamaAttentionImpl : torch::nn::Module {
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  // x [b, t, dim]; cos, sin [t, head_dim], or [b * t, head_dim] (each token's own position, packed
  // rows); allowed: document_causal_mask's [b, 1, t, t] for packed rows, undefined for causal
  // attention over the whole row -> [b, t, dim]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& allowed = {});
  AdaptedLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // [head_dim] each, with qk_norm only
  int64_t heads, kv_heads, head_dim;
};
TORCH_MODULE(LlamaAttention);

struct LlamaMlpImpl : torch::nn::Module {
  explicit LlamaMlpImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& x);  // down(silu(gate(x)) * up(x))
  AdaptedLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMlp);

// One decoder layer: the FSDP unit (wrap policy module type "LlamaBlock").
struct LlamaBlockImpl : torch::nn::Module {
  explicit LlamaBlockImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& allowed = {});
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMlp mlp{nullptr};
};
TORCH_MODULE(LlamaBlock);

struct LlamaImpl : torch::nn::Module {
  explicit LlamaImpl(const LlamaConfig& config);
  // ids [b, t] int64 (t <= context) -> logits [b, t, vocab] in the compute dtype. positions [b, t]
  // int64 (packed rows): each token's position in its own example, restarting at 0 where one
  // starts; rotary angles follow them and attention stays within each example. Undefined: 0..t-1.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& positions = {});
  // ids, targets [b, t] (-100: not counted) -> the summed token loss, fp32 scalar, through the
  // chunked head (linear_cross_entropy.h): no [b * t, vocab] logits.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& targets, const ChunkedLoss& chunks,
                     const at::Tensor& positions = {});
  const LlamaConfig& config() const { return config_; }

  // The same in two halves, for a caller that edits the input embeddings (LLaVA puts image
  // features at its image tokens): ids [b, t] -> [b, t, dim] (the embedding unit's call), and
  // embedded [b, t, dim] -> logits [b, t, vocab], or with targets the summed token loss.
  at::Tensor embed(const at::Tensor& ids);
  at::Tensor logits_from_embeddings(const at::Tensor& embedded);
  at::Tensor loss_from_embeddings(const at::Tensor& embedded, const at::Tensor& targets, const ChunkedLoss& chunks);

  TokenEmbedding embed_tokens{nullptr};  // also the output head when tied
  torch::nn::ModuleList layers;
  RMSNorm norm{nullptr};
  LmHead lm_head{nullptr};  // absent (nullptr) when tied

 private:
  // embedded [b, t, dim] -> the final norm's output [b, t, dim]; positions as forward's.
  at::Tensor hidden_states(const at::Tensor& embedded, const at::Tensor& positions);
  at::Tensor head(const at::Tensor& hidden);                                                        // -> logits
  at::Tensor head(const at::Tensor& hidden, const at::Tensor& targets, const ChunkedLoss& chunks);  // -> summed loss

  LlamaConfig config_;
  at::Tensor rope_cos_, rope_sin_;  // [context, head_dim] fp32, computed once; not parameters
};
TORCH_MODULE(Llama);

}  // namespace fsdp::models
