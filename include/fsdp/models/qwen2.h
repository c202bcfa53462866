// fsdp/models/qwen2.h: the Qwen2 family (Qwen2 and Qwen2.5; Qwen team 2024): Llama's decoder
// (llama.h) with biases on q_proj, k_proj and v_proj (not o_proj), rotary base 1e6, RMSNorm epsilon
// 1e-6; the sizes up to 3B tie the output head to the embedding. Its Hugging Face form is
// Qwen2ForCausalLM (model_type "qwen2"), whose tensor names are Llama's.
#pragma once

#include "fsdp/models/llama.h"

namespace fsdp::models {

struct Qwen2Config : LlamaConfig {
  Qwen2Config() {
    qkv_bias = true;
    rope_theta = 1000000.0;
    norm_eps = 1e-6;
  }
  static const ModelFamily& family();  // its spec (qwen2_family.cpp)
  void validate() const { validate_as("qwen2"); }
};

}  // namespace fsdp::models
