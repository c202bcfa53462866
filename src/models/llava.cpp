#include "fsdp/models/llava.h"

#include <torch/torch.h>

#include <stdexcept>

#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/layers.h"
#include "fsdp/nn/hooks.h"

namespace fsdp::models {

void LlavaConfig::validate() const {
  vision.validate();
  text.validate();
  if (image_token < 0 || image_token >= text.vocab) {
    throw std::invalid_argument("llava: image_token " + std::to_string(image_token) +
                                " is outside the language model's vocabulary [0, " + std::to_string(text.vocab) + ")");
  }
  if (vision_feature_layer < -(vision.vision.layers + 1) || vision_feature_layer > vision.vision.layers) {
    throw std::invalid_argument("llava: vision_feature_layer " + std::to_string(vision_feature_layer) +
                                " is outside the image tower's " + std::to_string(vision.vision.layers + 1) +
                                " hidden states (-" + std::to_string(vision.vision.layers + 1) + " .. " +
                                std::to_string(vision.vision.layers) + ")");
  }
  if (image_tokens() >= text.context) {
    throw std::invalid_argument("llava: " + std::to_string(image_tokens()) +
                                " image tokens leave no room in the language model's context of " +
                                std::to_string(text.context));
  }
}

int64_t LlavaConfig::read_blocks() const {
  return vision_feature_layer >= 0 ? vision_feature_layer : vision.vision.layers + 1 + vision_feature_layer;
}

int64_t LlavaConfig::parameter_count() const {
  const int64_t image_tower = vision.vision_tower_parameter_count();
  const int64_t projector = vision.vision.dim * text.dim + text.dim + text.dim * text.dim + text.dim;
  return image_tower + projector + text.parameter_count();
}

double LlavaConfig::flops_per_example(int64_t seq) const {
  const ClipTowerShape& v = vision.vision;
  const double tokens = static_cast<double>(vision.image_tokens());
  const double blocks = static_cast<double>(read_blocks());
  const double tower =
      6.0 * tokens * blocks * (4.0 * v.dim * v.dim + 2.0 * v.dim * v.mlp_hidden) +
      12.0 * blocks * tokens * tokens * v.dim +
      6.0 * static_cast<double>(vision.patches()) * v.dim * vision.channels * vision.patch * vision.patch;
  const double projector = 6.0 * static_cast<double>(image_tokens()) * (v.dim * text.dim + text.dim * text.dim);
  return tower + projector + static_cast<double>(seq) * text.flops_per_token(seq);
}

LlavaProjectorImpl::LlavaProjectorImpl(int64_t vision_dim, int64_t text_dim) {
  linear_1 = register_module("linear_1", torch::nn::Linear(vision_dim, text_dim));
  linear_2 = register_module("linear_2", torch::nn::Linear(text_dim, text_dim));
}

at::Tensor LlavaProjectorImpl::forward(const at::Tensor& features) {
  // transformers' "gelu": the exact (erf) form.
  return models::linear(torch::gelu(models::linear(features, linear_1->weight, linear_1->bias)), linear_2->weight,
                        linear_2->bias);
}

LlavaImpl::LlavaImpl(const LlavaConfig& c) : config_(c) {
  c.validate();
  ClipConfig tower = c.vision;
  tower.freeze_vision = c.freeze_vision;
  tower.lora = {};  // LLaVA's adapters are the Llama's (text.lora)
  vision_tower = register_module("vision_tower", ClipVisionTransformer(tower, c.read_blocks()));
  multi_modal_projector = register_module("multi_modal_projector", LlavaProjector(c.vision.vision.dim, c.text.dim));
  init_normal(*multi_modal_projector, 0.02);
  language_model = register_module("language_model", Llama(c.text));
}

at::Tensor LlavaImpl::input_embeddings(const at::Tensor& images, const at::Tensor& ids) {
  const ClipConfig& v = config_.vision;
  TORCH_CHECK(images.dim() == 4 && images.size(1) == v.channels && images.size(2) == v.image_size &&
                  images.size(3) == v.image_size,
              "llava: expected images [b, ", v.channels, ", ", v.image_size, ", ", v.image_size, "], got ",
              images.sizes());
  TORCH_CHECK(ids.dim() == 2 && ids.size(0) == images.size(0), "llava: expected token ids [", images.size(0),
              ", t], got ", ids.sizes());
  const at::Tensor is_image = ids.eq(config_.image_token);  // [b, t]
  // Every row holds exactly its image's tokens; a wrong count would shift features between rows.
  const at::Tensor per_row = is_image.sum(1);
  TORCH_CHECK(per_row.eq(config_.image_tokens()).all().item<bool>(), "llava: each row must hold ",
              config_.image_tokens(), " image tokens (id ", config_.image_token, "), got ",
              per_row.min().item<int64_t>(), "-", per_row.max().item<int64_t>());
  at::Tensor states = fsdp::nn::call(vision_tower, images, config_.read_blocks());  // [b, patches + 1, vision dim]
  if (!config_.keep_class_token) states = states.narrow(1, 1, states.size(1) - 1);
  const at::Tensor features = multi_modal_projector(states);  // [b, image tokens, text dim]
  const at::Tensor embedded = language_model->embed(ids);     // [b, t, text dim]
  return embedded.masked_scatter(is_image.unsqueeze(-1), features.to(embedded.scalar_type()));
}

at::Tensor LlavaImpl::forward(const at::Tensor& images, const at::Tensor& ids) {
  return language_model->logits_from_embeddings(input_embeddings(images, ids));
}

at::Tensor LlavaImpl::forward(const at::Tensor& images, const at::Tensor& ids, const at::Tensor& targets,
                              const ChunkedLoss& chunks) {
  return language_model->loss_from_embeddings(input_embeddings(images, ids), targets, chunks);
}

}  // namespace fsdp::models
