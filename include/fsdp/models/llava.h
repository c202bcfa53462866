// fsdp/models/llava.h: LLaVA (Liu et al. 2023) as transformers' LlavaForConditionalGeneration
// computes it: a CLIP image tower read at one of its middle blocks (vision_feature_layer, -2: the
// output of the last block but one), its patch tokens (the class token dropped: strategy
// "default") mapped by a two-layer MLP projector (linear_1, exact gelu, linear_2, with biases) to
// the language model's width, and a Llama that reads them in place of the image tokens of its input:
//
//   ids   [b, t] int64, each row holding image_tokens() copies of image_token (the processor's
//         expansion of "<image>"), anywhere in the row
//   images [b, channels, size, size] fp32, one per row
//   -> the Llama's input embeddings with the projected features [b * image_tokens(), text dim]
//      scattered over the image tokens' rows in order (masked_scatter, as transformers does)
//
// Module names are transformers 5's save format (vision_tower.encoder.layers.<i>...,
// multi_modal_projector.linear_1, language_model.layers.<i>... for its language_model.model.*,
// language_model.lm_head); the hub's older vision_tower.vision_model.* names load too
// (checkpoint/hf_weights.cpp). Vision blocks after the one read, and post_layernorm, are kept
// (a directory holds them) but frozen: nothing reads them, so they get no gradient.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "fsdp/models/clip.h"
#include "fsdp/models/llama.h"

namespace fsdp::models {

class ModelFamily;

struct LlavaConfig {
  // The image tower: image_size, patch, channels, vision (its shape) and norm_eps of a CLIP config;
  // its text fields are not used.
  ClipConfig vision;
  // The language model; its vocabulary holds image_token. text.lora: adapters on its linear layers.
  LlamaConfig text;
  int64_t image_token = 257;
  // transformers' index into the tower's hidden_states (0: the embeddings after pre_layrnorm, k: the
  // output of block k; negative: from the end, -1 the last block's output).
  int64_t vision_feature_layer = -2;
  bool keep_class_token = false;  // vision_feature_select_strategy "full" (true) or "default"
  // A frozen image tower gets no gradient and no optimizer state (LLaVA's usual setting).
  bool freeze_vision = false;

  static const ModelFamily& family();  // its spec (llava_family.cpp)
  void validate() const;               // throws std::invalid_argument naming the bad field
  int64_t read_blocks() const;         // vision blocks run: vision_feature_layer as a count from the start
  int64_t image_tokens() const { return vision.patches() + (keep_class_token ? 1 : 0); }
  int64_t parameter_count() const;
  // Training FLOPs of one example of seq text positions (image tokens included): the image tower's
  // read blocks, the projector, and the Llama's flops_per_token(seq) for each position.
  double flops_per_example(int64_t seq) const;
};

// linear_2(gelu(linear_1(features))): [.., vision dim] -> [.., text dim].
struct LlavaProjectorImpl : torch::nn::Module {
  LlavaProjectorImpl(int64_t vision_dim, int64_t text_dim);
  at::Tensor forward(const at::Tensor& features);
  torch::nn::Linear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(LlavaProjector);

struct LlavaImpl : torch::nn::Module {
  explicit LlavaImpl(const LlavaConfig& config);
  // images, ids as above -> logits [b, t, vocab] in the compute dtype.
  at::Tensor forward(const at::Tensor& images, const at::Tensor& ids);
  // ... and targets [b, t] (-100: not counted; typically the answer's tokens only) -> the summed
  // token loss, fp32 scalar, through the chunked head.
  at::Tensor forward(const at::Tensor& images, const at::Tensor& ids, const at::Tensor& targets,
                     const ChunkedLoss& chunks);
  const LlavaConfig& config() const { return config_; }

  ClipVisionTransformer vision_tower{nullptr};
  LlavaProjector multi_modal_projector{nullptr};
  Llama language_model{nullptr};

 private:
  at::Tensor input_embeddings(const at::Tensor& images, const at::Tensor& ids);  // -> [b, t, text dim]
  LlavaConfig config_;
};
TORCH_MODULE(Llava);

}  // namespace fsdp::models
