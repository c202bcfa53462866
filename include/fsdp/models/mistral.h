// fsdp/models/mistral.h: the Mistral family (Jiang et al. 2023): Llama's decoder (llama.h) with
// sliding-window attention (Mistral 7B v0.1: each position sees the 4096 latest; v0.2 and later:
// sliding_window 0, every earlier position) and a head width of its own where a model sets one
// (Mistral NeMo's 128 beside a 5120-wide stream). Its Hugging Face form is MistralForCausalLM
// (model_type "mistral"), whose tensor names are Llama's.
#pragma once

#include "fsdp/models/llama.h"

namespace fsdp::models {

struct MistralConfig : LlamaConfig {
  MistralConfig() {
    sliding_window = 4096;
    rope_theta = 10000.0;
  }
  static const ModelFamily& family();  // its spec (mistral_family.cpp)
  void validate() const { validate_as("mistral"); }
};

}  // namespace fsdp::models
