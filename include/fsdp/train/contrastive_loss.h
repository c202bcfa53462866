// fsdp/train/contrastive_loss.h: CLIP's symmetric contrastive loss over the global batch, each rank
// computing its share (OpenCLIP's local loss with gathered features).
//
// The global batch of B image-caption pairs is spread over the group's N ranks, b = B / N each,
// rank r holding pairs [r b, (r + 1) b). Every image is compared with every caption of the whole
// batch: logits_per_image = scale * I T^T [B, B] (I, T the unit-norm embeddings), and the loss is
//   (1 / 2B) * sum_i [ CE(logits_per_image[i], i) + CE(logits_per_text[i], i) ].
// Rank r computes the rows of its own pairs in both directions against the gathered features.
//
// Gradient: the features are all-gathered (detached), this rank's rows give the gradient of its
// share with respect to every gathered feature, and a reduce-scatter (sum) of those gradients hands
// each rank the gradient of the WHOLE loss with respect to its own features: what the backward of
// an all-gather with gradient computes, done here while the loss is formed. The returned tensor's
// value is this rank's share; its backward sends that total gradient into the towers, plus the
// share's own gradient of the temperature. With the trainer's convention (each rank's loss scaled by
// N / B, gradients averaged over ranks) every parameter gets the gradient of the global mean.
#pragma once

#include <ATen/core/Tensor.h>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/built_model.h"

namespace fsdp::train {

// `output`: this rank's b pairs (image_embeds and text_embeds [b, p], any float dtype; scale []).
// Returns sum over this rank's pairs of (CE image->text + CE text->image) / 2, an fp32 scalar on
// the embeddings' device, whose backward carries the global loss's gradient as said above. Every
// rank of `group` must call it with the same b (collective: an all-gather and a reduce-scatter of
// [b, p] fp32 per modality). Throws std::invalid_argument naming the shapes when they differ.
at::Tensor contrastive_loss_share(const models::ContrastiveOutput& output, const comm::ProcessGroupPtr& group);

// Zero-shot classification logits (no gradient, no communication): scale * images @ classes^T in
// fp32, [b, classes], from image embeddings [b, p] and one text embedding per class [classes, p].
at::Tensor zero_shot_logits(const models::ContrastiveOutput& output);

}  // namespace fsdp::train
