// fsdp/train/sharded_model.h: a config's model, built and sharded block by block as it is built.
// What train() trains, and what fsdp-ckpt and the tests load checkpoints into.
#pragma once

#include <cstdint>
#include <memory>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/attention.h"
#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/registry.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/train/config.h"

namespace fsdp::train {

// The runtime's options a config's [fsdp] (and lora.base_dtype) ask for; the device is the CPU's.
runtime::FsdpOptions fsdp_options(const TrainConfig& config);

// The attention path train.attention asks for in the config's compute dtype, "auto" resolved:
// fused_fp32 for a lower-precision compute dtype on the CPU (libtorch 2.11's CPU flash backward
// in bf16 is 2-17x its fp32 one on the sequences measured, docs/benchmarks.md), fused otherwise.
models::AttentionPath attention_path_for(const TrainConfig& config);

// The way bf16 matmuls compute that train.bf16_matmul asks for, "auto" resolved: fp32 GEMMs on a
// CPU without bf16 instructions (runtime/cpu_features.h), native otherwise.
models::Bf16Matmul bf16_matmul_for(const TrainConfig& config);

struct ShardedModel {
  models::ModelConfig config;  // with the vocabulary given
  models::BuiltModel model;
  std::shared_ptr<runtime::FsdpState> state;
};
// Built with the config's seed on every rank (the CPU draws, whatever the device), sharded over
// `group` (train.device 'cuda': over NCCL, bootstrapped through `group`, one GPU per local rank),
// with the vocabulary given (language models). weights_loaded_after: the caller loads every
// frozen weight next (model.init_from, a checkpoint), so an NF4 base is not quantized from the
// random init (runtime::FsdpOptions::nf4_values_loaded_later).
ShardedModel build_sharded_model(const TrainConfig& config, int64_t vocab, const comm::ProcessGroupPtr& group,
                                 bool weights_loaded_after = false);

// The same model and units on the meta device (compat::MetaDeviceConstruction): every parameter,
// shard and gathered buffer has its real shape and dtype and no storage, nothing is drawn or
// quantized, and the collectives move nothing (comm/meta_device_group.h); the groups a strategy
// splits are real. For fsdp-train --check: a 70B model "built" in seconds in no memory.
ShardedModel construct_on_meta_device(const TrainConfig& config, int64_t vocab, const comm::ProcessGroupPtr& group);

}  // namespace fsdp::train
