// fsdp/plan/plan_fit.h: "what should I set to fit this memory?" (fsdp-plan --fit). Searches the
// settings that trade memory for time, each plan made by make_plan, and ranks the ones that fit:
//   sharding strategy        full_shard, shard_grad_op, no_shard, hybrid_shard (N > ranks per node)
//   activation checkpointing off, or every k-th block for k = 1, 2, 4
//   micro-batches            the divisors of the samples a rank takes per step (gradient accumulation)
//   CPU offload              off or on (GPU runs only)
//   LoRA base dtype          bfloat16, float32, nf4 (with adapters)
//   prefetch depth           max_inflight 0, 1, 2, 4
//   loss chunk               0 (whole logits), 4096, 1024, 256 tokens (language models)
// A setting the user fixed (a flag or a key of the config) is not searched.
//
// Ranked by the step time make_plan estimates, with what it leaves out added: no prefetch
// (max_inflight 0) pays communication and compute one after the other (the serial estimate);
// CPU offload copies the parameter shard to the device for each gather and the gradient shard
// back (host-link bandwidth); and each setting moved from the user's value costs 1% (10% for an
// NF4 base: its weights are quantized and decoded, a change of model, not only of memory), so that
// among plans of one estimated speed the one closest to what the user wrote comes first.
// Equal ranks go to the smaller peak.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fsdp/plan/memory_plan.h"

namespace fsdp::plan {

enum class FitSetting {
  Strategy,
  ActivationCheckpointing,
  MicroBatches,
  CpuOffload,
  LoraBaseDtype,
  MaxInflight,
  LossChunk
};

// "strategy", "activation checkpointing", ...: for the output's "searched" and "fixed" lists.
const char* fit_setting_name(FitSetting setting);
const std::vector<FitSetting>& all_fit_settings();

struct FitRequest {
  PlanInput base;            // the user's settings (and defaults); its rates rank the plans
  int64_t memory_bytes = 0;  // per rank: the device's, or on the CPU (PlanInput::cpu) the process's peak
  std::set<FitSetting> fixed;
  double host_link_bytes_per_second = 25e9;  // CPU offload's copies (PCIe 4 x16, about 25 GB/s)
};

struct FitCandidate {
  Plan plan;
  double step_seconds = 0;     // make_plan's overlapped estimate, or serial without prefetch
  double offload_seconds = 0;  // host-link copies of CPU offload
  double rank_seconds = 0;     // (step + offload) x (1 + the changes' costs): the order
  int64_t peak_bytes = 0;      // what is compared with the memory: device total, or Plan::peak_bytes on the CPU
};

struct FitResult {
  int64_t searched = 0;               // plans made (combinations make_plan refused are not counted)
  std::vector<FitCandidate> fitting;  // best first
  FitCandidate smallest;              // the plan of least peak, fitting or not (to say how far off)
};

// Throws std::invalid_argument when the base input cannot be planned or the memory is not positive;
// compute and bandwidth rates must be set on the base (the ranking needs them).
FitResult fit_plans(const FitRequest& request);

}  // namespace fsdp::plan
