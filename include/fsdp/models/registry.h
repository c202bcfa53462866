// fsdp/models/registry.h: the model zoo by name, and a type-erased handle on a built model, so the
// trainer and tools can pick an architecture from a config file.
//
// Names (each with an exact parameter count and FLOPs per token or image):
//   gpt-test, gpt-tiny, gpt-mini, gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl
//   llama-test, llama-tiny, llama-small, llama3-1b (Llama 3.2 1B), llama3-8b, llama3-70b
//   vit-test, vit-fmnist, vit-s16, vit-b16, vit-l16
//   clip-test, clip-fmnist (byte captions, 28x28 greyscale), clip-vit-b32, clip-vit-l14
//   llava-test, llava-fmnist (byte text, 28x28 greyscale), llava-1.5-7b
// The small language models default to a byte vocabulary (256); the trainer sets vocab from the
// tokenizer in any case.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "fsdp/models/clip.h"
#include "fsdp/models/gpt.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llava.h"
#include "fsdp/models/vit.h"

namespace fsdp::models {

using ModelConfig = std::variant<GptConfig, LlamaConfig, VitConfig, ClipConfig, LlavaConfig>;

std::vector<std::string> model_names();
// Throws std::invalid_argument listing the known names.
ModelConfig model_config(const std::string& name);

const char* family_name(const ModelConfig& config);  // "gpt", "llama", "vit", "clip", "llava"
// The model's LoRA settings (rank 0: none); nullptr for a family without adapters (ViT).
const LoraSpec* lora_spec(const ModelConfig& config);
// The linear layers of the family's blocks, by name (what LoRA may target, and what a QLoRA base
// stores as NF4): q_proj ... down_proj (Llama, and LLaVA's language model), c_attn, c_proj, c_fc
// (GPT), q_proj ... out_proj, fc1, fc2 (CLIP's towers); empty for ViT.
std::vector<std::string> linear_layers(const ModelConfig& config);
// The weights of those layers over every block (0 for ViT and CLIP: a CLIP base is not stored in NF4).
int64_t linear_weight_count(const ModelConfig& config);
bool is_language_model(const ModelConfig& config);
// CLIP: trained on image-caption pairs with a contrastive loss over the global batch (no labels
// in the model; BuiltModel::contrastive).
bool is_contrastive(const ModelConfig& config);
// LLaVA: reads an image and token ids, trained on the answer's tokens (BuiltModel::image_text_*).
bool reads_image_and_text(const ModelConfig& config);
int64_t parameter_count(const ModelConfig& config);
int64_t vocab_size(const ModelConfig& config);  // the vocabulary of the text read; 0 for ViT
int64_t text_context(const ModelConfig& config);  // the longest text read (a caption's for CLIP); 0 for ViT
// Training FLOPs per sample position: per token (language models, at sequence length seq), per
// image (ViT), per image-caption pair (CLIP; seq ignored) or per example of seq positions (LLaVA).
double flops_per_sample(const ModelConfig& config, int64_t seq);
// Type names of the repeated blocks, the natural FSDP units ("GptBlock", "LlamaBlock", "VitBlock",
// "ClipEncoderLayer": both of CLIP's towers; LLaVA: "ClipEncoderLayer" and "LlamaBlock").
std::vector<std::string> block_type_names(const ModelConfig& config);
// Paths of the modules holding the token embedding and the output head, which the model calls
// through fsdp::nn::call so that each may be an FSDP unit of its own (a tied pair is one module
// called twice, so one path): GPT {"wte"}; Llama {"embed_tokens", "lm_head"}, or {"embed_tokens"}
// when tied. Empty for ViT, whose patch embedding and class head are small (dim x 768 and
// dim x classes), well below one block. CLIP: both towers' embeddings {"text_model.embeddings",
// "vision_model.embeddings"} (the text one holds vocab x dim). LLaVA: the Llama's (under
// "language_model.") and "vision_tower.embeddings".
std::vector<std::string> embedding_and_head_paths(const ModelConfig& config);
// The towers fsdp.wrap = "tower" makes one unit each (torchtitan wraps a VLM's vision encoder so:
// one gather for the whole tower): CLIP {"text_model", "vision_model"}, LLaVA {"vision_tower"};
// each is called through fsdp::nn::call. Empty for the other families.
std::vector<std::string> tower_paths(const ModelConfig& config);
void validate(const ModelConfig& config);

// A built model: the root module and its forward (ids [b, t] -> logits [b, t, vocab], or
// images -> logits [b, classes]), called through fsdp::nn::call so wrappers' hooks run.
// positions [b, t] int64 (language models, packed rows; undefined otherwise): each token's position
// in its own example, restarting at 0 where one starts (see document_causal_mask).
struct BuiltModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor& inputs, const at::Tensor& positions)> forward_function;
  // Language models: (ids, targets [b, t], chunk_rows, positions) -> the summed token loss (fp32
  // scalar), the head and cross-entropy fused a chunk of tokens at a time. Empty for ViT.
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&)> loss_sum_function;

  at::Tensor forward(const at::Tensor& inputs, const at::Tensor& positions = {}) const {
    return forward_function(inputs, positions);
  }
  // CLIP: (images [b, c, s, s] fp32, ids [b', t] int64) -> {image embeddings [b, p], text
  // embeddings [b', p], unit norm, compute dtype; exp(logit_scale) []}. Empty for other families.
  std::function<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&)> contrastive_function;

  // LLaVA: (images [b, c, s, s] fp32, ids [b, t] int64) -> logits [b, t, vocab]; with (targets
  // [b, t], chunk_rows) the summed token loss (fp32 scalar). Empty for other families.
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> image_text_logits_function;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t)> image_text_loss_function;

  bool is_contrastive() const { return static_cast<bool>(contrastive_function); }
  bool reads_image_and_text() const { return static_cast<bool>(image_text_logits_function); }
  at::Tensor image_text_logits(const at::Tensor& images, const at::Tensor& ids) const { return image_text_logits_function(images, ids); }
  at::Tensor image_text_loss(const at::Tensor& images, const at::Tensor& ids, const at::Tensor& targets, int64_t chunk_rows) const {
    return image_text_loss_function(images, ids, targets, chunk_rows);
  }
  ClipOutput contrastive(const at::Tensor& images, const at::Tensor& ids) const {
    auto [image, text, scale] = contrastive_function(images, ids);
    return {image, text, scale};
  }
  bool has_loss_sum() const { return static_cast<bool>(loss_sum_function); }
  at::Tensor loss_sum(const at::Tensor& ids, const at::Tensor& targets, int64_t chunk_rows, const at::Tensor& positions = {}) const {
    return loss_sum_function(ids, targets, chunk_rows, positions);
  }
};
BuiltModel build_model(const ModelConfig& config);

}  // namespace fsdp::models
