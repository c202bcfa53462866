#include "fsdp/models/llama.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "fsdp/models/attention.h"
#include "fsdp/models/fused_ops.h"
#include "fsdp/nn/hooks.h"

namespace fsdp::models {

void LlamaConfig::validate() const { validate_as("llama"); }

void LlamaConfig::validate_as(const std::string& family) const {
  const char* name = family.c_str();
  require_positive(name, vocab, "vocab");
  require_positive(name, context, "context");
  require_positive(name, dim, "dim");
  require_positive(name, heads, "heads");
  require_positive(name, kv_heads, "kv_heads");
  require_positive(name, layers, "layers");
  require_positive(name, ffn_hidden, "ffn_hidden");
  if (head_dim < 0) throw std::invalid_argument(family + ": head_dim must be positive (or 0: dim / heads)");
  if (sliding_window < 0) throw std::invalid_argument(family + ": sliding_window must be positive (or 0: none)");
  if (head_dim == 0 && dim % heads != 0) {
    throw std::invalid_argument(family + ": dim " + std::to_string(dim) + " is not divisible by heads " +
                                std::to_string(heads));
  }
  if (heads % kv_heads != 0) {
    throw std::invalid_argument(family + ": heads " + std::to_string(heads) + " is not a multiple of kv_heads " +
                                std::to_string(kv_heads));
  }
  if (rope_scaling.enabled) {
    if (!(rope_scaling.factor >= 1.0)) throw std::invalid_argument(family + ": rope_scaling factor must be at least 1");
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) || !(rope_scaling.low_freq_factor > 0.0)) {
      throw std::invalid_argument(family + ": rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    }
    require_positive(name, rope_scaling.original_context, "rope_scaling original_max_position_embeddings");
  }
  if (!(norm_eps > 0.0)) throw std::invalid_argument(family + ": norm_eps must be positive");
  lora.validate(name, linear_layers());
  if (head_size() % 2 != 0) {
    throw std::invalid_argument(family + ": the head dimension (" +
                                std::string(head_dim > 0 ? "head_dim" : "dim / heads") + " = " +
                                std::to_string(head_size()) + ") must be even for rotary embeddings");
  }
}

int64_t LlamaConfig::parameter_count() const {
  const int64_t q = heads * head_size(), kv = kv_heads * head_size();
  const int64_t block = 2 * dim                             // two RMSNorm weights
                        + dim * q + 2 * dim * kv + q * dim  // q_proj, k_proj, v_proj, o_proj
                        + (qkv_bias ? q + 2 * kv : 0)       // their biases (not o_proj's)
                        + (qk_norm ? 2 * head_size() : 0)   // q_norm, k_norm
                        + 3 * dim * ffn_hidden;             // gate, up, down
  return vocab * dim * (tie_embeddings ? 1 : 2) + layers * block + dim;
}

const std::vector<std::string>& LlamaConfig::linear_layers() { return gated_block_linear_layers(); }

int64_t LlamaConfig::linear_weight_count() const {
  const int64_t q = heads * head_size(), kv = kv_heads * head_size();
  return layers * (2 * dim * q + 2 * dim * kv + 3 * dim * ffn_hidden);
}

int64_t LlamaConfig::lora_parameter_count() const {
  return gated_block_lora_parameters(lora, layers, dim, heads * head_size(), kv_heads * head_size(), ffn_hidden);
}

// Attention's two products per query cover the keys it may see: all earlier ones, or the window's.
double LlamaConfig::flops_per_token(int64_t seq) const {
  const double q = static_cast<double>(heads * head_size()), kv = static_cast<double>(kv_heads * head_size());
  const double per_block = 2.0 * dim * q + 2.0 * dim * kv + 3.0 * dim * ffn_hidden;
  const double matmul_weights = layers * per_block + static_cast<double>(vocab) * dim;
  const int64_t seen = sliding_window > 0 ? std::min(seq, sliding_window) : seq;
  return 6.0 * matmul_weights + 12.0 * layers * seen * q;
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c)
    : heads(c.heads), kv_heads(c.kv_heads), head_dim(c.head_size()) {
  q_proj = register_module("q_proj", AdaptedLinear(c.dim, heads * head_dim, c.qkv_bias));
  k_proj = register_module("k_proj", AdaptedLinear(c.dim, kv_heads * head_dim, c.qkv_bias));
  v_proj = register_module("v_proj", AdaptedLinear(c.dim, kv_heads * head_dim, c.qkv_bias));
  o_proj = register_module("o_proj", AdaptedLinear(heads * head_dim, c.dim, /*bias=*/false));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, c.norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim, c.norm_eps));
  }
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const at::Tensor& allowed) {
  const int64_t b = x.size(0), t = x.size(1);
  // Rotated in the projections' own layout [b, t, heads, hd] (one pass, no copy), then viewed as
  // [b, heads, t, hd] for attention. Tables per token ([b * t, hd]): the rows are rotated as one
  // sequence of b * t tokens, [1, b * t, heads, hd], each by its own angle.
  auto rotate = [&](const at::Tensor& y) {
    if (cos.size(0) == t) return rotary(y, cos, sin);
    return rotary(y.view({1, b * t, y.size(2), head_dim}), cos, sin).view({b, t, y.size(2), head_dim});
  };
  // Qwen3's q_norm and k_norm normalise each head's [hd] before rotary.
  auto per_head_norm = [](RMSNorm& norm, const at::Tensor& y) { return norm.is_empty() ? y : norm(y); };
  // q, k, v [b, t, heads or kv_heads * hd]: views of one product where the weights stack (layers.h).
  const auto qkv = projections(x, {q_proj.get(), k_proj.get(), v_proj.get()});
  auto q = rotate(per_head_norm(q_norm, qkv[0].view({b, t, heads, head_dim}))).transpose(1, 2);  // [b, heads, t, hd]
  auto k =
      rotate(per_head_norm(k_norm, qkv[1].view({b, t, kv_heads, head_dim}))).transpose(1, 2);  // [b, kv_heads, t, hd]
  // v copied out of a stacked product: attention keeps v for backward, and a view would keep the
  // whole [b, t, q + 2 kv] product alive with it (Llama's q and k leave it through rotary, which
  // keeps only its tables; Qwen3's q_norm and k_norm keep their inputs, views of it, either way).
  auto v = qkv[2].contiguous().view({b, t, kv_heads, head_dim}).transpose(1, 2);
  auto y = attention(q, k, v, /*causal=*/!allowed.defined(), allowed);
  return o_proj(y.transpose(1, 2).reshape({b, t, heads * head_dim}));
}

LlamaMlpImpl::LlamaMlpImpl(const LlamaConfig& c) {
  auto linear = [](int64_t in, int64_t out) { return AdaptedLinear(in, out, /*bias=*/false); };
  gate_proj = register_module("gate_proj", linear(c.dim, c.ffn_hidden));
  up_proj = register_module("up_proj", linear(c.dim, c.ffn_hidden));
  down_proj = register_module("down_proj", linear(c.ffn_hidden, c.dim));
}

at::Tensor LlamaMlpImpl::forward(const at::Tensor& x) {
  // [..., 2 ffn] where gate's and up's weights stack (layers.h): SwiGLU of its halves, in place.
  const at::Tensor gate_up = stacked_projections(x, {gate_proj.get(), up_proj.get()});
  if (gate_up.defined()) return down_proj(swiglu_stacked(gate_up));
  // Adapters (their terms added to the stacked bases' parts, where those stack) or separate layers.
  const auto parts = projections(x, {gate_proj.get(), up_proj.get()});
  return down_proj(swiglu(parts[0], parts[1]));
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& c) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.dim, c.norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.dim, c.norm_eps));
  mlp = register_module("mlp", LlamaMlp(c));
  init_normal(*this, 0.02);
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  self_attn->o_proj->weight.normal_(0.0, residual_std);
  mlp->down_proj->weight.normal_(0.0, residual_std);
  apply_lora(*this, c.lora);  // after the base's draws; before the block is announced (and sharded)
}

at::Tensor LlamaBlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                   const at::Tensor& allowed) {
  // The residual add and the post-attention norm in one pass (fused_ops.h): h and its norm.
  auto [h, normed] = add_rms_norm(x, self_attn->forward(input_layernorm(x), cos, sin, allowed),
                                  post_attention_layernorm->weight, post_attention_layernorm->eps);
  return h + mlp(normed);
}

LlamaImpl::LlamaImpl(const LlamaConfig& c) : config_(c) {
  c.validate();
  // The embedding and the head are each finished (drawn, frozen under LoRA: base, as the blocks
  // froze theirs) and announced before the next module is built, so a wrapper sharding them as
  // units holds at most one of them whole while the model is built (Llama 3's are 525 M values
  // each). The draws: embedding, blocks, head.
  auto draw_normal = [](at::Tensor& weight) {
    torch::NoGradGuard no_grad;
    weight.normal_(0.0, 0.02);
  };
  embed_tokens = register_module("embed_tokens", TokenEmbedding(c.vocab, c.dim));
  draw_normal(embed_tokens->weight);
  if (c.lora.enabled()) embed_tokens->weight.set_requires_grad(false);
  fsdp::nn::announce_built(embed_tokens.ptr(), "embed_tokens");
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) fsdp::nn::push_block(layers, LlamaBlock(c));
  norm = register_module("norm", RMSNorm(c.dim, c.norm_eps));
  if (c.lora.enabled()) norm->weight.set_requires_grad(false);
  if (!c.tie_embeddings) {
    lm_head = register_module("lm_head", LmHead(c.dim, c.vocab));
    draw_normal(lm_head->weight);
    if (c.lora.enabled()) lm_head->weight.set_requires_grad(false);
    fsdp::nn::announce_built(lm_head.ptr(), "lm_head");
  }
  std::tie(rope_cos_, rope_sin_) = rotary_tables(c.context, c.head_size(), c.rope_theta, c.rope_scaling);
}

at::Tensor LlamaImpl::forward(const at::Tensor& ids, const at::Tensor& positions) {
  TORCH_CHECK(!positions.defined() || positions.sizes() == ids.sizes(), "llama: positions ", positions.sizes(),
              " do not match the ids ", ids.sizes());
  return head(hidden_states(embed(ids), positions));
}

at::Tensor LlamaImpl::forward(const at::Tensor& ids, const at::Tensor& targets, const ChunkedLoss& chunks,
                              const at::Tensor& positions) {
  TORCH_CHECK(!positions.defined() || positions.sizes() == ids.sizes(), "llama: positions ", positions.sizes(),
              " do not match the ids ", ids.sizes());
  return head(hidden_states(embed(ids), positions), targets, chunks);
}

// Embedding and head are called through fsdp::nn::call, so each may be a unit of its own.
at::Tensor LlamaImpl::embed(const at::Tensor& ids) { return fsdp::nn::call(embed_tokens, ids); }

at::Tensor LlamaImpl::logits_from_embeddings(const at::Tensor& embedded) { return head(hidden_states(embedded, {})); }

at::Tensor LlamaImpl::loss_from_embeddings(const at::Tensor& embedded, const at::Tensor& targets,
                                           const ChunkedLoss& chunks) {
  return head(hidden_states(embedded, {}), targets, chunks);
}

at::Tensor LlamaImpl::head(const at::Tensor& hidden) {
  return lm_head.is_empty() ? fsdp::nn::call(embed_tokens, hidden) : fsdp::nn::call(lm_head, hidden);
}

at::Tensor LlamaImpl::head(const at::Tensor& hidden, const at::Tensor& targets, const ChunkedLoss& chunks) {
  return lm_head.is_empty() ? fsdp::nn::call(embed_tokens, hidden, targets, chunks)
                            : fsdp::nn::call(lm_head, hidden, targets, chunks);
}

at::Tensor LlamaImpl::hidden_states(const at::Tensor& embedded, const at::Tensor& positions) {
  const int64_t t = embedded.size(1);
  TORCH_CHECK(t <= config_.context, "llama: sequence of ", t, " tokens exceeds the context of ", config_.context);
  if (rope_cos_.device() != embedded.device()) {
    // Once: the tables follow the inputs to their device (a copy per forward would block the host).
    rope_cos_ = rope_cos_.to(embedded.device());
    rope_sin_ = rope_sin_.to(embedded.device());
  }
  at::Tensor cos = rope_cos_.narrow(0, 0, t), sin = rope_sin_.narrow(0, 0, t), allowed;
  if (positions.defined()) {
    // Packed rows: each token's angles [b * t, hd] by its own position; attention within examples.
    const at::Tensor flat = positions.reshape(-1);
    cos = rope_cos_.index_select(0, flat);
    sin = rope_sin_.index_select(0, flat);
    allowed = document_causal_mask(positions);
  }
  if (config_.sliding_window > 0 && t > config_.sliding_window) {
    const at::Tensor window = sliding_window_mask(t, config_.sliding_window, embedded.device());  // [1, 1, t, t]
    allowed = allowed.defined() ? allowed.logical_and(window) : window;
  }
  at::Tensor x = embedded;
  for (size_t i = 0; i < layers->size(); ++i) x = fsdp::nn::call(layers->ptr<LlamaBlockImpl>(i), x, cos, sin, allowed);
  return norm(x);
}

}  // namespace fsdp::models
