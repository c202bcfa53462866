// fsdp/models/built_model.h: a type-erased handle on a built model, so the trainer and tools call
// any family's model the same way (the family fills the entry points its task has, model_family.h).
#pragma once

#include <functional>
#include <memory>
#include <tuple>

#include <torch/nn/module.h>

#include "fsdp/models/linear_cross_entropy.h"

namespace fsdp::models {

// A contrastive model's two outputs in their shared space (ModelTask::Contrastive).
struct ContrastiveOutput {
  at::Tensor image_embeds;  // [b_images, projection_dim], unit L2 norm, compute dtype
  at::Tensor text_embeds;   // [b_texts, projection_dim], unit L2 norm, compute dtype
  at::Tensor scale;         // [] exp(logit_scale): logits_per_image = scale * image_embeds @ text_embeds^T
};

// The root module and its forward (ids [b, t] -> logits [b, t, vocab], or images -> logits [b,
// classes]), called through fsdp::nn::call so wrappers' hooks run. positions [b, t] int64
// (language models, packed rows; undefined otherwise): each token's position in its own example,
// restarting at 0 where one starts (see document_causal_mask).
struct BuiltModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor& inputs, const at::Tensor& positions)> forward_function;
  // Language models: (ids, targets [b, t], chunks, positions) -> the summed token loss (fp32
  // scalar), the head and cross-entropy fused a chunk of tokens at a time. Empty for ViT.
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const ChunkedLoss&, const at::Tensor&)>
      loss_sum_function;

  at::Tensor forward(const at::Tensor& inputs, const at::Tensor& positions = {}) const {
    return forward_function(inputs, positions);
  }
  // Contrastive (CLIP): (images [b, c, s, s] fp32, ids [b', t] int64) -> {image embeddings [b, p],
  // text embeddings [b', p], unit norm, compute dtype; exp(logit_scale) []}. Empty for the others.
  std::function<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&)>
      contrastive_function;

  // Image and text (LLaVA): (images [b, c, s, s] fp32, ids [b, t] int64) -> logits [b, t, vocab];
  // with (targets [b, t], chunks) the summed token loss (fp32 scalar). Empty for the others.
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> image_text_logits_function;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const ChunkedLoss&)>
      image_text_loss_function;

  bool is_contrastive() const { return static_cast<bool>(contrastive_function); }
  bool reads_image_and_text() const { return static_cast<bool>(image_text_logits_function); }
  at::Tensor image_text_logits(const at::Tensor& images, const at::Tensor& ids) const {
    return image_text_logits_function(images, ids);
  }
  at::Tensor image_text_loss(const at::Tensor& images, const at::Tensor& ids, const at::Tensor& targets,
                             const ChunkedLoss& chunks) const {
    return image_text_loss_function(images, ids, targets, chunks);
  }
  ContrastiveOutput contrastive(const at::Tensor& images, const at::Tensor& ids) const {
    auto [image, text, scale] = contrastive_function(images, ids);
    return {image, text, scale};
  }
  bool has_loss_sum() const { return static_cast<bool>(loss_sum_function); }
  at::Tensor loss_sum(const at::Tensor& ids, const at::Tensor& targets, const ChunkedLoss& chunks,
                      const at::Tensor& positions = {}) const {
    return loss_sum_function(ids, targets, chunks, positions);
  }
};

}  // namespace fsdp::models
