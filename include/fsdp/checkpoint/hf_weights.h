// fsdp/checkpoint/hf_weights.h: full model weights as safetensors under Hugging Face's names, the
// way published checkpoints are shared, written and read by a sharded model.
//
// Names: GPT-2 as in the hub's gpt2 files (wte.weight, h.0.attn.c_attn.weight, ...; the attention,
// projection and MLP weights transposed, as Hugging Face's Conv1D stores them); Llama with the
// "model." prefix (model.layers.0.self_attn.q_proj.weight, ..., lm_head.weight); ViT as timm.
// Tensors a file holds beyond the model's (GPT-2's attn.bias masks, say) are ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/models/registry.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::checkpoint {

// Our parameter name -> the Hugging Face name, and whether HF stores the matrix transposed.
std::string hf_name(const models::ModelConfig& model, const std::string& name);
// Other spellings of the Hugging Face name `hf` that files in use hold (LLaVA: the hub's older
// vision_tower.vision_model.*, and transformers 5's model.* and lm_head); read when hf is absent.
std::vector<std::string> hf_other_names(const models::ModelConfig& model, const std::string& hf);
bool hf_transposed(const models::ModelConfig& model, const std::string& name);
// A LoRA adapter's parameter (".lora_A." or ".lora_B." in its name): not part of a base's weights.
bool is_adapter(const std::string& name);

struct ExportOptions {
  at::ScalarType dtype = at::kFloat;  // kFloat or kBFloat16
  // A model with LoRA adapters: write W + scale B A for each adapted weight (LoraSpec::scale), and
  // no adapters (PEFT's merge_and_unload). Each layer's delta exists only while its weight is
  // written, on the writing rank. Without it such a model is refused (export_peft_adapter, in
  // peft_adapter.h, writes them).
  bool merge_lora = false;
  // 0: one file `path`. Otherwise `path` is a directory receiving Hugging Face's sharded set:
  // model-00001-of-0000N.safetensors files of at most this many bytes (a larger tensor gets a file
  // of its own) and model.safetensors.index.json.
  int64_t max_file_bytes = 0;
};

// Collective. Gathers one FlatParam at a time (so no rank holds more than one unit gathered) and
// rank 0 streams it to disk. Returns the bytes of tensor data written (on rank 0).
int64_t export_weights(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& path,
                       const ExportOptions& options = {});

// The dtype a frozen base loaded from `path` keeps its values exactly in: bf16 when every floating
// tensor there is BF16, else fp32 (F16 is not a subset of bf16). For lora.base_dtype = "auto".
// Throws std::runtime_error for unreadable weights.
at::ScalarType stored_weights_dtype(const std::string& path);

// Whether `path`'s weights hold layers transformers saved 4-bit as NF4 through bitsandbytes
// (lora.base_dtype = "auto" then keeps them as NF4, bytes as they are). Throws std::runtime_error
// for unreadable weights.
bool stored_as_bnb_nf4(const std::string& path);

// Collective. Loads weights (a .safetensors file, or a directory with model.safetensors.index.json
// or a single model.safetensors) into the sharded model: each rank reads only the elements of its
// shards (whole tensors only where they are stored transposed). Throws on every rank, naming the
// file and tensor, for a missing tensor, a wrong shape or dtype, a 4-bit weight's incomplete or
// foreign quantization state, or an unreadable index or header: all are checked before any value is
// read, and nothing is changed then. A file failing while its values are read (truncated or changed
// since) leaves the model partly loaded; the error says so. Holds one weight's temporaries at a
// time beside the shards, not a second copy of them.
void import_weights(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& path);

}  // namespace fsdp::checkpoint
