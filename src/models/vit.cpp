#include "fsdp/models/vit.h"

#include <torch/torch.h>

#include <stdexcept>

#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/layers.h"
#include "fsdp/nn/hooks.h"

namespace fsdp::models {

void VitConfig::validate() const {
  require_positive("vit", image_size, "image_size");
  require_positive("vit", patch, "patch");
  require_positive("vit", channels, "channels");
  require_positive("vit", classes, "classes");
  require_positive("vit", dim, "dim");
  require_positive("vit", heads, "heads");
  require_positive("vit", layers, "layers");
  require_positive("vit", mlp_hidden, "mlp_hidden");
  if (image_size % patch != 0) {
    throw std::invalid_argument("vit: image_size " + std::to_string(image_size) + " is not divisible by patch " +
                                std::to_string(patch));
  }
  if (dim % heads != 0) {
    throw std::invalid_argument("vit: dim " + std::to_string(dim) + " is not divisible by heads " +
                                std::to_string(heads));
  }
}

int64_t VitConfig::parameter_count() const {
  const int64_t block = 2 * (2 * dim) + dim * 3 * dim + 3 * dim + dim * dim + dim + dim * mlp_hidden + mlp_hidden +
                        mlp_hidden * dim + dim;
  return dim * channels * patch * patch + dim  // patch embedding
         + dim + tokens() * dim                // class token, position embeddings
         + layers * block + 2 * dim            // blocks, final norm
         + dim * classes + classes;            // head
}

double VitConfig::flops_per_image() const {
  const double t = static_cast<double>(tokens());
  const double per_block = 4.0 * dim * dim + 2.0 * dim * mlp_hidden;
  const double weights_x_tokens = t * layers * per_block +
                                  static_cast<double>(patches()) * dim * channels * patch * patch +
                                  static_cast<double>(dim) * classes;
  return 6.0 * weights_x_tokens + 12.0 * layers * t * t * dim;
}

VitAttentionImpl::VitAttentionImpl(const VitConfig& c) : heads(c.heads) {
  qkv = register_module("qkv", torch::nn::Linear(c.dim, 3 * c.dim));
  proj = register_module("proj", torch::nn::Linear(c.dim, c.dim));
}

at::Tensor VitAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  auto q_k_v = models::linear(x, qkv->weight, qkv->bias).view({b, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
  auto y = attention(q_k_v[0], q_k_v[1], q_k_v[2], /*causal=*/false);
  return models::linear(y.transpose(1, 2).reshape({b, t, d}), proj->weight, proj->bias);
}

VitMlpImpl::VitMlpImpl(const VitConfig& c) {
  fc1 = register_module("fc1", torch::nn::Linear(c.dim, c.mlp_hidden));
  fc2 = register_module("fc2", torch::nn::Linear(c.mlp_hidden, c.dim));
}

at::Tensor VitMlpImpl::forward(const at::Tensor& x) {
  return models::linear(torch::gelu(models::linear(x, fc1->weight, fc1->bias)), fc2->weight, fc2->bias);
}

VitBlockImpl::VitBlockImpl(const VitConfig& c) {
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(1e-6)));
  attn = register_module("attn", VitAttention(c));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(1e-6)));
  mlp = register_module("mlp", VitMlp(c));
  init_normal(*this, 0.02);
}

at::Tensor VitBlockImpl::forward(const at::Tensor& x) {
  auto h = x + attn(norm1(x));
  return h + mlp(norm2(h));
}

VitImpl::VitImpl(const VitConfig& c) : config_(c) {
  c.validate();
  auto patch_holder = std::make_shared<torch::nn::Module>("PatchEmbed");
  patch_embed = torch::nn::Conv2d(torch::nn::Conv2dOptions(c.channels, c.dim, c.patch).stride(c.patch));
  patch_holder->register_module("proj", patch_embed);
  register_module("patch_embed", patch_holder);
  cls_token = register_parameter("cls_token", torch::zeros({1, 1, c.dim}));
  pos_embed = register_parameter("pos_embed", torch::zeros({1, c.tokens(), c.dim}));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) fsdp::nn::push_block(blocks, VitBlock(c));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(1e-6)));
  head = register_module("head", torch::nn::Linear(c.dim, c.classes));
  torch::NoGradGuard no_grad;
  patch_embed->weight.normal_(0.0, 0.02);
  patch_embed->bias.zero_();
  cls_token.normal_(0.0, 0.02);
  pos_embed.normal_(0.0, 0.02);
  head->weight.normal_(0.0, 0.02);
  head->bias.zero_();
}

at::Tensor VitImpl::embed_patches(const at::Tensor& images) {
  // The patch embedding is a convolution whose stride is its kernel: each patch's pixels times the
  // kernel, a GEMM over [b * patches, channels * patch * patch]. Computed as that GEMM, the same
  // function up to the order of summation, because libtorch's CPU convolution backward in fp16 is a
  // slow fallback (70 of a 199 ms ViT step on the AVX2 VM, 2026-12-03), and GEMMs follow
  // models::linear's choices in every dtype. The weight keeps the convolution's shape and name
  // (timm's patch_embed.proj.weight [dim, channels, patch, patch]).
  const int64_t b = images.size(0), c = config_.channels, p = config_.patch, side = config_.image_size / p;
  // Images arrive as float32; the model may compute in another dtype (mixed precision).
  const at::Tensor pixels = images.to(patch_embed->weight.scalar_type())
                                .reshape({b, c, side, p, side, p})
                                .permute({0, 2, 4, 1, 3, 5})  // [b, row, column, channel, y, x]
                                .reshape({b, side * side, c * p * p});
  return models::linear(pixels, patch_embed->weight.reshape({config_.dim, c * p * p}), patch_embed->bias);
}

at::Tensor VitImpl::forward(const at::Tensor& images) {
  TORCH_CHECK(images.dim() == 4 && images.size(1) == config_.channels && images.size(2) == config_.image_size &&
                  images.size(3) == config_.image_size,
              "vit: expected images [b, ", config_.channels, ", ", config_.image_size, ", ", config_.image_size,
              "], got ", images.sizes());
  const int64_t b = images.size(0);
  auto patches = embed_patches(images);  // [b, patches, dim]
  auto x = torch::cat({cls_token.expand({b, 1, config_.dim}), patches}, 1) + pos_embed;
  for (size_t i = 0; i < blocks->size(); ++i) x = fsdp::nn::call(blocks->ptr<VitBlockImpl>(i), x);
  return models::linear(norm(x).select(1, 0), head->weight, head->bias);
}

}  // namespace fsdp::models
