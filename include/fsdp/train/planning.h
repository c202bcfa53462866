// fsdp/train/planning.h: a training config as fsdp-plan sees it: the model, strategy, dtypes,
// batch and sequence length of a run at `ranks` ranks, for plan::make_plan. fsdp-plan reads
// configs through it, and fsdp-train records the plan's per-rank memory beside what it measures.
#pragma once

#include "fsdp/plan/memory_plan.h"
#include "fsdp/train/config.h"

namespace fsdp::train {

// Throws ConfigError when the batch does not divide over `ranks` (validate_for_world).
plan::PlanInput plan_input(const TrainConfig& config, int ranks);

}  // namespace fsdp::train
