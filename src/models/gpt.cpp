#include "fsdp/models/gpt.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "fsdp/models/attention.h"
#include "fsdp/models/layers.h"
#include "fsdp/nn/hooks.h"

namespace fsdp::models {

void GptConfig::validate() const {
  require_positive("gpt", vocab, "vocab");
  require_positive("gpt", context, "context");
  require_positive("gpt", dim, "dim");
  require_positive("gpt", heads, "heads");
  require_positive("gpt", layers, "layers");
  if (dim % heads != 0) {
    throw std::invalid_argument("gpt: dim " + std::to_string(dim) + " is not divisible by heads " +
                                std::to_string(heads));
  }
  if (!(norm_eps > 0.0)) throw std::invalid_argument("gpt: norm_eps must be positive");
  lora.validate("gpt", linear_layers());
  if (dropout < 0.0 || dropout >= 1.0) throw std::invalid_argument("gpt: dropout must be in [0, 1)");
}

const std::vector<std::string>& GptConfig::linear_layers() {
  static const std::vector<std::string> names = {"c_attn", "c_proj", "c_fc"};
  return names;
}

int64_t GptConfig::parameter_count() const {
  const int64_t bias = qkv_bias ? 3 * dim : 0;
  const int64_t m = mlp_width();
  const int64_t block = 2 * (2 * dim)                             // ln_1, ln_2 (weight and bias)
                        + dim * 3 * dim + bias                    // c_attn
                        + dim * dim + dim                         // attn.c_proj
                        + dim * m + m                             // mlp.c_fc
                        + m * dim + dim;                          // mlp.c_proj
  return vocab * dim + context * dim + layers * block + 2 * dim;  // tied head adds nothing
}

int64_t GptConfig::linear_weight_count() const { return layers * (dim * 3 * dim + dim * dim + 2 * dim * mlp_width()); }

int64_t GptConfig::lora_parameter_count() const {
  if (!lora.enabled()) return 0;
  const int64_t m = mlp_width();
  int64_t per_layer = 0;
  if (lora.targets_layer("c_attn")) per_layer += lora.rank * (dim + 3 * dim);
  if (lora.targets_layer("c_proj")) per_layer += lora.rank * (dim + dim) + lora.rank * (m + dim);  // attention's, MLP's
  if (lora.targets_layer("c_fc")) per_layer += lora.rank * (dim + m);
  return layers * per_layer;
}

double GptConfig::flops_per_token(int64_t seq) const {
  const double matmul_weights =
      static_cast<double>(layers) * (4.0 * dim * dim + 2.0 * dim * mlp_width()) + static_cast<double>(vocab) * dim;
  return 6.0 * matmul_weights + 12.0 * layers * seq * dim;
}

GptAttentionImpl::GptAttentionImpl(const GptConfig& c) : heads(c.heads) {
  c_attn = register_module("c_attn", AdaptedLinear(c.dim, 3 * c.dim, c.qkv_bias));
  c_proj = register_module("c_proj", AdaptedLinear(c.dim, c.dim, /*bias=*/true));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(c.dropout));
}

at::Tensor GptAttentionImpl::forward(const at::Tensor& x, const at::Tensor& allowed) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  // [b, t, 3 * dim] -> three [b, heads, t, head_dim]
  auto qkv = c_attn(x).view({b, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
  auto y = attention(qkv[0], qkv[1], qkv[2], /*causal=*/!allowed.defined(), allowed);
  return resid_dropout(c_proj(y.transpose(1, 2).reshape({b, t, d})));
}

GptMlpImpl::GptMlpImpl(const GptConfig& c) {
  c_fc = register_module("c_fc", AdaptedLinear(c.dim, c.mlp_width(), /*bias=*/true));
  c_proj = register_module("c_proj", AdaptedLinear(c.mlp_width(), c.dim, /*bias=*/true));
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
}

at::Tensor GptMlpImpl::forward(const at::Tensor& x) {
  // GPT-2's GELU is the tanh approximation.
  return dropout(c_proj(torch::gelu(c_fc(x), "tanh")));
}

GptBlockImpl::GptBlockImpl(const GptConfig& c) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(c.norm_eps)));
  attn = register_module("attn", GptAttention(c));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(c.norm_eps)));
  mlp = register_module("mlp", GptMlp(c));
  init_normal(*this, 0.02);
  // Residual projections: each block adds two contributions to the residual stream, so their
  // variance is scaled down with depth (GPT-2 paper, section 2.3).
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  attn->c_proj->weight.normal_(0.0, residual_std);
  mlp->c_proj->weight.normal_(0.0, residual_std);
  apply_lora(*this, c.lora);  // after the base's draws; before the block is announced (and sharded)
}

at::Tensor GptBlockImpl::forward(const at::Tensor& x, const at::Tensor& allowed) {
  auto h1 = x + attn(ln_1(x), allowed);
  return h1 + mlp(ln_2(h1));
}

GptImpl::GptImpl(const GptConfig& c) : config_(c) {
  c.validate();
  wte = register_module("wte", TokenEmbedding(c.vocab, c.dim));
  wpe = register_module("wpe", torch::nn::Embedding(c.context, c.dim));
  drop = register_module("drop", torch::nn::Dropout(c.dropout));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) fsdp::nn::push_block(h, GptBlock(c));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(c.norm_eps)));
  torch::NoGradGuard no_grad;
  wte->weight.normal_(0.0, 0.02);
  wpe->weight.normal_(0.0, 0.02);
  if (c.lora.enabled()) {
    // The embeddings and the final norm are base too: frozen (the blocks froze theirs).
    for (auto* m : std::initializer_list<torch::nn::Module*>{wte.get(), wpe.get(), ln_f.get()}) {
      for (auto& p : m->parameters()) p.set_requires_grad(false);
    }
  }
}

at::Tensor GptImpl::forward(const at::Tensor& ids, const at::Tensor& positions) {
  return fsdp::nn::call(wte, hidden_states(ids, positions));  // tied head: logits = ln_f(x) wte^T
}

at::Tensor GptImpl::forward(const at::Tensor& ids, const at::Tensor& targets, const ChunkedLoss& chunks,
                            const at::Tensor& positions) {
  return fsdp::nn::call(wte, hidden_states(ids, positions), targets, chunks);
}

at::Tensor GptImpl::hidden_states(const at::Tensor& ids, const at::Tensor& positions) {
  const int64_t t = ids.size(1);
  TORCH_CHECK(t <= config_.context, "gpt: sequence of ", t, " tokens exceeds the context of ", config_.context);
  TORCH_CHECK(!positions.defined() || positions.sizes() == ids.sizes(), "gpt: positions ", positions.sizes(),
              " do not match the ids ", ids.sizes());
  // Packed rows: each token's own position (wpe [b, t, dim]), attention within examples.
  const at::Tensor allowed = positions.defined() ? document_causal_mask(positions) : at::Tensor();
  const at::Tensor where = positions.defined() ? positions : torch::arange(t, ids.options().dtype(torch::kLong));
  // wte is called through fsdp::nn::call for both its uses, so it may be a unit of its own.
  auto x = drop(fsdp::nn::call(wte, ids) + wpe(where));
  for (size_t i = 0; i < h->size(); ++i) x = fsdp::nn::call(h->ptr<GptBlockImpl>(i), x, allowed);
  return ln_f(x);
}

}  // namespace fsdp::models
