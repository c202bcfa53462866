// fsdp/checkpoint/peft_adapter.h: LoRA adapters in PEFT's format, the directory peft's
// save_pretrained writes and PeftModel.from_pretrained loads:
//   adapter_config.json         r, lora_alpha, lora_dropout, use_rslora, target_modules (a list of
//                               layer names, or "all-linear"), bias "none", task_type,
//                               base_model_name_or_path, fan_in_fan_out (true for GPT-2's Conv1D)
//   adapter_model.safetensors   base_model.model.<the HF name of the layer>.lora_A.weight [r, in],
//                               ...lora_B.weight [out, r]; Llama "model.layers.N.self_attn.q_proj",
//                               GPT-2 "transformer.h.N.attn.c_attn" (neither stored transposed)
// Written from a trained model (fsdp-ckpt export --peft-dir) and read back to continue training one
// (lora.init_adapter).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/models/registry.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::checkpoint {

// What adapter_config.json says of the adapters.
struct PeftAdapterConfig {
  int64_t rank = 0;
  double alpha = 0.0;
  double dropout = 0.0;
  bool rslora = false;               // use_rslora: scale alpha / sqrt(r)
  std::vector<std::string> targets;  // layer names, or {"all-linear"}
  std::string base_model;            // base_model_name_or_path ("" when absent)
};

// True when `dir` holds adapter_config.json.
bool is_peft_adapter_dir(const std::string& dir);

// Reads DIR/adapter_config.json. Throws std::runtime_error naming the file and key for a missing
// file, invalid JSON, a peft_type other than LORA, r <= 0, a bias other than "none",
// target_modules that is neither a list of names nor "all-linear" (PEFT reads any other string as a
// regular expression over module paths, which fsdp.cpp does not), and any setting that changes
// what the adapter computes and fsdp.cpp does not implement (use_dora, modules_to_save,
// rank_pattern, alpha_pattern, layers_to_transform, ...: every key it does not know, unless null,
// false or empty), so an adapter is never loaded as something it is not.
PeftAdapterConfig read_peft_adapter_config(const std::string& dir);

// The adapter's tensor name for our adapter parameter `name` (".lora_A." or ".lora_B." in it).
std::string peft_tensor_name(const models::ModelConfig& model, const std::string& name);

// Collective. The model's adapters in `dir` (created; fp32 tensors). Returns the bytes of tensor
// data written (on rank 0). Throws std::invalid_argument for a model without adapters.
int64_t export_peft_adapter(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& dir,
                            const std::string& base_model_name);

// Collective. Sets the model's adapters from DIR/adapter_model.safetensors, each rank reading the
// elements of its own shards. Throws on every rank, nothing changed, when a tensor is missing, has
// another shape than the model's layer (an adapter for another base: both shapes named), is not a
// float type, or when the file holds any tensor nothing here consumes (adapters for layers the
// model does not adapt, a DoRA magnitude, a trained lm_head from modules_to_save), naming it.
void import_peft_adapter(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& dir);

}  // namespace fsdp::checkpoint
