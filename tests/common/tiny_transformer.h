// tests/common/tiny_transformer.h (a test model, not part of the library): a small GPT-style transformer: token and
// position embeddings, pre-norm blocks of causal self-attention and a GELU MLP, a final norm and an untied head. Used
// by the runtime's parity tests and the demo job. Plain libtorch code that knows nothing of sharding; its only
// concessions to wrapping are the two in fsdp/nn/hooks.h (push_block, call).
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "fsdp/nn/hooks.h"

namespace fsdp::models {

struct TinyConfig {
  int64_t vocab = 61;  // odd sizes: flat buffers need padding at 2, 3 and 4 ranks
  int64_t seq = 8;
  int64_t dim = 30;
  int64_t heads = 3;
  int64_t layers = 3;
  int64_t mlp = 4;  // hidden = mlp * dim
  bool freeze_first_block_attention = false;
  bool freeze_mlp_in_every_block = false;  // fc1 and fc2 frozen in every block (the LoRA case's mix)
  int64_t repeat_block = -1;               // this block runs twice in a row in forward (-1: none)
  bool reverse_blocks = false;             // blocks run last to first (a rank-dependent code path)
};

struct AttentionMlpBlockImpl : torch::nn::Module {
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
  int64_t heads;

  explicit AttentionMlpBlockImpl(const TinyConfig& c) : heads(c.heads) {
    norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
    // No qkv bias: the key bias cannot change a softmax, so its true gradient is 0 and what autograd
    // returns is rounding noise, which Adam's normalisation turns into full-size random steps.
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(c.dim, 3 * c.dim).bias(false)));
    proj = register_module("proj", torch::nn::Linear(c.dim, c.dim));
    norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
    fc1 = register_module("fc1", torch::nn::Linear(c.dim, c.mlp * c.dim));
    fc2 = register_module("fc2", torch::nn::Linear(c.mlp * c.dim, c.dim));
  }

  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
    auto q_k_v = qkv(norm1(x)).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});
    auto q = q_k_v[0], k = q_k_v[1], v = q_k_v[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto mask = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    // -inf, not -1e9: fp16 holds nothing beyond 65504 (softmax gives the masked scores 0 either way).
    scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
    auto attended = torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).reshape({b, t, d});
    x = x + proj(attended);
    return x + fc2(torch::gelu(fc1(norm2(x))));
  }
};
TORCH_MODULE(AttentionMlpBlock);

struct TinyTransformerImpl : torch::nn::Module {
  torch::nn::Embedding tokens{nullptr};
  torch::Tensor positions;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};

  int64_t repeat_block = -1;
  bool reverse_blocks = false;

  explicit TinyTransformerImpl(const TinyConfig& c) : repeat_block(c.repeat_block), reverse_blocks(c.reverse_blocks) {
    tokens = register_module("tokens", torch::nn::Embedding(c.vocab, c.dim));
    positions = register_parameter("positions", torch::randn({c.seq, c.dim}) * 0.02);
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      AttentionMlpBlock block(c);
      if (i == 0 && c.freeze_first_block_attention) {
        block->qkv->weight.set_requires_grad(false);
      }
      if (c.freeze_mlp_in_every_block) {
        for (auto& p : block->fc1->parameters()) p.set_requires_grad(false);
        for (auto& p : block->fc2->parameters()) p.set_requires_grad(false);
      }
      fsdp::nn::push_block(blocks, block);
    }
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
    head = register_module("head", torch::nn::Linear(c.dim, c.vocab));
  }

  // ids [batch, seq] int64 -> logits [batch, seq, vocab] fp32. skip_block: a block left unused.
  torch::Tensor forward(torch::Tensor ids, int64_t skip_block = -1) {
    auto x = tokens(ids) + positions.narrow(0, 0, ids.size(1));
    for (size_t k = 0; k < blocks->size(); ++k) {
      const size_t i = reverse_blocks ? blocks->size() - 1 - k : k;
      if (static_cast<int64_t>(i) == skip_block) continue;
      x = fsdp::nn::call(blocks->ptr<AttentionMlpBlockImpl>(i), x);
      if (static_cast<int64_t>(i) == repeat_block) x = fsdp::nn::call(blocks->ptr<AttentionMlpBlockImpl>(i), x);
    }
    return head(norm(x));
  }
};
TORCH_MODULE(TinyTransformer);

}  // namespace fsdp::models
