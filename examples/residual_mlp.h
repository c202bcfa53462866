// examples/residual_mlp.h: the user's own model for the examples: plain libtorch, nothing from
// fsdp.cpp's model zoo. A residual MLP: an input projection, blocks of LayerNorm -> Linear -> GELU
// -> Linear with a residual, a final LayerNorm and a one-output head, for a regression task.
//
// The whole contract with fsdp.cpp is two lines (fsdp/nn/hooks.h):
//   fsdp::nn::push_block(blocks, ResidualBlock(dim));        // in the constructor
//   h = fsdp::nn::call(blocks->ptr<ResidualBlockImpl>(i), h);  // in forward
// Forget the second and the block runs on sharded, freed parameters: the forward throws a
// std::logic_error naming the unit ("unit 'blocks.1' ... called it directly ... instead of through
// fsdp::nn::call"). Forget the first and the block is still a unit when wrapped with fully_shard
// by type (as here), but cannot be sharded while the model is built (build_fully_sharded), nor
// chosen by a size-based policy.
#pragma once

#include <fsdp/nn/hooks.h>
#include <torch/torch.h>

struct ResidualBlockImpl : torch::nn::Module {
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
  explicit ResidualBlockImpl(int64_t dim) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    up = register_module("up", torch::nn::Linear(dim, 4 * dim));
    down = register_module("down", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::gelu(up(norm(x)))); }
};
TORCH_MODULE(ResidualBlock);

struct ResidualMlpImpl : torch::nn::Module {
  torch::nn::Linear input{nullptr}, head{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm{nullptr};
  ResidualMlpImpl(int64_t features, int64_t dim, int64_t layers) {
    input = register_module("input", torch::nn::Linear(features, dim));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) fsdp::nn::push_block(blocks, ResidualBlock(dim));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    head = register_module("head", torch::nn::Linear(dim, 1));
  }
  // x [batch, features] fp32 -> [batch, 1] in the parameters' dtype. Under bf16 mixed precision
  // the parameters are bf16 tensors while they compute, so float inputs are cast to their dtype.
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = input(x.to(input->weight.scalar_type()));
    for (size_t i = 0; i < blocks->size(); ++i) h = fsdp::nn::call(blocks->ptr<ResidualBlockImpl>(i), h);
    return head(norm(h));
  }
};
TORCH_MODULE(ResidualMlp);

// Global batch of step `step`: the same on every rank and in one process (a per-step seed).
// Inputs [rows, 8] standard normal; target sin(sum of inputs) [rows, 1].
inline std::pair<torch::Tensor, torch::Tensor> batch_of_step(int step, int64_t rows) {
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step));
  torch::Tensor x = at::randn({rows, 8}, generator);
  return {x, torch::sin(x.sum(1, /*keepdim=*/true))};
}
