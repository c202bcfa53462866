#include "fsdp/train/construction_check.h"

#include <torch/torch.h>

#include <cstdio>
#include <stdexcept>

#include "fsdp/comm/agreement.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/planning.h"
#include "fsdp/train/reporting.h"
#include "fsdp/train/sharded_model.h"
#include "training_data.h"

namespace fsdp::train {
namespace {

// Whether every rank has the config's data here: one all-reduce, so that every rank reads it or
// none does (a run planned for another machine). `missing` names what this rank lacks.
bool data_here_on_every_rank(const TrainConfig& config, const comm::ProcessGroupPtr& world, std::string& missing) {
  missing = missing_data_path(config);
  at::Tensor lacking = at::full({1}, missing.empty() ? 0 : 1, at::kLong);
  world->all_reduce(lacking, comm::ReduceOp::Max)->wait();
  if (lacking.item<int64_t>() != 0 && missing.empty()) missing = "a file another rank lacks";
  return lacking.item<int64_t>() == 0;
}

// The check on this rank; throws as a run would on what it refuses.
ConstructionCheck check_on_this_rank(const TrainConfig& config, const comm::ProcessGroupPtr& world) {
  ConstructionCheck check;
  check.ranks = world->size();
  try {
    check_this_build_runs(config);
  } catch (const ConfigError& e) {
    check.notes.push_back(std::string(e.what()) + ": the config is checked all the same");
  }
  bool plannable = true;
  try {
    plan_input(config, check.ranks);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    check.planned_why = e.what();  // fsdp.wrap = "tower", say: the model is still built
    plannable = false;
  }
  // The data as the run reads and checks it, where it is here; else the config's own model.
  std::string missing;
  plan::PlanInput in;
  check.model = config.model;
  if (data_here_on_every_rank(config, world, missing)) {
    const LoadedData data = load_data(config);
    check_data_sizes(data, config, check.ranks);
    if (models::is_language_model(config.model)) check.model = resolve_model(config, data.vocab);
    if (plannable) in = plan_input_with_data(config, check.ranks, data);
  } else {
    check.notes.push_back("'" + missing +
                          "' is not on this machine: the model is built as the config gives it (a language model "
                          "with its own vocabulary), and the data is neither read nor counted");
    if (plannable) in = plan_input(config, check.ranks);
  }
  TrainConfig resolved = config;
  resolved.model = check.model;
  const int64_t vocab = models::is_language_model(check.model) ? models::vocab_size(check.model) : 0;
  const ShardedModel sharded = construct_on_meta_device(resolved, vocab, world);

  for (shard::FlatParam* flat : sharded.state->flat_params()) {
    check.parameters += flat->layout().numel;
    if (flat->trainable()) check.trainable += flat->layout().numel;
  }
  check.units = static_cast<int64_t>(sharded.state->unit_names().size()) - 1;  // the root is last
  check.recomputed_units = static_cast<int64_t>(sharded.state->recomputed_unit_names().size());
  check.memory = sharded.state->memory_stats();
  if (!plannable) return check;
  try {
    check.plan = plan::make_plan(in);
    check.planned = true;
  } catch (const std::invalid_argument& e) {
    check.planned_why = e.what();  // a family the planner does not model yet
    return check;
  }
  check.disagreements = compare_with_plan(check, check.plan);
  return check;
}

}  // namespace

ConstructionCheck check_construction(const TrainConfig& config, const comm::ProcessGroupPtr& world) {
  ConstructionCheck check;
  // Every rank stops together on a refusal, one of them saying why.
  comm::on_every_rank(world, "checking the config", [&] { check = check_on_this_rank(config, world); });
  return check;
}

std::vector<std::string> compare_with_plan(const ConstructionCheck& built, const plan::Plan& p) {
  std::vector<std::string> disagreements;
  auto compare = [&](const char* what, int64_t counted, int64_t planned) {
    if (counted != planned) {
      disagreements.push_back(std::string(what) + ": built " + format_thousands(counted) + ", planned " +
                              format_thousands(planned));
    }
  };
  // The plan counts a LoRA run's base (parameters) and its adapters (adapter_params) apart.
  const models::LoraSpec* lora = models::lora_spec(p.input.model);
  const bool adapters = lora != nullptr && lora->enabled();
  compare("parameters", built.parameters, p.parameters + (adapters ? p.adapter_params : 0));
  compare(adapters ? "trainable (the adapters)" : "trainable", built.trainable, p.trainable_params);
  const int64_t planned_units =
      p.layers + (p.embedding_params > 0 ? 1 : 0) + (p.head_params > 0 ? 1 : 0) + p.other_units;
  compare("units (blocks, and the embeddings and head where they are units of their own)", built.units, planned_units);
  const int64_t planned_recomputed =
      p.input.activation_checkpointing ? p.layers / std::max<int64_t>(1, p.input.activation_checkpointing_every) : 0;
  compare("blocks recomputed in backward", built.recomputed_units, planned_recomputed);
  return disagreements;
}

std::string describe(const ConstructionCheck& check, const TrainConfig& config) {
  std::string out;
  auto line = [&](const std::string& text) { out += text + "\n"; };
  const std::string model = config.model_name.empty() ? models::family_name(check.model) : config.model_name;
  line("fsdp-train --check " + config.source + ": accepted at " + std::to_string(check.ranks) + " rank" +
       (check.ranks == 1 ? "" : "s") + (check.agrees() ? "" : ", but not as planned (below)"));
  line("  model " + model + " (" + models::family_name(check.model) + "): " + format_thousands(check.parameters) +
       " parameters, " + format_thousands(check.trainable) + " trainable");
  line("  constructed on the meta device and sharded: " + std::to_string(check.units) + " units and the root, " +
       std::to_string(check.recomputed_units) + " recomputed in backward");
  line("  per rank, as stored: parameter shards " +
       format_bytes(static_cast<double>(check.memory.sharded_param_bytes)) + ", gradient shards " +
       format_bytes(static_cast<double>(check.memory.sharded_grad_bytes)) + ", largest unit gathered " +
       format_bytes(static_cast<double>(check.memory.largest_unit_bytes)));
  if (!check.planned) {
    line("  the plan: not made (" + check.planned_why + ")");
  } else if (check.agrees()) {
    line("  the plan counts the same parameters, trainable ones, units and recomputed blocks; its peak per rank: " +
         format_bytes(static_cast<double>(check.plan.peak_bytes)) + " (" + format_thousands(check.plan.peak_bytes) +
         " bytes)");
  } else {
    line("  the plan counts otherwise than the model built:");
    for (const std::string& d : check.disagreements) line("    " + d);
  }
  for (const std::string& note : check.notes) line("  note: " + note);
  return out;
}

}  // namespace fsdp::train
