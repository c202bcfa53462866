// fsdp/train/construction_check.h: fsdp-train --check. A config read as a run reads it, its model
// constructed and sharded at the job's rank count on the meta device (train/sharded_model.h), and
// what was built compared with what the planner counts for it.
//
//   mpirun -np 8 fsdp-train configs/plan/llama3-70b-qlora.toml --check   # seconds, no memory
//
// What it shows beyond fsdp-plan: the config passes the checks fsdp-train makes before a run
// (keys, the batch over the ranks, hybrid groups, LoRA targets, the data and its sizes, an image-
// text model's chats, the wrap policy selecting real modules, ties), the real code builds the model and its
// units at the real size, and the planner's formulas count the same parameters, trainable ones,
// units and recomputed blocks as that model holds. Not checked: model.init_from's weights (only its
// config.json is read), the device itself. The data is read where every file it names is on this
// machine; else a note names the missing one and the model keeps its own vocabulary. Nothing is
// written. A refusal stops every rank together (comm::agree_on_failure).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/model_config.h"
#include "fsdp/plan/memory_plan.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/train/config.h"

namespace fsdp::train {

struct ConstructionCheck {
  int ranks = 1;
  models::ModelConfig model;       // as built: the data's vocabulary given
  std::vector<std::string> notes;  // what the check could not see here (the data, this build's device)
  // The model as built, every rank alike.
  int64_t parameters = 0, trainable = 0;
  int64_t units = 0;             // FSDP units, the root not counted
  int64_t recomputed_units = 0;  // blocks whose backward recomputes their forward
  runtime::MemoryStats memory;   // per rank, as the runtime accounts it (bytes of the shards as stored)
  // The plan of the same config at the same rank count; planned false where the planner does not
  // model the config (planned_why says why).
  bool planned = false;
  std::string planned_why;
  plan::Plan plan;
  std::vector<std::string> disagreements;  // "parameters: built 7,000, planned 7,100", ...
  bool agrees() const { return disagreements.empty(); }
};

// Collective over `world` (every rank builds its shards; host collectives are real). Throws as a
// run would on a config it refuses (ConfigError, std::invalid_argument from the runtime).
ConstructionCheck check_construction(const TrainConfig& config, const comm::ProcessGroupPtr& world);

// What `built` counts otherwise than `plan` (parameters, adapters, units, recomputed blocks), each
// as "what: built X, planned Y"; empty when they agree. check_construction fills disagreements so.
std::vector<std::string> compare_with_plan(const ConstructionCheck& built, const plan::Plan& plan);

// The check's report, for rank 0 to print: what was built, what the plan says, the notes.
std::string describe(const ConstructionCheck& check, const TrainConfig& config);

}  // namespace fsdp::train
