#include "fsdp/plan/plan_fit.h"

#include <algorithm>
#include <stdexcept>

#include "fsdp/enum_names.h"

namespace fsdp::plan {

namespace {

using runtime::ShardingStrategy;

// One combination of the searched settings. checkpoint_every 0: activation checkpointing off.
struct Settings {
  ShardingStrategy strategy;
  int64_t checkpoint_every;
  int64_t micro_batches;
  bool cpu_offload;
  models::LoraBaseDtype base_dtype;
  int64_t max_inflight;  // K as planned (PlanInput::prefetch_depth)
  int64_t loss_chunk;
};

Settings settings_of(const PlanInput& in) {
  return {in.strategy,         in.activation_checkpointing ? in.activation_checkpointing_every : 0,
          in.micro_batches,    in.cpu_offload,
          in.lora_base_dtype,  in.prefetch_depth(),
          in.loss_chunk_tokens};
}

PlanInput with_settings(PlanInput in, const Settings& s) {
  const int64_t samples = in.micro_batch * in.micro_batches;  // per rank per step, kept
  in.strategy = s.strategy;
  in.activation_checkpointing = s.checkpoint_every > 0;
  in.activation_checkpointing_every = std::max<int64_t>(1, s.checkpoint_every);
  in.micro_batches = s.micro_batches;
  in.micro_batch = samples / s.micro_batches;
  in.cpu_offload = s.cpu_offload;
  in.lora_base_dtype = s.base_dtype;
  in.max_inflight = s.max_inflight;
  in.prefetch = s.max_inflight > 0;
  in.loss_chunk_tokens = s.loss_chunk;
  return in;
}

// The values each setting takes: the base's alone when fixed or when it does not apply.
struct Choices {
  std::vector<ShardingStrategy> strategies;
  std::vector<int64_t> checkpoint_every, micro_batches, loss_chunks;
  std::vector<bool> offload;
  std::vector<models::LoraBaseDtype> base_dtypes;
  std::vector<int64_t> max_inflight;
};

Choices choices_for(const FitRequest& r, int64_t layers) {
  const PlanInput& in = r.base;
  const Settings base = settings_of(in);
  const auto searched = [&](FitSetting s) { return r.fixed.count(s) == 0; };
  Choices c;
  c.strategies = {base.strategy};
  if (searched(FitSetting::Strategy)) {
    c.strategies = {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard};
    if (in.ranks > in.ranks_per_node && in.ranks % in.ranks_per_node == 0) {
      c.strategies.push_back(ShardingStrategy::HybridShard);
    }
  }
  c.checkpoint_every = {base.checkpoint_every};
  if (searched(FitSetting::ActivationCheckpointing) && layers > 0) {
    c.checkpoint_every = {0};
    for (int64_t k : {1, 2, 4}) {
      if (k <= layers) c.checkpoint_every.push_back(k);
    }
  }
  c.micro_batches = {base.micro_batches};
  if (searched(FitSetting::MicroBatches)) {
    c.micro_batches.clear();
    const int64_t samples = in.micro_batch * in.micro_batches;
    for (int64_t m = 1; m <= samples; ++m) {
      if (samples % m == 0) c.micro_batches.push_back(m);
    }
  }
  c.offload = {base.cpu_offload};
  if (searched(FitSetting::CpuOffload) && !in.cpu) c.offload = {false, true};  // offload moves GPU memory to host
  c.base_dtypes = {base.base_dtype};
  const models::LoraSpec* lora = models::lora_spec(in.model);
  if (searched(FitSetting::LoraBaseDtype) && lora != nullptr && lora->enabled()) {
    c.base_dtypes = {models::LoraBaseDtype::BFloat16, models::LoraBaseDtype::Float32, models::LoraBaseDtype::Nf4};
  }
  c.max_inflight = {base.max_inflight};
  if (searched(FitSetting::MaxInflight)) c.max_inflight = {0, 1, 2, 4};
  c.loss_chunks = {base.loss_chunk};
  if (searched(FitSetting::LossChunk) && models::is_language_model(in.model)) c.loss_chunks = {0, 4096, 1024, 256};
  return c;
}

// What moving away from the user's settings costs in the order (plan_fit.h): 1% a setting, 10% for NF4.
double change_cost(const Settings& base, const Settings& s) {
  double cost = 0;
  cost += s.strategy != base.strategy ? 0.01 : 0;
  cost += s.checkpoint_every != base.checkpoint_every ? 0.01 : 0;
  cost += s.micro_batches != base.micro_batches ? 0.01 : 0;
  cost += s.cpu_offload != base.cpu_offload ? 0.01 : 0;
  if (s.base_dtype != base.base_dtype) cost += s.base_dtype == models::LoraBaseDtype::Nf4 ? 0.10 : 0.01;
  cost += s.max_inflight != base.max_inflight ? 0.01 : 0;
  cost += s.loss_chunk != base.loss_chunk ? 0.01 : 0;
  return cost;
}

FitCandidate candidate(const FitRequest& r, const Plan& plan, double cost) {
  FitCandidate c;
  c.plan = plan;
  const PlanInput& in = plan.input;
  c.step_seconds = in.prefetch_depth() > 0 ? plan.step_seconds_overlapped : plan.step_seconds_serial;
  if (in.cpu_offload) {
    // Each gather starts from the host's parameter shard (forward, and again in backward unless
    // shard_grad_op keeps the unit); the gradient shard goes back once a step.
    const int gathers = in.strategy == ShardingStrategy::ShardGradOp ? 1 : 2;
    const double bytes = static_cast<double>(gathers * plan.memory.parameters + plan.memory.gradients);
    c.offload_seconds = bytes / r.host_link_bytes_per_second;
  }
  c.rank_seconds = (c.step_seconds + c.offload_seconds) * (1.0 + cost);
  c.peak_bytes = in.cpu ? plan.peak_bytes : plan.memory.device_total();
  return c;
}

}  // namespace

const char* fit_setting_name(FitSetting setting) {
  switch (setting) {
    case FitSetting::Strategy: return "strategy";
    case FitSetting::ActivationCheckpointing: return "activation checkpointing";
    case FitSetting::MicroBatches: return "micro-batches";
    case FitSetting::CpuOffload: return "CPU offload";
    case FitSetting::LoraBaseDtype: return "LoRA base dtype";
    case FitSetting::MaxInflight: return "prefetch depth";
    case FitSetting::LossChunk: return "loss chunk";
  }
  return "?";
}

const std::vector<FitSetting>& all_fit_settings() {
  static const std::vector<FitSetting> all = {FitSetting::Strategy,      FitSetting::ActivationCheckpointing,
                                              FitSetting::MicroBatches,  FitSetting::CpuOffload,
                                              FitSetting::LoraBaseDtype, FitSetting::MaxInflight,
                                              FitSetting::LossChunk};
  return all;
}

FitResult fit_plans(const FitRequest& r) {
  if (r.memory_bytes <= 0) throw std::invalid_argument("--fit needs a memory per rank above 0");
  if (r.base.compute_flops <= 0 || r.base.bandwidth_bytes <= 0) {
    throw std::invalid_argument("--fit ranks plans by step time: it needs a compute rate and a bandwidth");
  }
  const Plan base_plan = make_plan(r.base);  // the user's own settings must plan (else their error)
  const Settings base = settings_of(r.base);
  const Choices c = choices_for(r, base_plan.layers);

  FitResult result;
  bool have_smallest = false;
  for (ShardingStrategy strategy : c.strategies)
    for (int64_t every : c.checkpoint_every)
      for (int64_t micro_batches : c.micro_batches)
        for (bool offload : c.offload)
          for (models::LoraBaseDtype dtype : c.base_dtypes)
            for (int64_t inflight : c.max_inflight)
              for (int64_t chunk : c.loss_chunks) {
                const Settings s{strategy, every, micro_batches, offload, dtype, inflight, chunk};
                if (offload && strategy == ShardingStrategy::NoShard) continue;  // offload moves shards
                Plan plan;
                try {
                  plan = make_plan(with_settings(r.base, s));
                } catch (const std::invalid_argument&) {
                  continue;  // a combination the runtime does not build (NF4 without linear weights, ...)
                }
                ++result.searched;
                FitCandidate fc = candidate(r, plan, change_cost(base, s));
                if (!have_smallest || fc.peak_bytes < result.smallest.peak_bytes) {
                  result.smallest = fc;
                  have_smallest = true;
                }
                if (fc.peak_bytes <= r.memory_bytes) result.fitting.push_back(std::move(fc));
              }
  std::stable_sort(result.fitting.begin(), result.fitting.end(), [](const FitCandidate& a, const FitCandidate& b) {
    if (a.rank_seconds != b.rank_seconds) return a.rank_seconds < b.rank_seconds;
    return a.peak_bytes < b.peak_bytes;
  });
  return result;
}

}  // namespace fsdp::plan
