// src/train/training_task.h (private): what the trainer does differently for each kind of model
// (models::ModelTask), in one place per kind, so that the trainer asks instead of branching:
//
//   task                 a micro-batch's loss                         tokens a sample's GEMMs see   accuracy
//   Language             the head and cross-entropy, train.loss_chunk_tokens at a time    the window   (none)
//   ImageClassification  cross-entropy of the logits                   an image's patches + class   test
//   Contrastive          captions drawn from the labels; the contrastive loss over the global batch   zero-shot
//   ImageText            chats from the labels; the answers' token loss    a chat's row            answers
//
// A family declares its task (ModelFamily::task); the data each task reads is Fashion-MNIST's
// labelled images for the image tasks (their captions and chats come from the class names).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/data/image_chat.h"
#include "fsdp/models/built_model.h"
#include "fsdp/train/config.h"
#include "evaluation.h"
#include "training_data.h"

namespace fsdp::train {

// One micro-batch as the loss takes it.
struct MicroBatch {
  at::Tensor inputs, targets;                     // on the device: token ids or images; next tokens or labels
  at::Tensor positions;                           // on the device: packed rows' positions (undefined otherwise)
  at::Tensor labels;                              // on the host: the images' labels (image tasks)
  const std::vector<int64_t>* indices = nullptr;  // the samples' indices in the training set
  int64_t step = 0;
  // The factor backward will bring to this micro-batch's summed loss (the trainer's scale to the
  // global mean, times float16's loss scale): the chunked head computes its gradients in forward
  // already multiplied by it (models::ChunkedLoss).
  double loss_gradient = 1.0;
};

class TrainingTask {
 public:
  virtual ~TrainingTask() = default;
  // The micro-batch's loss, summed over its targets (the trainer divides by the global batch's).
  virtual at::Tensor loss_sum(models::BuiltModel& model, const MicroBatch& batch) const = 0;
  // The sequence length a sample's FLOPs are counted at (models::flops_per_sample).
  virtual int64_t flops_sequence() const = 0;
  // Rows a sample puts through the linear layers (train.bf16_matmul's measurement).
  virtual int64_t gemm_rows_per_sample() const = 0;
  // How the labels become text, for the run's header ("" : they do not).
  virtual std::string header_line() const { return std::string(); }
  virtual AccuracyKind accuracy_kind() const { return AccuracyKind::Classes; }
  // What evaluation reads besides the model: the class captions, the chats (ModelInUse).
  virtual at::Tensor class_prompts() const { return at::Tensor(); }
  virtual const data::ImageChatWriter* chats() const { return nullptr; }
};

// The task of `model` (its vocabulary resolved), for a run of `config` over `ranks` ranks on `world`
// (the contrastive loss gathers over it) reading `data`. An image-text task sets the training
// set's targets per label (the answers' tokens). Throws naming what does not fit (captions the
// vocabulary cannot hold, chats longer than the model's context).
std::unique_ptr<TrainingTask> make_training_task(const TrainConfig& config, const models::ModelConfig& model,
                                                 LoadedData& data, const comm::ProcessGroupPtr& world);

// "test", "zero-shot" or "answer": how the run's footer names its accuracy.
const char* accuracy_name(AccuracyKind kind);

}  // namespace fsdp::train
