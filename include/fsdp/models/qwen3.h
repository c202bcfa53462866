// fsdp/models/qwen3.h: the Qwen3 family (dense models; Qwen team 2025): Llama's decoder (llama.h)
// with an RMSNorm over each head of q and k before rotary (q_norm, k_norm), heads 128 wide whatever
// the stream's width (head_dim), no biases, rotary base 1e6, RMSNorm epsilon 1e-6; the sizes up to
// 4B tie the output head to the embedding. Its Hugging Face form is Qwen3ForCausalLM (model_type
// "qwen3"), whose tensor names are Llama's and self_attn.q_norm, self_attn.k_norm.
#pragma once

#include "fsdp/models/llama.h"

namespace fsdp::models {

struct Qwen3Config : LlamaConfig {
  Qwen3Config() {
    qk_norm = true;
    head_dim = 128;
    rope_theta = 1000000.0;
    norm_eps = 1e-6;
  }
  static const ModelFamily& family();  // its spec (qwen3_family.cpp)
  void validate() const { validate_as("qwen3"); }
};

}  // namespace fsdp::models
