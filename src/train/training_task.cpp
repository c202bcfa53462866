#include "training_task.h"

#include <torch/torch.h>

#include <cstdio>
#include <stdexcept>

#include "fsdp/data/captions.h"
#include "fsdp/data/datasets.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/contrastive_loss.h"
#include "loss.h"

namespace fsdp::train {

namespace {

// The loss of a model that maps inputs to logits: a language model's head fused with the loss a
// chunk of tokens at a time (no [tokens, vocab] logits) where it has one and train.loss_chunk_tokens
// is not 0; else cross-entropy of the whole logits.
at::Tensor logits_loss_sum(models::BuiltModel& model, const MicroBatch& batch, int64_t loss_chunk_tokens) {
  if (model.has_loss_sum() && loss_chunk_tokens > 0)
    return model.loss_sum(batch.inputs, batch.targets, {loss_chunk_tokens, batch.loss_gradient}, batch.positions);
  return loss_of(model.forward(batch.inputs, batch.positions), batch.targets, torch::kSum);
}

class LanguageTask final : public TrainingTask {
 public:
  explicit LanguageTask(const TrainConfig& config) : config_(config) {}
  at::Tensor loss_sum(models::BuiltModel& model, const MicroBatch& batch) const override {
    return logits_loss_sum(model, batch, config_.loss_chunk_tokens);
  }
  int64_t flops_sequence() const override { return config_.seq_len; }
  int64_t gemm_rows_per_sample() const override { return config_.seq_len; }

 private:
  const TrainConfig& config_;
};

class ImageClassificationTask final : public TrainingTask {
 public:
  ImageClassificationTask(const TrainConfig& config, const models::ModelConfig& model)
      : config_(config), image_tokens_(models::family_of(model).image_input(model).tokens) {}
  at::Tensor loss_sum(models::BuiltModel& model, const MicroBatch& batch) const override {
    return logits_loss_sum(model, batch, config_.loss_chunk_tokens);
  }
  int64_t flops_sequence() const override { return config_.seq_len; }
  int64_t gemm_rows_per_sample() const override { return image_tokens_; }

 private:
  const TrainConfig& config_;
  int64_t image_tokens_;  // patches and class token
};

// Captions from the labels: bytes and the model's end-of-text token (data/captions.h).
class ContrastiveTask final : public TrainingTask {
 public:
  ContrastiveTask(const TrainConfig& config, const models::ModelConfig& model, comm::ProcessGroupPtr world)
      : config_(config),
        world_(std::move(world)),
        image_tokens_(models::family_of(model).image_input(model).tokens),
        end_of_text_(models::family_of(model).end_of_text_token(model)),
        captions_(data::fashion_mnist_class_names(), data::caption_templates(),
                  models::family_of(model).text_context(model), end_of_text_) {
    const int64_t vocab = models::family_of(model).vocab_size(model);
    if (vocab <= end_of_text_ || vocab < 256) {
      throw std::runtime_error("model.vocab " + std::to_string(vocab) +
                               " cannot hold the byte captions (bytes 0-255 and eos_token " +
                               std::to_string(end_of_text_) + ")");
    }
  }
  // Captions drawn for this step from the labels; the loss over the global batch.
  at::Tensor loss_sum(models::BuiltModel& model, const MicroBatch& batch) const override {
    const at::Tensor captions =
        captions_.captions(batch.labels, *batch.indices, batch.step, config_.seed).to(batch.inputs.device());
    return contrastive_loss_share(model.contrastive(batch.inputs, captions), world_);
  }
  int64_t flops_sequence() const override { return config_.seq_len; }
  int64_t gemm_rows_per_sample() const override { return image_tokens_; }
  std::string header_line() const override {
    char line[512];
    const std::string cut = captions_.truncated_pairs() > 0 ? ", " + std::to_string(captions_.truncated_pairs()) +
                                                                  " captions cut to fit (raise model.context)"
                                                            : "";
    std::snprintf(line, sizeof(line),
                  "  captions: %lld classes x %zu templates as bytes + end-of-text %lld; longest %lld bytes of a "
                  "%lld-token context%s; contrastive loss over the global batch (features gathered across the %d "
                  "ranks); zero-shot eval with \"%s\"",
                  static_cast<long long>(captions_.classes()), data::caption_templates().size(),
                  static_cast<long long>(end_of_text_), static_cast<long long>(captions_.longest_bytes()),
                  static_cast<long long>(captions_.context()), cut.c_str(), world_->size(),
                  data::caption_templates().front().c_str());
    return line;
  }
  AccuracyKind accuracy_kind() const override { return AccuracyKind::ZeroShot; }
  at::Tensor class_prompts() const override { return captions_.class_prompts(); }

 private:
  const TrainConfig& config_;
  comm::ProcessGroupPtr world_;
  int64_t image_tokens_;
  int64_t end_of_text_;
  data::CaptionWriter captions_;
};

// One-turn chats from the labels (image_chat_writer), checked as fsdp-train --check checks them.
class ImageTextTask final : public TrainingTask {
 public:
  ImageTextTask(const TrainConfig& config, const models::ModelConfig& model, data::Dataset& train)
      : config_(config),
        image_tokens_(models::family_of(model).image_input(model).tokens),
        chats_(image_chat_writer(model)) {
    check_image_chats(model, chats_);
    // The loss is the mean over the global batch's answer tokens, counted as any masked loss's.
    std::vector<int64_t> answer_tokens;
    for (int64_t label = 0; label < chats_.classes(); ++label) answer_tokens.push_back(chats_.answer_tokens(label));
    if (auto* images = dynamic_cast<data::ImageDataset*>(&train)) images->set_targets_per_label(answer_tokens);
  }
  // Images [b, ...] on the device and their labels [b] -> the chats' summed answer-token loss.
  at::Tensor loss_sum(models::BuiltModel& model, const MicroBatch& batch) const override {
    const data::ImageChatWriter::Rows rows = chats_.examples(batch.labels);
    const int64_t chunk = config_.loss_chunk_tokens > 0 ? config_.loss_chunk_tokens : rows.ids.numel();
    const at::Device device = batch.inputs.device();
    return model.image_text_loss(batch.inputs, rows.ids.to(device), rows.targets.to(device),
                                 {chunk, batch.loss_gradient});
  }
  int64_t flops_sequence() const override { return chats_.row_length(); }
  int64_t gemm_rows_per_sample() const override { return chats_.row_length(); }
  std::string header_line() const override {
    std::string question;  // its newline shown as \n
    for (char ch : chats_.question()) question += ch == '\n' ? std::string("\\n") : std::string(1, ch);
    char line[512];
    std::snprintf(line, sizeof(line),
                  "  chats: %lld image tokens + \"%s\" + the answer (\"%s\", ...) as bytes + end-of-text, rows of "
                  "%lld tokens; only the answer trained; eval: greedy answers, exact match",
                  static_cast<long long>(image_tokens_), question.c_str(), chats_.answer(7).c_str(),
                  static_cast<long long>(chats_.row_length()));
    return line;
  }
  AccuracyKind accuracy_kind() const override { return AccuracyKind::Answers; }
  const data::ImageChatWriter* chats() const override { return &chats_; }

 private:
  const TrainConfig& config_;
  int64_t image_tokens_;
  data::ImageChatWriter chats_;
};

}  // namespace

std::unique_ptr<TrainingTask> make_training_task(const TrainConfig& config, const models::ModelConfig& model,
                                                 LoadedData& data, const comm::ProcessGroupPtr& world) {
  switch (models::family_of(model).task()) {
    case models::ModelTask::Language: return std::make_unique<LanguageTask>(config);
    case models::ModelTask::ImageClassification: return std::make_unique<ImageClassificationTask>(config, model);
    case models::ModelTask::Contrastive: return std::make_unique<ContrastiveTask>(config, model, world);
    case models::ModelTask::ImageText: return std::make_unique<ImageTextTask>(config, model, *data.train);
  }
  throw std::logic_error("make_training_task: a model task without a training task");
}

const char* accuracy_name(AccuracyKind kind) {
  switch (kind) {
    case AccuracyKind::Classes: return "test";
    case AccuracyKind::ZeroShot: return "zero-shot";
    case AccuracyKind::Answers: return "answer";
  }
  return "test";
}

}  // namespace fsdp::train
