// The planner's workload settings are declared once (plan/workload_settings.h): fsdp-plan makes a
// flag of each, and each names the config key a run gives it by. Here every one with a key is given
// a non-default value by that key, and the planner's input (train::plan_input) must show it: a
// setting whose key is misnamed, or dropped on the way to the planner, fails here, named. A new
// setting without a value below fails too, asking for one.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "fsdp/plan/memory_plan.h"
#include "fsdp/plan/workload_settings.h"
#include "fsdp/train/config.h"
#include "fsdp/train/planning.h"

namespace workload_settings_tests {

using fsdp::train::TrainConfig;

// A Llama with adapters on a GPU run (so lora.base_dtype applies; the base is random: float32 when
// "auto"), 8 samples a step.
TrainConfig config_with(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"train.device=cuda", "train.global_batch=8", "lora.rank=2",
                                  "lora.targets=\"all-linear\""};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return fsdp::train::parse_train_config("[model]\nname = \"llama-test\"\n", "test.toml", all);
}

// For each key, the --set that makes its setting differ from the base config's.
const std::map<std::string, std::vector<std::string>>& non_default_values() {
  static const std::map<std::string, std::vector<std::string>> values = {
      {"optimizer.name", {"optimizer.name=sgd"}},
      {"train.micro_batches", {"train.micro_batches=2"}},
      {"train.sync_each_micro_batch", {"train.sync_each_micro_batch=false"}},
      {"train.seq_len", {"train.seq_len=16"}},
      {"train.loss_chunk_tokens", {"train.loss_chunk_tokens=7"}},
      {"fsdp.embedding_units", {"fsdp.embedding_units=false"}},
      {"train.attention", {"train.attention=math"}},
      {"checkpoint.async", {"checkpoint.async=true", "checkpoint.every=10"}},
      {"lora.base_dtype", {"lora.base_dtype=nf4"}},
  };
  return values;
}

TEST(WorkloadSettings, EachComesToThePlannerFromItsConfigKey) {
  const fsdp::plan::PlanInput base = fsdp::train::plan_input(config_with({}), 2);
  int with_key = 0;
  fsdp::plan::for_each_workload_setting([&](const char* name, auto member, const char* key, const char*) {
    if (std::string(key).empty()) return;
    ++with_key;
    const auto value = non_default_values().find(key);
    ASSERT_NE(value, non_default_values().end())
        << name << " (" << key << "): add a value that changes it to non_default_values()";
    const fsdp::plan::PlanInput given = fsdp::train::plan_input(config_with(value->second), 2);
    EXPECT_NE(given.*member, base.*member) << name << ": " << value->second.front() << " does not reach the planner";
  });
  EXPECT_GE(with_key, 9);
}

// micro_batch has no key of its own: a rank's share of train.global_batch over its micro-batches.
TEST(WorkloadSettings, MicroBatchIsARanksShareOfTheGlobalBatch) {
  EXPECT_EQ(fsdp::train::plan_input(config_with({}), 2).micro_batch, 4);
  EXPECT_EQ(fsdp::train::plan_input(config_with({"train.micro_batches=2"}), 2).micro_batch, 2);
}

}  // namespace workload_settings_tests
