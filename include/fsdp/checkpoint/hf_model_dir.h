// fsdp/checkpoint/hf_model_dir.h: a Hugging Face model directory, the way the hub shares a model:
//   config.json                      the family (model_type) and every size
//   model.safetensors                the weights, or model-0000K-of-0000N.safetensors files with
//   model.safetensors.index.json     the index naming each tensor's file (hf_weights.h reads both)
//   generation_config.json           bos/eos ids for generation
//   tokenizer.json, tokenizer_config.json, special_tokens_map.json   (or GPT-2's vocab.json and
//                                    merges.txt)
//
// Each family with a Hugging Face form reads and writes its own config.json (models::ModelFamily:
// hf_model_types, read_hf_config, write_hf_config; fsdp-train --list-models). Whatever
// changes the computation and is not implemented (another model_type, biases on a decoder's
// projections, another activation, another rope_scaling type, ...) is refused naming the key; keys
// that do not change it (torch_dtype, bos_token_id, architectures, ...) are ignored.
#pragma once

#include <string>
#include <vector>

#include "fsdp/models/registry.h"

namespace fsdp::checkpoint {

// True when `path` is a directory holding a config.json.
bool is_hf_model_dir(const std::string& path);

// The model a config.json describes (a directory or the file itself). Throws std::runtime_error
// naming the file and the key that is missing, malformed or unsupported.
models::ModelConfig read_hf_config(const std::string& dir_or_file);

// The text of a config.json that transformers' from_pretrained reads back as the same model.
// `source_config`, the config.json the model came from ("" or a missing file: none), lends the
// keys that describe the tokenizer rather than the network (bos/eos/pad ids).
// torch_dtype names the weights' dtype ("float32" or "bfloat16").
std::string hf_config_text(const models::ModelConfig& model, const std::string& source_config = "",
                           const std::string& torch_dtype = "float32");
// generation_config.json: bos and eos ids from `source_config` where it has them, else these
// (negative: left out); `extra_eos` (the chat format's end of turn) join eos_token_id as a list.
std::string hf_generation_config_text(const std::string& source_config, int64_t bos_token_id, int64_t eos_token_id,
                                      const std::vector<int64_t>& extra_eos = {});

// The tokenizer files that exist in `dir` (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, vocab.json, merges.txt), as full paths.
std::vector<std::string> tokenizer_files_in(const std::string& dir);

// Writes `text` to `path` atomically (a temporary file renamed into place).
void write_text_file(const std::string& path, const std::string& text);

}  // namespace fsdp::checkpoint
