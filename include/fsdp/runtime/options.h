// fsdp/runtime/options.h: how fully_shard shards a model (strategy, units, precision, prefetch
// budget, placement).
#pragma once

#include <ATen/core/TensorBody.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>

#include "fsdp/runtime/sharding_strategy.h"
#include "fsdp/runtime/wrap_policy.h"

namespace fsdp::runtime {

// float16 compute needs loss scaling (optim/loss_scaler.h) for gradients that fp16's range would
// flush to zero; the runtime itself only casts.
struct MixedPrecision {
  at::ScalarType param_dtype = at::kFloat;   // gather and compute: float32, bfloat16 or float16
  at::ScalarType reduce_dtype = at::kFloat;  // gradient reduction: float32, bfloat16 or float16
};

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  WrapPolicy wrap_policy;
  // Overwrite every rank's initial parameters and buffers with rank 0's. Off: verify they agree
  // (checksum).
  bool sync_module_states = false;
  MixedPrecision mixed_precision;
  bool forward_prefetch = true;
  bool backward_prefetch = true;
  // K: unit buffers alive besides the computing unit's (prefetched gathers, reductions in flight).
  // 0: no prefetch, and every reduction is waited for at once.
  int max_inflight = 2;
  bool activation_checkpointing = false;  // every unit that is a block (added with fsdp::nn::push_block)
  // With activation_checkpointing, every k-th block only (the k-th, 2k-th, ... in model order, as
  // torchtitan's selective_ac_option = k): 1 recomputes every block.
  int activation_checkpointing_every = 1;
  // Keep freed unsharded buffers for reuse (shard/storage.h), up to the budget's peak:
  // 2 x root + (K + 2) x largest unit, in fp32 bytes. Off: every free returns memory to the OS.
  bool cache_buffers = true;
  // HybridShard only: S, the ranks of one shard group; S divides the world size N and there are
  // R = N / S replica groups. 0: the ranks of one node (the launcher's local world size).
  int shard_group_size = 0;
  // Where shards and gathered buffers live. Parameters built elsewhere (a model is built on the
  // CPU, block by block) move here as their unit is sharded, so the whole model never sits on the
  // device unsharded. A CUDA device needs a NCCL process group (comm/nccl_process_group.h).
  at::Device device = at::kCPU;
  // Sharded parameters, gradients and optimizer state in host memory, the optimizer step on the CPU
  // (shard/flat_param.h, set_cpu_offload). For a GPU device; on the CPU it only adds copies.
  bool cpu_offload = false;
  // Storage dtype of frozen parameters' shards (a LoRA base: bf16 halves it); gathered in the
  // compute dtype. Trainable shards stay fp32 (the master weights).
  at::ScalarType frozen_dtype = at::kFloat;
  // QLoRA: frozen parameters this selects (by name inside their unit, and tensor) are stored as
  // bitsandbytes' NF4 (shard/nf4_storage.h), the unit's other frozen ones in frozen_dtype.
  // Meant for linear weights; empty: none. nf4_double_quant: bitsandbytes' compress_statistics.
  std::function<bool(const std::string& name, const at::Tensor& param)> frozen_nf4;
  bool nf4_double_quant = true;
  // The NF4 weights' values come from loading after construction (model.init_from): laid out, not
  // quantized from the random init (at 8 B that was minutes of a rank's start for bytes overwritten).
  bool nf4_values_loaded_later = false;
  // On the CPU: after a unit frees its gathered parameters, the heap's free pages go back to the OS
  // (shard::HeapGrowthGuard) once the process's resident memory has grown this much past where the
  // last trim left it. Activations under glibc's 32 MiB mmap threshold leave freed holes between
  // longer-lived blocks that stay resident: 1 GiB above the live bytes per rank in the 8 B QLoRA
  // run's backward (2026-12-05); with 256 MiB here, about 256 MiB (2026-12-06: the allowance is
  // what stays). Small models' holes stay under 128 MiB (39-81 MiB, docs/planning.md), so they
  // keep their pages (a trim then page faults: 15-27% fewer tokens/s when trimmed every
  // micro-batch). 0: never.
  int64_t host_heap_trim_allowance = int64_t{128} << 20;
};

}  // namespace fsdp::runtime
