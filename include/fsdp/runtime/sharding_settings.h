// fsdp/runtime/sharding_settings.h: the sharding choices a user makes ([fsdp] in a config,
// fsdp-plan's flags), declared once. The runtime's FsdpOptions, the planner's PlanInput and the
// config's FsdpConfig are each these settings plus their own (a wrap policy and a device; a model
// and a machine; how units are chosen), so a setting travels from the config to both as a typed
// value, copied whole (train::fsdp_options, train::plan_input), never re-declared or re-parsed.
//
// To add a setting: a member below and its line in for_each_sharding_setting. The config then
// reads, checks the type of, writes and lists it as fsdp.<name>; the runtime and the planner
// receive it. What else it touches is the code that uses it (see docs/architecture.md).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "fsdp/runtime/dtype_names.h"
#include "fsdp/runtime/sharding_strategy.h"

namespace fsdp::runtime {

struct ShardingSettings {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  // HybridShard only: S, the ranks of one shard group; S divides the world size N and there are
  // R = N / S replica groups. 0: the ranks of one node (the launcher's local world size).
  int64_t shard_group_size = 0;
  // Gather the next units while this one computes, in both passes (the order is the first
  // step's, recorded).
  bool prefetch = true;
  // K: unit buffers alive besides the computing unit's (prefetched gathers, reductions in flight).
  // 0: no prefetch, and every reduction is waited for at once.
  int64_t max_inflight = 2;
  // Mixed precision. float16 compute needs loss scaling (optim/loss_scaler.h) for gradients that
  // fp16's range would flush to zero; the runtime itself only casts. Shards stay fp32 (the master
  // weights) whatever these say.
  at::ScalarType param_dtype = at::kFloat;   // gather and compute: float32, bfloat16 or float16
  at::ScalarType reduce_dtype = at::kFloat;  // gradient reduction: float32, bfloat16 or float16
  // Recompute blocks' forward in backward: every unit that is a block (added with
  // fsdp::nn::push_block), or with activation_checkpointing_every = k every k-th block only (the
  // k-th, 2k-th, ... in model order, as torchtitan's selective_ac_option = k).
  bool activation_checkpointing = false;
  int64_t activation_checkpointing_every = 1;
  // Sharded parameters, gradients and optimizer state in host memory, the optimizer step on the
  // CPU (shard/flat_param.h, set_cpu_offload). For a GPU device; on the CPU it only adds copies.
  bool cpu_offload = false;
};

// Each setting's name (its config key is fsdp.<name>), member and one line of help, in the order
// --list-keys shows them. An enum's help is shown after its names ("full_shard | ...: ").
template <class Visit>
void for_each_sharding_setting(Visit&& visit) {
  using S = ShardingSettings;
  visit("strategy", &S::strategy,
        "how parameters, gradients and optimizer state are split (ZeRO-3, ZeRO-2, DDP, HSDP)");
  visit("shard_group_size", &S::shard_group_size, "hybrid_shard: ranks per shard group S, N = R x S (0: one node's)");
  visit("prefetch", &S::prefetch, "gather the next units while this one computes (both passes)");
  visit("max_inflight", &S::max_inflight, "unit buffers alive besides the computing one (0: no overlap)");
  visit("param_dtype", &S::param_dtype,
        "gathers and compute (fp32 master shards; float16 scales the loss, [loss_scale])");
  visit("reduce_dtype", &S::reduce_dtype, "gradient reduction (float16 with float16 compute only)");
  visit("activation_checkpointing", &S::activation_checkpointing, "recompute each block's forward in backward");
  visit("activation_checkpointing_every", &S::activation_checkpointing_every,
        "with activation_checkpointing: recompute every k-th block only (k-th, 2k-th, ...; 1: all)");
  visit("cpu_offload", &S::cpu_offload, "cuda: shards, gradients, AdamW state in pinned host memory");
}

}  // namespace fsdp::runtime
