// fsdp/models/registry.h: the model zoo by name (every family's sizes), and what callers ask of a
// config, each answered by its family (model_family.h): the trainer and tools pick an architecture
// from a config file and never branch on it.
//
// Names (each with an exact parameter count and FLOPs per token or image):
//   gpt-test, gpt-tiny, gpt-mini, gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl
//   llama-test, llama-tiny, llama-small, llama3-1b (Llama 3.2 1B), llama3-8b, llama3-70b
//   vit-test, vit-fmnist, vit-s16, vit-b16, vit-l16, vit-h14 (632,045,800 parameters, as torchvision's vit_h_14)
//   clip-test, clip-fmnist (byte captions, 28x28 greyscale), clip-vit-b32, clip-vit-l14
//   llava-test, llava-fmnist (byte text, 28x28 greyscale), llava-1.5-7b
// The small language models default to a byte vocabulary (256); the trainer sets vocab from the
// tokenizer in any case.
#pragma once

#include <string>
#include <vector>

#include "fsdp/models/model_family.h"

namespace fsdp::models {

std::vector<std::string> model_names();
// Throws std::invalid_argument listing the known names.
ModelConfig model_config(const std::string& name);

// Each of these asks the config's family (ModelFamily, model_family.h, says what each means).
const char* family_name(const ModelConfig& config);
ModelTask model_task(const ModelConfig& config);
bool is_language_model(const ModelConfig& config);     // ModelTask::Language
bool is_contrastive(const ModelConfig& config);        // ModelTask::Contrastive (BuiltModel::contrastive)
bool reads_image_and_text(const ModelConfig& config);  // ModelTask::ImageText (BuiltModel::image_text_*)
// The model's LoRA settings (rank 0: none); nullptr for a family without adapters.
const LoraSpec* lora_spec(const ModelConfig& config);
LoraSpec* mutable_lora_spec(ModelConfig& config);
std::vector<std::string> linear_layers(const ModelConfig& config);
int64_t linear_weight_count(const ModelConfig& config);
int64_t parameter_count(const ModelConfig& config);
int64_t vocab_size(const ModelConfig& config);
int64_t text_context(const ModelConfig& config);
std::optional<AttentionCall> attention_call(const ModelConfig& config, int64_t tokens);
double flops_per_sample(const ModelConfig& config, int64_t seq);
std::vector<std::string> block_type_names(const ModelConfig& config);
std::vector<std::string> embedding_and_head_paths(const ModelConfig& config);
std::vector<std::string> tower_paths(const ModelConfig& config);
void validate(const ModelConfig& config);
BuiltModel build_model(const ModelConfig& config);

}  // namespace fsdp::models
