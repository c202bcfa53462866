#include "fsdp/models/clip.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "fsdp/models/attention.h"
#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/layers.h"
#include "fsdp/nn/hooks.h"

namespace fsdp::models {

namespace {

void validate_tower(const ClipTowerShape& s, const char* tower) {
  const std::string prefix = std::string("clip ") + tower;
  require_positive(prefix.c_str(), s.dim, "dim");
  require_positive(prefix.c_str(), s.heads, "heads");
  require_positive(prefix.c_str(), s.layers, "layers");
  require_positive(prefix.c_str(), s.mlp_hidden, "mlp_hidden");
  if (s.dim % s.heads != 0) {
    throw std::invalid_argument(prefix + ": dim " + std::to_string(s.dim) + " is not divisible by heads " +
                                std::to_string(s.heads));
  }
}

// Weights of one block: attention's four projections with biases, two LayerNorms, the MLP.
int64_t block_parameters(const ClipTowerShape& s) {
  return 4 * (s.dim * s.dim + s.dim) + 2 * 2 * s.dim + s.dim * s.mlp_hidden + s.mlp_hidden + s.mlp_hidden * s.dim +
         s.dim;
}

double tower_flops(const ClipTowerShape& s, double tokens) {
  const double per_block = 4.0 * s.dim * s.dim + 2.0 * s.dim * s.mlp_hidden;
  return 6.0 * tokens * s.layers * per_block + 12.0 * s.layers * tokens * tokens * s.dim;
}

// transformers' "quick_gelu", OpenAI CLIP's activation: x * sigmoid(1.702 x).
at::Tensor quick_gelu(const at::Tensor& x) { return x * torch::sigmoid(1.702 * x); }

torch::nn::LayerNorm layer_norm(int64_t dim, double eps) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(eps));
}

void freeze(torch::nn::Module& module) {
  for (auto& p : module.parameters()) p.set_requires_grad(false);
}

}  // namespace

void ClipConfig::validate() const {
  require_positive("clip", image_size, "image_size");
  require_positive("clip", patch, "patch");
  require_positive("clip", channels, "channels");
  require_positive("clip", vocab, "vocab");
  require_positive("clip", context, "context");
  require_positive("clip", projection_dim, "projection_dim");
  if (image_size % patch != 0) {
    throw std::invalid_argument("clip: image_size " + std::to_string(image_size) + " is not divisible by patch " +
                                std::to_string(patch));
  }
  if (eos_token < 0 || eos_token >= vocab) {
    throw std::invalid_argument("clip: eos_token " + std::to_string(eos_token) + " is outside the vocabulary [0, " +
                                std::to_string(vocab) + ")");
  }
  validate_tower(vision, "vision");
  validate_tower(text, "text");
  lora.validate("clip", linear_layers());
  if (lora.enabled() && freeze_vision && freeze_text) {
    throw std::invalid_argument(
        "clip: LoRA adapters go into the towers that are not frozen, and both are (model.freeze_vision, "
        "model.freeze_text)");
  }
}

const std::vector<std::string>& ClipConfig::linear_layers() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"};
  return names;
}

int64_t ClipConfig::lora_parameter_count() const {
  if (!lora.enabled()) return 0;
  auto tower = [&](const ClipTowerShape& t) {
    int64_t per_layer = 0;
    for (const char* name : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      if (lora.targets_layer(name)) per_layer += lora.rank * 2 * t.dim;
    }
    if (lora.targets_layer("fc1")) per_layer += lora.rank * (t.dim + t.mlp_hidden);
    if (lora.targets_layer("fc2")) per_layer += lora.rank * (t.mlp_hidden + t.dim);
    return t.layers * per_layer;
  };
  return (freeze_vision ? 0 : tower(vision)) + (freeze_text ? 0 : tower(text));
}

int64_t ClipConfig::vision_tower_parameter_count() const {
  return vision.dim                                   // class embedding
         + vision.dim * channels * patch * patch      // patch embedding (no bias)
         + image_tokens() * vision.dim                // position embedding
         + 2 * 2 * vision.dim                         // pre_layrnorm, post_layernorm
         + vision.layers * block_parameters(vision);  // blocks
}

int64_t ClipConfig::parameter_count() const {
  const int64_t text_tower = vocab * text.dim + context * text.dim  // token and position embeddings
                             + 2 * text.dim                         // final_layer_norm
                             + text.layers * block_parameters(text);
  return vision_tower_parameter_count() + text_tower + projection_dim * (vision.dim + text.dim) +
         1;  // projections, logit_scale
}

double ClipConfig::flops_per_pair() const {
  const double image_tokens_d = static_cast<double>(image_tokens());
  const double text_tokens = static_cast<double>(context);
  return tower_flops(vision, image_tokens_d) + tower_flops(text, text_tokens) +
         6.0 * static_cast<double>(patches()) * vision.dim * channels * patch * patch +
         6.0 * projection_dim * static_cast<double>(vision.dim + text.dim);
}

ClipAttentionImpl::ClipAttentionImpl(const ClipTowerShape& s, bool causal_attention)
    : heads(s.heads), causal(causal_attention) {
  q_proj = register_module("q_proj", AdaptedLinear(s.dim, s.dim, /*bias=*/true));
  k_proj = register_module("k_proj", AdaptedLinear(s.dim, s.dim, /*bias=*/true));
  v_proj = register_module("v_proj", AdaptedLinear(s.dim, s.dim, /*bias=*/true));
  out_proj = register_module("out_proj", AdaptedLinear(s.dim, s.dim, /*bias=*/true));
}

at::Tensor ClipAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  auto split_heads = [&](AdaptedLinear& proj) {
    return proj(x).view({b, t, heads, d / heads}).transpose(1, 2);  // [b, h, t, hd]
  };
  at::Tensor y = attention(split_heads(q_proj), split_heads(k_proj), split_heads(v_proj), causal);
  return out_proj(y.transpose(1, 2).reshape({b, t, d}));
}

ClipMlpImpl::ClipMlpImpl(const ClipTowerShape& s) {
  fc1 = register_module("fc1", AdaptedLinear(s.dim, s.mlp_hidden, /*bias=*/true));
  fc2 = register_module("fc2", AdaptedLinear(s.mlp_hidden, s.dim, /*bias=*/true));
}

at::Tensor ClipMlpImpl::forward(const at::Tensor& x) { return fc2(quick_gelu(fc1(x))); }

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const ClipTowerShape& s, double norm_eps, bool causal, bool frozen,
                                           const LoraSpec& lora) {
  self_attn = register_module("self_attn", ClipAttention(s, causal));
  layer_norm1 = register_module("layer_norm1", layer_norm(s.dim, norm_eps));
  mlp = register_module("mlp", ClipMlp(s));
  layer_norm2 = register_module("layer_norm2", layer_norm(s.dim, norm_eps));
  init_normal(*this, 0.02);
  if (frozen) freeze(*this);
  else apply_lora(*this, lora);  // after the base's draws; before the block is announced (and sharded)
}

at::Tensor ClipEncoderLayerImpl::forward(const at::Tensor& x) {
  at::Tensor h = x + self_attn(layer_norm1(x));
  return h + mlp(layer_norm2(h));
}

ClipTextEmbeddingsImpl::ClipTextEmbeddingsImpl(const ClipConfig& c) {
  token_embedding = register_module("token_embedding", torch::nn::Embedding(c.vocab, c.text.dim));
  position_embedding = register_module("position_embedding", torch::nn::Embedding(c.context, c.text.dim));
  init_normal(*this, 0.02);
}

at::Tensor ClipTextEmbeddingsImpl::forward(const at::Tensor& ids) {
  const int64_t t = ids.size(1);
  TORCH_CHECK(t <= position_embedding->weight.size(0), "clip: captions of ", t, " tokens exceed the text context of ",
              position_embedding->weight.size(0));
  return token_embedding(ids) + position_embedding->weight.narrow(0, 0, t).unsqueeze(0);
}

ClipVisionEmbeddingsImpl::ClipVisionEmbeddingsImpl(const ClipConfig& c) : config(c) {
  class_embedding = register_parameter("class_embedding", torch::empty({c.vision.dim}));
  patch_embedding = register_module(
      "patch_embedding",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(c.channels, c.vision.dim, c.patch).stride(c.patch).bias(false)));
  position_embedding = register_module("position_embedding", torch::nn::Embedding(c.image_tokens(), c.vision.dim));
  torch::NoGradGuard no_grad;
  class_embedding.normal_(0.0, 0.02);
  patch_embedding->weight.normal_(0.0, 0.02);
  position_embedding->weight.normal_(0.0, 0.02);
}

at::Tensor ClipVisionEmbeddingsImpl::forward(const at::Tensor& images) {
  // The strided convolution as one GEMM over the patches (see VitImpl::embed_patches: the same
  // function up to summation order, and the GEMM follows models::linear's choices in every dtype).
  const int64_t b = images.size(0), c = config.channels, p = config.patch, side = config.image_size / p,
                dim = config.vision.dim;
  const at::Tensor pixels = images.to(patch_embedding->weight.scalar_type())
                                .reshape({b, c, side, p, side, p})
                                .permute({0, 2, 4, 1, 3, 5})  // [b, row, column, channel, y, x]
                                .reshape({b, side * side, c * p * p});
  const at::Tensor patches = models::linear(pixels, patch_embedding->weight.reshape({dim, c * p * p}));
  return torch::cat({class_embedding.view({1, 1, dim}).expand({b, 1, dim}), patches}, 1) +
         position_embedding->weight.unsqueeze(0);
}

ClipTextTransformerImpl::ClipTextTransformerImpl(const ClipConfig& c) : eos_token(c.eos_token) {
  embeddings = register_module("embeddings", ClipTextEmbeddings(c));
  auto encoder = std::make_shared<torch::nn::Module>("ClipEncoder");
  layers = encoder->register_module("layers", torch::nn::ModuleList());
  register_module("encoder", encoder);
  const bool frozen_base = c.freeze_text || c.lora.enabled();  // with adapters, all but the adapters is frozen
  if (frozen_base) freeze(*embeddings);
  for (int64_t i = 0; i < c.text.layers; ++i) {
    fsdp::nn::push_block(layers, ClipEncoderLayer(c.text, c.norm_eps, /*causal=*/true, c.freeze_text, c.lora));
  }
  final_layer_norm = register_module("final_layer_norm", layer_norm(c.text.dim, c.norm_eps));
  if (frozen_base) freeze(*final_layer_norm);
}

at::Tensor ClipTextTransformerImpl::forward(const at::Tensor& ids) {
  at::Tensor x = fsdp::nn::call(embeddings, ids);
  for (size_t i = 0; i < layers->size(); ++i) x = fsdp::nn::call(layers->ptr<ClipEncoderLayerImpl>(i), x);
  x = final_layer_norm(x);
  // transformers: the first eos_token of each caption (argmax of a 0/1 row picks the first 1; a
  // caption without one is read at position 0, as there).
  const at::Tensor eos_position = ids.eq(eos_token).to(at::kInt).argmax(1);  // [b]
  return x.index({torch::arange(ids.size(0), ids.options()), eos_position});
}

ClipVisionTransformerImpl::ClipVisionTransformerImpl(const ClipConfig& c, int64_t read_blocks) {
  const int64_t trained_blocks = read_blocks < 0 ? c.vision.layers : read_blocks;
  embeddings = register_module("embeddings", ClipVisionEmbeddings(c));
  pre_layrnorm = register_module("pre_layrnorm", layer_norm(c.vision.dim, c.norm_eps));
  const bool frozen_base = c.freeze_vision || c.lora.enabled();  // with adapters, all but the adapters is frozen
  if (frozen_base) {
    freeze(*embeddings);
    freeze(*pre_layrnorm);
  }
  auto encoder = std::make_shared<torch::nn::Module>("ClipEncoder");
  layers = encoder->register_module("layers", torch::nn::ModuleList());
  register_module("encoder", encoder);
  for (int64_t i = 0; i < c.vision.layers; ++i) {
    fsdp::nn::push_block(layers, ClipEncoderLayer(c.vision, c.norm_eps, /*causal=*/false,
                                                  c.freeze_vision || i >= trained_blocks, c.lora));
  }
  post_layernorm = register_module("post_layernorm", layer_norm(c.vision.dim, c.norm_eps));
  if (frozen_base || read_blocks >= 0) freeze(*post_layernorm);
}

at::Tensor ClipVisionTransformerImpl::forward(const at::Tensor& images, int64_t blocks) {
  TORCH_CHECK(blocks >= 0 && blocks <= static_cast<int64_t>(layers->size()), "clip vision: hidden_states after ",
              blocks, " blocks of ", layers->size());
  at::Tensor x = pre_layrnorm(fsdp::nn::call(embeddings, images));
  for (int64_t i = 0; i < blocks; ++i) x = fsdp::nn::call(layers->ptr<ClipEncoderLayerImpl>(i), x);
  return x;
}

at::Tensor ClipVisionTransformerImpl::forward(const at::Tensor& images) {
  at::Tensor x = pre_layrnorm(fsdp::nn::call(embeddings, images));
  for (size_t i = 0; i < layers->size(); ++i) x = fsdp::nn::call(layers->ptr<ClipEncoderLayerImpl>(i), x);
  return post_layernorm(x.select(1, 0));
}

ClipImpl::ClipImpl(const ClipConfig& c) : config_(c) {
  c.validate();
  text_model = register_module("text_model", ClipTextTransformer(c));
  vision_model = register_module("vision_model", ClipVisionTransformer(c));
  visual_projection = register_module(
      "visual_projection", torch::nn::Linear(torch::nn::LinearOptions(c.vision.dim, c.projection_dim).bias(false)));
  text_projection = register_module(
      "text_projection", torch::nn::Linear(torch::nn::LinearOptions(c.text.dim, c.projection_dim).bias(false)));
  logit_scale = register_parameter("logit_scale", torch::full({}, std::log(1.0 / 0.07)));
  torch::NoGradGuard no_grad;
  visual_projection->weight.normal_(0.0, std::pow(static_cast<double>(c.vision.dim), -0.5));
  text_projection->weight.normal_(0.0, std::pow(static_cast<double>(c.text.dim), -0.5));
  if (c.freeze_vision || c.lora.enabled()) freeze(*visual_projection);
  if (c.freeze_text || c.lora.enabled()) freeze(*text_projection);
  if (c.lora.enabled()) logit_scale.set_requires_grad(false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ClipImpl::forward(const at::Tensor& images, const at::Tensor& ids) {
  TORCH_CHECK(images.dim() == 4 && images.size(1) == config_.channels && images.size(2) == config_.image_size &&
                  images.size(3) == config_.image_size,
              "clip: expected images [b, ", config_.channels, ", ", config_.image_size, ", ", config_.image_size,
              "], got ", images.sizes());
  TORCH_CHECK(ids.dim() == 2, "clip: expected token ids [b, t], got ", ids.sizes());
  at::Tensor image = models::linear(fsdp::nn::call(vision_model, images), visual_projection->weight);
  at::Tensor text = models::linear(fsdp::nn::call(text_model, ids), text_projection->weight);
  image = image / image.norm(2, -1, /*keepdim=*/true);
  text = text / text.norm(2, -1, /*keepdim=*/true);
  return {image, text, logit_scale.exp()};
}

}  // namespace fsdp::models
