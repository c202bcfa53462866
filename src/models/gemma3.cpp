#include "fsdp/models/gemma3.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "fsdp/models/attention.h"
#include "fsdp/models/fused_ops.h"
#include "fsdp/nn/hooks.h"

namespace fsdp::models {

namespace {

// transformers' default and linear rope: angles = position * (1 / theta^(arange(0, hd, 2) / hd)) / factor,
// in fp32 -> cos, sin [t, hd] in the rotate-half layout.
std::pair<at::Tensor, at::Tensor> gemma_rotary_tables(int64_t t, int64_t head_dim, double theta, double factor) {
  auto exponents = torch::arange(0, head_dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(head_dim);
  auto inverse_frequency = 1.0 / torch::pow(theta, exponents);  // [hd/2] fp32
  if (factor != 1.0) inverse_frequency = inverse_frequency / factor;
  auto angles = torch::outer(torch::arange(t, torch::kFloat), inverse_frequency);  // [t, hd/2]
  angles = torch::cat({angles, angles}, 1);                                        // [t, hd]
  return {angles.cos(), angles.sin()};
}

}  // namespace

void Gemma3Config::validate() const {
  require_positive("gemma3", vocab, "vocab");
  require_positive("gemma3", context, "context");
  require_positive("gemma3", dim, "dim");
  require_positive("gemma3", heads, "heads");
  require_positive("gemma3", kv_heads, "kv_heads");
  require_positive("gemma3", head_dim, "head_dim");
  require_positive("gemma3", layers, "layers");
  require_positive("gemma3", ffn_hidden, "ffn_hidden");
  require_positive("gemma3", sliding_window, "sliding_window");
  require_positive("gemma3", sliding_window_pattern, "sliding_window_pattern");
  if (heads % kv_heads != 0) {
    throw std::invalid_argument("gemma3: heads " + std::to_string(heads) + " is not a multiple of kv_heads " +
                                std::to_string(kv_heads));
  }
  if (head_dim % 2 != 0) throw std::invalid_argument("gemma3: head_dim must be even for rotary embeddings");
  if (!(norm_eps > 0.0)) throw std::invalid_argument("gemma3: norm_eps must be positive");
  require_positive("gemma3", query_pre_attn_scalar, "query_pre_attn_scalar");
  if (!(rope_theta > 0.0) || !(rope_local_theta > 0.0))
    throw std::invalid_argument("gemma3: rope bases must be positive");
  if (!(rope_linear_factor >= 1.0)) throw std::invalid_argument("gemma3: rope_linear_factor must be at least 1");
  lora.validate("gemma3", linear_layers());
}

const std::vector<std::string>& Gemma3Config::linear_layers() { return gated_block_linear_layers(); }

int64_t Gemma3Config::linear_weight_count() const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  return layers * (2 * dim * q + 2 * dim * kv + 3 * dim * ffn_hidden);
}

int64_t Gemma3Config::parameter_count() const {
  const int64_t block = 4 * dim + 2 * head_dim;  // four norms, q_norm and k_norm
  return vocab * dim + layers * block + linear_weight_count() + dim;
}

int64_t Gemma3Config::lora_parameter_count() const {
  return gated_block_lora_parameters(lora, layers, dim, heads * head_dim, kv_heads * head_dim, ffn_hidden);
}

// Attention's two products per query cover the keys it may see: all earlier ones on a global
// layer, the window's on a local one.
double Gemma3Config::flops_per_token(int64_t seq) const {
  const double q = static_cast<double>(heads * head_dim);
  int64_t seen = 0;
  for (int64_t i = 0; i < layers; ++i) seen += is_global_layer(i) ? seq : std::min(seq, sliding_window);
  return 6.0 * (static_cast<double>(linear_weight_count()) + static_cast<double>(vocab) * dim) + 12.0 * seen * q;
}

Gemma3RMSNormImpl::Gemma3RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::zeros({dim}));
}

// transformers' Gemma3RMSNorm op for op: (x * w) in fp32, then cast (Llama casts before the scale).
at::Tensor Gemma3RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * (1.0 + weight.to(at::kFloat))).to(x.scalar_type());
}

Gemma3AttentionImpl::Gemma3AttentionImpl(const Gemma3Config& c)
    : heads(c.heads),
      kv_heads(c.kv_heads),
      head_dim(c.head_dim),
      query_scale(std::sqrt(static_cast<double>(c.head_dim) / static_cast<double>(c.query_pre_attn_scalar))) {
  q_proj = register_module("q_proj", AdaptedLinear(c.dim, heads * head_dim, /*bias=*/false));
  k_proj = register_module("k_proj", AdaptedLinear(c.dim, kv_heads * head_dim, /*bias=*/false));
  v_proj = register_module("v_proj", AdaptedLinear(c.dim, kv_heads * head_dim, /*bias=*/false));
  o_proj = register_module("o_proj", AdaptedLinear(heads * head_dim, c.dim, /*bias=*/false));
  q_norm = register_module("q_norm", Gemma3RMSNorm(head_dim, c.norm_eps));
  k_norm = register_module("k_norm", Gemma3RMSNorm(head_dim, c.norm_eps));
}

at::Tensor Gemma3AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                        const at::Tensor& allowed) {
  const int64_t b = x.size(0), t = x.size(1);
  auto rotate = [&](const at::Tensor& y) {  // y [b, t, n, hd]; per-token tables for packed rows
    if (cos.size(0) == t) return rotary(y, cos, sin);
    return rotary(y.reshape({1, b * t, y.size(2), head_dim}), cos, sin).view({b, t, y.size(2), head_dim});
  };
  // q, k, v: views of one product where the weights stack (layers.h).
  const auto qkv = projections(x, {q_proj.get(), k_proj.get(), v_proj.get()});
  auto q = rotate(q_norm(qkv[0].view({b, t, heads, head_dim}))).transpose(1, 2);  // [b, heads, t, hd]
  auto k = rotate(k_norm(qkv[1].view({b, t, kv_heads, head_dim}))).transpose(1, 2);
  auto v = qkv[2].contiguous().view({b, t, kv_heads, head_dim}).transpose(1, 2);  // as Llama's: its own buffer
  if (query_scale != 1.0) q = q * query_scale;  // attention() divides by sqrt(head_dim)
  auto y = attention(q, k, v, /*causal=*/!allowed.defined(), allowed);
  return o_proj(y.transpose(1, 2).reshape({b, t, heads * head_dim}));
}

Gemma3MlpImpl::Gemma3MlpImpl(const Gemma3Config& c) {
  gate_proj = register_module("gate_proj", AdaptedLinear(c.dim, c.ffn_hidden, /*bias=*/false));
  up_proj = register_module("up_proj", AdaptedLinear(c.dim, c.ffn_hidden, /*bias=*/false));
  down_proj = register_module("down_proj", AdaptedLinear(c.ffn_hidden, c.dim, /*bias=*/false));
}

at::Tensor Gemma3MlpImpl::forward(const at::Tensor& x) {
  const auto gate_up = projections(x, {gate_proj.get(), up_proj.get()});  // one GEMM where they stack
  return down_proj(at::gelu(gate_up[0], "tanh") * gate_up[1]);
}

Gemma3BlockImpl::Gemma3BlockImpl(const Gemma3Config& c) {
  input_layernorm = register_module("input_layernorm", Gemma3RMSNorm(c.dim, c.norm_eps));
  self_attn = register_module("self_attn", Gemma3Attention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", Gemma3RMSNorm(c.dim, c.norm_eps));
  pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", Gemma3RMSNorm(c.dim, c.norm_eps));
  mlp = register_module("mlp", Gemma3Mlp(c));
  post_feedforward_layernorm = register_module("post_feedforward_layernorm", Gemma3RMSNorm(c.dim, c.norm_eps));
  init_normal(*this, 0.02);  // norms keep their zeros (a scale of 1)
  apply_lora(*this, c.lora);
}

at::Tensor Gemma3BlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                    const at::Tensor& allowed) {
  const at::Tensor h = x + post_attention_layernorm(self_attn->forward(input_layernorm(x), cos, sin, allowed));
  return h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
}

Gemma3Impl::Gemma3Impl(const Gemma3Config& c) : config_(c) {
  c.validate();
  // The embedding (also the head: tied) is finished and announced before the blocks are built, so
  // a wrapper sharding it as a unit never holds it whole beside them (Gemma 3's is 262 k rows).
  embed_tokens = register_module("embed_tokens", TokenEmbedding(c.vocab, c.dim));
  {
    torch::NoGradGuard no_grad;
    embed_tokens->weight.normal_(0.0, 0.02);
  }
  if (c.lora.enabled()) embed_tokens->weight.set_requires_grad(false);  // base, as the blocks froze theirs
  fsdp::nn::announce_built(embed_tokens.ptr(), "embed_tokens");
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) fsdp::nn::push_block(layers, Gemma3Block(c));
  norm = register_module("norm", Gemma3RMSNorm(c.dim, c.norm_eps));
  if (c.lora.enabled()) {
    for (auto& p : norm->parameters()) p.set_requires_grad(false);
  }
  std::tie(global_cos_, global_sin_) = gemma_rotary_tables(c.context, c.head_dim, c.rope_theta, c.rope_linear_factor);
  std::tie(local_cos_, local_sin_) = gemma_rotary_tables(c.context, c.head_dim, c.rope_local_theta, 1.0);
}

at::Tensor Gemma3Impl::forward(const at::Tensor& ids, const at::Tensor& positions) {
  return fsdp::nn::call(embed_tokens, hidden_states(ids, positions));
}

at::Tensor Gemma3Impl::forward(const at::Tensor& ids, const at::Tensor& targets, const ChunkedLoss& chunks,
                               const at::Tensor& positions) {
  return fsdp::nn::call(embed_tokens, hidden_states(ids, positions), targets, chunks);
}

at::Tensor Gemma3Impl::hidden_states(const at::Tensor& ids, const at::Tensor& positions) {
  const int64_t t = ids.size(1);
  TORCH_CHECK(t <= config_.context, "gemma3: sequence of ", t, " tokens exceeds the context of ", config_.context);
  TORCH_CHECK(!positions.defined() || positions.sizes() == ids.sizes(), "gemma3: positions ", positions.sizes(),
              " do not match the ids ", ids.sizes());
  at::Tensor x = fsdp::nn::call(embed_tokens, ids);  // [b, t, dim]
  // sqrt(dim) rounded to the embedding's dtype first, as Gemma3TextScaledWordEmbedding does.
  x = x *
      at::scalar_tensor(std::sqrt(static_cast<double>(config_.dim)), x.options().dtype(at::kFloat)).to(x.scalar_type());
  if (global_cos_.device() != x.device()) {
    for (at::Tensor* table : {&global_cos_, &global_sin_, &local_cos_, &local_sin_}) *table = table->to(x.device());
  }
  auto angles = [&](const at::Tensor& table) {
    return positions.defined() ? table.index_select(0, positions.reshape(-1)) : table.narrow(0, 0, t);
  };
  const at::Tensor global_cos = angles(global_cos_), global_sin = angles(global_sin_);
  const at::Tensor local_cos = angles(local_cos_), local_sin = angles(local_sin_);
  const at::Tensor global_allowed = positions.defined() ? document_causal_mask(positions) : at::Tensor();
  at::Tensor local_allowed = global_allowed;
  if (t > config_.sliding_window) {
    const at::Tensor window = sliding_window_mask(t, config_.sliding_window, x.device());  // [1, 1, t, t]
    local_allowed = global_allowed.defined() ? global_allowed.logical_and(window) : window;
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    const bool global = config_.is_global_layer(static_cast<int64_t>(i));
    x = fsdp::nn::call(layers->ptr<Gemma3BlockImpl>(i), x, global ? global_cos : local_cos,
                       global ? global_sin : local_sin, global ? global_allowed : local_allowed);
  }
  return norm(x);
}

}  // namespace fsdp::models
