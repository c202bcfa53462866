// fsdp/models/vit.h: the Vision Transformer (Dosovitskiy et al. 2021) as timm writes it: a
// convolutional patch embedding, a class token, learned position embeddings, pre-norm blocks of
// (non-causal) self-attention and a GELU MLP, a final LayerNorm and a linear classification head
// on the class token. Module names follow timm's (patch_embed.proj, cls_token, pos_embed,
// blocks.<i>.attn.qkv, ..., head).
// Initialisation: weights, class token and position embeddings normal(0, 0.02), biases zero.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

namespace fsdp::models {

class ModelFamily;

struct VitConfig {
  int64_t image_size = 224;
  int64_t patch = 16;
  int64_t channels = 3;
  int64_t classes = 1000;
  int64_t dim = 768;
  int64_t heads = 12;
  int64_t layers = 12;
  int64_t mlp_hidden = 3072;

  static const ModelFamily& family();  // its spec (vit_family.cpp)
  void validate() const;               // throws std::invalid_argument naming the bad field
  int64_t patches() const { return (image_size / patch) * (image_size / patch); }
  int64_t tokens() const { return patches() + 1; }
  int64_t parameter_count() const;
  // Training FLOPs (forward + backward) per image: 6 per weight per token of every matmul (the patch
  // embedding per patch, the head once) plus 12 * layers * tokens^2 * dim for attention.
  double flops_per_image() const;
};

struct VitAttentionImpl : torch::nn::Module {
  explicit VitAttentionImpl(const VitConfig& config);
  at::Tensor forward(const at::Tensor& x);  // [b, t, dim] -> [b, t, dim]
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  int64_t heads;
};
TORCH_MODULE(VitAttention);

struct VitMlpImpl : torch::nn::Module {
  explicit VitMlpImpl(const VitConfig& config);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(VitMlp);

// One encoder block: the FSDP unit (wrap policy module type "VitBlock").
struct VitBlockImpl : torch::nn::Module {
  explicit VitBlockImpl(const VitConfig& config);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  VitAttention attn{nullptr};
  VitMlp mlp{nullptr};
};
TORCH_MODULE(VitBlock);

struct VitImpl : torch::nn::Module {
  explicit VitImpl(const VitConfig& config);
  // images [b, channels, image_size, image_size] fp32 -> logits [b, classes] fp32.
  at::Tensor forward(const at::Tensor& images);
  // images [b, channels, size, size] (any float dtype) -> [b, patches, dim] in the weights' dtype:
  // the patch embedding's convolution, computed as a GEMM over the patches.
  at::Tensor embed_patches(const at::Tensor& images);
  const VitConfig& config() const { return config_; }

  torch::nn::Conv2d patch_embed{nullptr};  // named patch_embed.proj as in timm
  at::Tensor cls_token;                    // [1, 1, dim]
  at::Tensor pos_embed;                    // [1, tokens, dim]
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  VitConfig config_;
};
TORCH_MODULE(Vit);

}  // namespace fsdp::models
