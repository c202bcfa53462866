// Private to models/: the parts of one family's spec that another reuses for the config it holds
// inside its own (LLaVA is a CLIP image tower and a Llama): declared once, by the family that owns
// them.
#pragma once

#include <vector>

#include "fsdp/models/hf_config_reader.h"
#include "fsdp/models/model_family.h"

namespace fsdp::models {

// A Llama's shape and rotary fields (llama_family.cpp); LLaVA reads them for its language model.
std::vector<ModelField> llama_fields(LlamaConfig& c);
// A CLIP image tower's fields: patch, image_size, channels, vision_* (clip_family.cpp).
std::vector<ModelField> clip_image_tower_fields(ClipConfig& c);

// A Llama of this shape, every other field at its default (the zoo's sizes, LLaVA's language models).
LlamaConfig llama_shape(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                        int64_t context, double theta, bool tied);

// A Llama's config.json keys in and out (LlamaForCausalLM's, and LLaVA's text_config).
LlamaConfig llama_from_hf_config(const HfConfigReader& r);
nlohmann::json llama_hf_config(const LlamaConfig& c);
// A CLIP image tower's config.json keys (CLIPModel's and LLaVA's vision_config), with
// projection_dim (CLIPModel's) or without (LLaVA's).
nlohmann::json clip_vision_hf_config(const ClipConfig& c, bool with_projection);

}  // namespace fsdp::models
