// fsdp/models/clip.h: CLIP (Radford et al. 2021) as transformers' CLIPModel computes it: a ViT image
// tower (class token, pre-norm blocks, quick_gelu, the class token's output normed) and a causal
// text transformer pooled at the first end-of-text token, each projected without bias into a
// shared space, normalised, and compared with a learnable temperature exp(logit_scale).
// Module names are transformers' (text_model.encoder.layers.<i>.self_attn.q_proj, ...,
// vision_model.pre_layrnorm, visual_projection, logit_scale), so its directories load unchanged.
// Initialisation as transformers' _init_weights for CLIP, with one std: weights normal(0, 0.02),
// biases zero, the projections normal(0, width^-0.5), logit_scale ln(1 / 0.07).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <tuple>

#include "fsdp/models/layers.h"

namespace fsdp::models {

class ModelFamily;

// One tower's transformer: width, heads, blocks and MLP width.
struct ClipTowerShape {
  int64_t dim = 512;
  int64_t heads = 8;
  int64_t layers = 12;
  int64_t mlp_hidden = 2048;
};

struct ClipConfig {
  // Image tower: square images of image_size pixels with `channels` channels, cut into patches.
  int64_t image_size = 224;
  int64_t patch = 32;
  int64_t channels = 3;
  ClipTowerShape vision{768, 12, 12, 3072};
  // Text tower: `context` token positions over a vocabulary of `vocab`; a caption is read up to
  // its first `eos_token` (transformers' eos_token_id), whose output is the caption's feature.
  int64_t vocab = 49408;
  int64_t context = 77;
  int64_t eos_token = 49407;
  ClipTowerShape text{512, 8, 12, 2048};
  int64_t projection_dim = 512;
  double norm_eps = 1e-5;
  // A frozen tower (its blocks, embeddings, norms and projection) gets no gradient and no optimizer
  // state: train the text tower against a fixed image tower, or the reverse. logit_scale trains.
  bool freeze_vision = false;
  bool freeze_text = false;
  // LoRA adapters on the linear layers of the towers that are not frozen (q_proj, k_proj, v_proj,
  // out_proj, fc1, fc2 by name: PEFT's target_modules, which name both towers' layers alike);
  // everything else is frozen then, logit_scale and the projections included, as PEFT freezes a
  // base. LoRA on one tower: freeze the other.
  LoraSpec lora;

  static const std::vector<std::string>& linear_layers();  // what LoRA may target

  static const ModelFamily& family();  // its spec (clip_family.cpp)
  void validate() const;               // throws std::invalid_argument naming the bad field
  int64_t patches() const { return (image_size / patch) * (image_size / patch); }
  int64_t image_tokens() const { return patches() + 1; }
  int64_t parameter_count() const;
  int64_t vision_tower_parameter_count() const;  // the image tower alone (embeddings, norms, blocks)
  int64_t lora_parameter_count() const;          // the adapters: rank x (in + out) per targeted layer
  // Training FLOPs (forward + backward) of one image-caption pair: 6 per weight per token of every
  // matmul in both towers, plus attention's 12 * layers * tokens^2 * dim.
  double flops_per_pair() const;
};

struct ClipAttentionImpl : torch::nn::Module {
  ClipAttentionImpl(const ClipTowerShape& shape, bool causal);
  at::Tensor forward(const at::Tensor& x);  // [b, t, dim] -> [b, t, dim]
  AdaptedLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  int64_t heads;
  bool causal;
};
TORCH_MODULE(ClipAttention);

struct ClipMlpImpl : torch::nn::Module {
  explicit ClipMlpImpl(const ClipTowerShape& shape);
  at::Tensor forward(const at::Tensor& x);  // fc2(quick_gelu(fc1(x)))
  AdaptedLinear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(ClipMlp);

// The type name of CLIP's block (both towers'), which wrap policies select.
inline constexpr const char* kClipBlockType = "ClipEncoderLayer";

// One pre-norm block of either tower: the FSDP unit (wrap policy module type kClipBlockType).
// frozen: its parameters are built with requires_grad false (before a wrapper shards the block);
// else `lora` (when enabled) adds adapters and freezes the rest.
struct ClipEncoderLayerImpl : torch::nn::Module {
  ClipEncoderLayerImpl(const ClipTowerShape& shape, double norm_eps, bool causal, bool frozen = false,
                       const LoraSpec& lora = {});
  at::Tensor forward(const at::Tensor& x);
  ClipAttention self_attn{nullptr};
  torch::nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  ClipMlp mlp{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

// Token and position embeddings: ids [b, t] int64 (t <= context) -> [b, t, dim].
struct ClipTextEmbeddingsImpl : torch::nn::Module {
  explicit ClipTextEmbeddingsImpl(const ClipConfig& config);
  at::Tensor forward(const at::Tensor& ids);
  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
};
TORCH_MODULE(ClipTextEmbeddings);

// Patch embedding (a convolution without bias whose stride is its kernel), class token, position
// embeddings: images [b, channels, size, size] (any float dtype) -> [b, patches + 1, dim] in the
// weights' dtype.
struct ClipVisionEmbeddingsImpl : torch::nn::Module {
  explicit ClipVisionEmbeddingsImpl(const ClipConfig& config);
  at::Tensor forward(const at::Tensor& images);
  at::Tensor class_embedding;  // [dim]
  torch::nn::Conv2d patch_embedding{nullptr};
  torch::nn::Embedding position_embedding{nullptr};
  ClipConfig config;
};
TORCH_MODULE(ClipVisionEmbeddings);

struct ClipTextTransformerImpl : torch::nn::Module {
  explicit ClipTextTransformerImpl(const ClipConfig& config);
  // ids [b, t] -> the first eos_token's output [b, text dim], after the final norm.
  at::Tensor forward(const at::Tensor& ids);
  ClipTextEmbeddings embeddings{nullptr};
  torch::nn::ModuleList layers;  // registered as encoder.layers
  torch::nn::LayerNorm final_layer_norm{nullptr};
  int64_t eos_token;
};
TORCH_MODULE(ClipTextTransformer);

struct ClipVisionTransformerImpl : torch::nn::Module {
  // read_blocks: how many blocks a reader of hidden_states runs (LLaVA reads the output of a middle
  // block); blocks after them, and post_layernorm, are frozen then, as they get no gradient. -1:
  // all blocks, pooled by forward (CLIP).
  explicit ClipVisionTransformerImpl(const ClipConfig& config, int64_t read_blocks = -1);
  // images -> the class token's output [b, vision dim], after post_layernorm.
  at::Tensor forward(const at::Tensor& images);
  // images -> every token's state [b, patches + 1, vision dim] after pre_layrnorm and the first
  // `blocks` blocks: transformers' hidden_states[blocks] (LLaVA calls it through fsdp::nn::call,
  // so that the tower may be one unit).
  at::Tensor forward(const at::Tensor& images, int64_t blocks);
  ClipVisionEmbeddings embeddings{nullptr};
  torch::nn::LayerNorm pre_layrnorm{nullptr}, post_layernorm{nullptr};  // transformers' spelling
  torch::nn::ModuleList layers;                                         // registered as encoder.layers
};
TORCH_MODULE(ClipVisionTransformer);

struct ClipImpl : torch::nn::Module {
  explicit ClipImpl(const ClipConfig& config);
  // images [b, channels, size, size] fp32, ids [b', t] int64 -> (image_embeds, text_embeds, scale)
  // (a ContrastiveOutput, built_model.h); either batch may be empty ([0, ...]) and b' need not equal b.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& images, const at::Tensor& ids);
  const ClipConfig& config() const { return config_; }

  ClipTextTransformer text_model{nullptr};
  ClipVisionTransformer vision_model{nullptr};
  torch::nn::Linear visual_projection{nullptr}, text_projection{nullptr};
  at::Tensor logit_scale;  // [] (0-D, as transformers keeps it)

 private:
  ClipConfig config_;
};
TORCH_MODULE(Clip);

}  // namespace fsdp::models
