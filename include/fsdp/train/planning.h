// fsdp/train/planning.h: a training config as fsdp-plan sees it: the model, strategy, dtypes,
// batch and sequence length of a run at `ranks` ranks, for plan::make_plan. fsdp-plan reads
// configs through it, and fsdp-train records the plan's per-rank memory beside what it measures.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/plan/memory_plan.h"
#include "fsdp/plan/plan_fit.h"
#include "fsdp/train/config.h"

namespace fsdp::train {

// Throws ConfigError when the batch does not divide over `ranks` (validate_for_world). The data's
// bytes are left 0: fsdp-train sets them from the data it loaded, fsdp-plan through plan_input_for_run.
plan::PlanInput plan_input(const TrainConfig& config, int ranks);

// plan_input for the run fsdp-train would make of this config: reads and tokenizes the data as it
// does, for the model's vocabulary (a language model takes the data's) and the bytes the data holds
// in memory (data::Dataset::held_bytes). What the run's own prediction is made of. Throws as
// fsdp-train would when the data cannot be read.
plan::PlanInput plan_input_for_run(const TrainConfig& config, int ranks);

// plan_input_for_run where every file the config's data names is on this machine; where one is
// not (a run planned here for elsewhere), plan_input of the config alone, and `missing` names it.
// Data that is here but wrong throws as fsdp-train would.
plan::PlanInput plan_input_here(const TrainConfig& config, int ranks, std::string& missing);

// The config keys and TOML values that give a run `chosen`'s searched settings (fsdp-plan --fit's
// answer), for those not in `fixed`: ("fsdp.strategy", "\"full_shard\""), ... The inverse of
// plan_input for them: a config given these as --set overrides plans as `chosen` does.
std::vector<std::pair<std::string, std::string>> fit_config_values(const plan::PlanInput& chosen,
                                                                   const std::set<plan::FitSetting>& fixed);

// The settings a config fixes for --fit: those whose keys it gives (TrainConfig::keys_given).
std::set<plan::FitSetting> fit_settings_given(const TrainConfig& config);
// The searched settings these config keys ("fsdp.strategy", ...) fix: fsdp-plan's flags, named
// after the keys, fix the same ones.
std::set<plan::FitSetting> fit_settings_of_keys(const std::set<std::string>& keys);

}  // namespace fsdp::train
