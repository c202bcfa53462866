// Private to train/: the data a run trains and evaluates on, read from disk before the model is
// built (fortunes text, token files, instruction JSONL or Fashion-MNIST), and the checks that tie it to the config.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/data/datasets.h"
#include "fsdp/data/image_chat.h"
#include "fsdp/data/instructions.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/registry.h"
#include "fsdp/plan/memory_plan.h"
#include "fsdp/train/config.h"

namespace fsdp::train {

// Everything read from disk before the model is built.
struct LoadedData {
  std::unique_ptr<data::Tokenizer> tokenizer;              // language models from text
  data::ChatFormat chat_format = data::ChatFormat::Plain;  // instructions: how prompts are rendered
  int64_t dropped_examples = 0;                            // instructions: too long for the window (both splits)
  std::unique_ptr<data::Dataset> train, validation;
  int64_t vocab = 0;
  std::string description;  // one line for the run's header
  std::string packing;      // data.packing: one line for the header (rows, their use, steps per epoch)
  // Token files: their sizes and checksums, compared across ranks ("" for data read from text).
  std::string fingerprint;
};

// Reads config.data (throws naming the file or directory that is missing or malformed).
LoadedData load_data(const TrainConfig& config);

// What the loaded training and validation sets keep in memory (data::Dataset::held_bytes).
inline int64_t held_bytes(const LoadedData& data) { return data.train->held_bytes() + data.validation->held_bytes(); }

// Throws unless the training data holds one global batch and the validation data a sample per rank.
void check_data_sizes(const LoadedData& data, const TrainConfig& config, int world_size);

// The first file or directory config.data names that is not on this machine, "" when all are
// (the source's files, the tokenizer's; a glob's directory): a run planned here for elsewhere.
// Only existence: what is here is read and checked as a run reads it.
std::string missing_data_path(const TrainConfig& config);

// plan_input with what the loaded data gives: a language model's vocabulary, the bytes it holds.
plan::PlanInput plan_input_with_data(const TrainConfig& config, int ranks, const LoadedData& data);

// Throws as the trainer does when the chats cannot be written for `model`: a vocabulary without
// room for the bytes, end-of-text and the image token, or rows longer than the model's context.
void check_image_chats(const models::ModelConfig& model, const data::ImageChatWriter& chats);

// An image-text model's one-turn chats about Fashion-MNIST's labels: bytes, end-of-text (the first
// id above the bytes that is not the image token) and the model's image token (data/image_chat.h).
// What the trainer writes its rows with, and their length what fsdp-plan plans for.
data::ImageChatWriter image_chat_writer(const models::ModelConfig& model);

// The model's vocabulary follows the data (throws if model.vocab was set to another).
models::ModelConfig resolve_model(const TrainConfig& config, int64_t vocab);

}  // namespace fsdp::train
