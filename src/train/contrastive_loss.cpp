#include "fsdp/train/contrastive_loss.h"

#include <torch/torch.h>

#include <stdexcept>

namespace fsdp::train {

namespace {

// [n * b, p] fp32 on `local`'s device: every rank's rows, rank r's at [r b, (r + 1) b). The group
// carries tensors of its own device type (MPI: host copies of a GPU's features, [b, p] is small).
at::Tensor gather_rows(const at::Tensor& local, const comm::ProcessGroupPtr& group) {
  const int n = group->size();
  if (n == 1) return local.detach().clone();
  const at::Device wire = group->device_type() == at::kCPU ? at::Device(at::kCPU) : local.device();
  const at::Tensor mine = local.detach().to(wire).contiguous();
  at::Tensor all = at::empty({n * local.size(0), local.size(1)}, mine.options());
  group->all_gather(all.view(-1), mine.view(-1))->wait();
  return all.to(local.device());
}

// [b, p] fp32: rows [r b, (r + 1) b) of the sum over ranks of every rank's `rows` [n * b, p].
at::Tensor sum_own_rows(const at::Tensor& rows, const comm::ProcessGroupPtr& group) {
  const int n = group->size();
  if (n == 1) return rows;
  const at::Device wire = group->device_type() == at::kCPU ? at::Device(at::kCPU) : rows.device();
  const at::Tensor all = rows.to(wire).contiguous();
  at::Tensor mine = at::empty({rows.size(0) / n, rows.size(1)}, all.options());
  group->reduce_scatter(mine.view(-1), all.view(-1), comm::ReduceOp::Sum)->wait();
  return mine.to(rows.device());
}

// This rank's share of the summed loss from the gathered features [n b, p] and the scale [].
at::Tensor share_of(const at::Tensor& images, const at::Tensor& texts, const at::Tensor& scale,
                    const at::Tensor& own_rows) {
  namespace F = torch::nn::functional;
  const auto sum = F::CrossEntropyFuncOptions().reduction(torch::kSum);
  const at::Tensor per_image = scale * images.index_select(0, own_rows).matmul(texts.t());  // [b, n b]
  const at::Tensor per_text = scale * texts.index_select(0, own_rows).matmul(images.t());   // [b, n b]
  return (F::cross_entropy(per_image, own_rows, sum) + F::cross_entropy(per_text, own_rows, sum)) / 2;
}

}  // namespace

at::Tensor contrastive_loss_share(const models::ContrastiveOutput& output, const comm::ProcessGroupPtr& group) {
  const at::Tensor images = output.image_embeds.to(at::kFloat), texts = output.text_embeds.to(at::kFloat);
  const at::Tensor scale = output.scale.to(at::kFloat);
  if (images.dim() != 2 || texts.sizes() != images.sizes() || scale.numel() != 1) {
    throw std::invalid_argument(
        "contrastive loss: expected image and text embeddings of one shape [b, p] and a scalar scale, got " +
        c10::str(images.sizes()) + ", " + c10::str(texts.sizes()) + " and " + c10::str(scale.sizes()));
  }
  const int64_t b = images.size(0);
  const at::Tensor own_rows = torch::arange(group->rank() * b, (group->rank() + 1) * b,
                                            at::TensorOptions().dtype(at::kLong).device(images.device()));
  // 1. Every rank's features, as leaves: the gradient of this rank's share reaches all of them.
  const at::Tensor all_images = gather_rows(images, group).requires_grad_(true);
  const at::Tensor all_texts = gather_rows(texts, group).requires_grad_(true);
  at::Tensor gradient_images, gradient_texts;
  {
    at::AutoGradMode enable(true);
    const at::Tensor share = share_of(all_images, all_texts, scale.detach(), own_rows);
    const auto gradients = torch::autograd::grad({share}, {all_images, all_texts});
    gradient_images = gradients[0];
    gradient_texts = gradients[1];
  }
  // 2. The whole loss's gradient with respect to this rank's features: every rank's contribution.
  const at::Tensor own_images = sum_own_rows(gradient_images, group), own_texts = sum_own_rows(gradient_texts, group);
  // 3. The share's value with the temperature's own gradient, plus terms of value 0 whose gradient
  //    with respect to the features is the total computed above.
  const at::Tensor share = share_of(all_images.detach(), all_texts.detach(), scale, own_rows);
  const at::Tensor carried = (images * own_images).sum() + (texts * own_texts).sum();
  return share + (carried - carried.detach());
}

at::Tensor zero_shot_logits(const models::ContrastiveOutput& output) {
  return output.scale.to(at::kFloat) * output.image_embeds.to(at::kFloat).matmul(output.text_embeds.to(at::kFloat).t());
}

}  // namespace fsdp::train
