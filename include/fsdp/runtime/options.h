// fsdp/runtime/options.h: how fully_shard shards a model (strategy, units, precision, prefetch
// budget, placement).
#pragma once

#include <ATen/core/TensorBody.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>

#include "fsdp/runtime/sharding_settings.h"
#include "fsdp/runtime/wrap_policy.h"

namespace fsdp::runtime {

// The user's sharding choices (sharding_settings.h: strategy, prefetch depth, precision,
// activation checkpointing, offload), and what the runtime needs besides: which modules are units,
// where buffers live, how frozen parameters are stored.
struct FsdpOptions : ShardingSettings {
  WrapPolicy wrap_policy;
  // Overwrite every rank's initial parameters and buffers with rank 0's. Off: verify they agree
  // (checksum).
  bool sync_module_states = false;
  // Keep freed unsharded buffers for reuse (shard/storage.h), up to the budget's peak:
  // 2 x root + (K + 2) x largest unit, in fp32 bytes. Off: every free returns memory to the OS.
  bool cache_buffers = true;
  // Where shards and gathered buffers live. Parameters built elsewhere (a model is built on the
  // CPU, block by block) move here as their unit is sharded, so the whole model never sits on the
  // device unsharded. A CUDA device needs a NCCL process group (comm/nccl_process_group.h).
  at::Device device = at::kCPU;
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
  // micro-batch). The apps' tcmalloc reuses freed blocks instead (its cache measured 15-38 MiB
  // above the live bytes, shard/host_heap.h): the guard then bounds what is left. 0: never.
  int64_t host_heap_trim_allowance = int64_t{128} << 20;
};

}  // namespace fsdp::runtime
