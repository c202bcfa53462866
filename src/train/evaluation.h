// Private to train/: what a run does with its model besides training steps: the validation loss
// (and accuracy, for images) over the same samples every time, and text sampled from a language
// model. Both are collective: every rank of the group runs the same forwards (the runtime's
// collectives must match), and every rank gets the same result.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/data/datasets.h"
#include "fsdp/data/image_chat.h"
#include "fsdp/data/instructions.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace fsdp::train {

// The sharded model as evaluation and sampling use it.
struct ModelInUse {
  models::BuiltModel& model;
  const TrainConfig& config;
  const comm::ProcessGroupPtr& world;
  at::Device device;  // where the shards live: inputs go there
  bool language;      // a language model (else an image classifier)
  // Contrastive models: one caption per class [classes, context] int64 (data::CaptionWriter::class_prompts);
  // undefined otherwise. Its evaluation is zero-shot: each image takes the nearest class caption.
  at::Tensor class_prompts = {};
  // Image-text models: the chats the model was trained on; null otherwise. Its evaluation generates each test
  // image's answer greedily and counts the exact ones.
  const data::ImageChatWriter* chat = nullptr;
};

// What an image model's accuracy is: a classifier's, a contrastive model's zero-shot, or an
// image-text model's generated answers that name the right class.
enum class AccuracyKind { Classes, ZeroShot, Answers };

// How many validation items an evaluation covers: eval.batches global batches of windows
// (language models), eval.max_items images or all of them (images); never more than `available`.
int64_t evaluation_items(const TrainConfig& config, int64_t available, bool language);

// Validation loss (and accuracy for images; contrastive: zero-shot, the loss the cross-entropy of the
// zero-shot logits; image-text: the answers' token loss, the accuracy of greedy answers) after `step` steps, over
// evaluation_items samples spread evenly over the validation set. Ranks with fewer real samples pad with weight-0
// copies. Leaves the model in training mode.
EvalResult run_evaluation(const ModelInUse& m, const data::Dataset& validation, int64_t step);

// The evaluation's progress line and its metrics.jsonl record.
// The accuracy's kind is said in the line, and in the record ("zero_shot": true for a contrastive
// model, "generated_answers": true for an image-text one).
std::string evaluation_line(const EvalResult& result, int64_t items, bool language,
                            AccuracyKind kind = AccuracyKind::Classes);
nlohmann::json evaluation_record(const EvalResult& result, bool language, AccuracyKind kind = AccuracyKind::Classes);

// eval.prompt followed by eval.sample_tokens tokens, drawn with temperature and top-k by rank 0 and
// broadcast, so every rank extends (and returns) the same text. With `chat`, eval.prompt (or "Tell
// me a fortune.") is a user turn rendered in that chat format, and the answer stops at the end of
// its turn: "user: ...\nassistant: ...". Leaves the model in training mode.
std::string generate_sample(const ModelInUse& m, const data::Tokenizer& tokenizer,
                            const data::ChatFormat* chat = nullptr);

}  // namespace fsdp::train
