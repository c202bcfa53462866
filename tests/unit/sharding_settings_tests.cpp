// The sharding settings are declared once (runtime/sharding_settings.h) and reach everything from
// there: each is a config key that reads back what the resolved config.toml writes, and the value
// a config gives is the one the runtime (train::fsdp_options) and the planner (train::plan_input)
// receive. A setting dropped or overwritten on one of those paths fails here, named.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "fsdp/plan/memory_plan.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/sharding_settings.h"
#include "fsdp/train/config.h"
#include "fsdp/train/planning.h"
#include "fsdp/train/sharded_model.h"

namespace sharding_settings_tests {

using fsdp::runtime::ShardingSettings;
using fsdp::train::TrainConfig;

// A config in which every setting may differ from it alone and stay valid: hybrid_shard (so a
// shard group size applies, and a changed strategy is another), activation checkpointing on (so
// its every-k applies), a GPU run (so CPU offload applies).
TrainConfig base_config() {
  return fsdp::train::parse_train_config("[model]\nname = \"gpt-test\"\n", "test.toml",
                                         {"fsdp.strategy=hybrid_shard", "fsdp.activation_checkpointing=true",
                                          "train.device=cuda", "train.global_batch=8"});
}

// A value of the setting's type other than `value`.
template <class T>
T another(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return !value;
  } else if constexpr (fsdp::has_enum_names<T>::value) {
    for (const auto& [other, name] : fsdp::EnumNames<T>::values) {
      if (other != value) return other;
    }
    return value;
  } else {
    return value + 1;
  }
}

TEST(ShardingSettings, EachIsAConfigKeyThatReachesTheRuntimeAndThePlanner) {
  int settings = 0;
  fsdp::runtime::for_each_sharding_setting([&](const char* name, auto member, const char*) {
    ++settings;
    const std::string key = std::string("fsdp.") + name;
    TrainConfig config = base_config();
    const auto given = another(config.fsdp.*member);
    config.fsdp.*member = given;
    ASSERT_NE(config.fsdp.*member, base_config().fsdp.*member) << key;

    // Written by the resolved config.toml under its key, and read back.
    const std::string toml = fsdp::train::to_toml(config);
    EXPECT_NE(toml.find(std::string(name) + " = "), std::string::npos) << key << " is not written:\n" << toml;
    const TrainConfig again = fsdp::train::parse_train_config(toml, "config.toml");
    EXPECT_EQ(again.fsdp.*member, given) << key << " does not read back";

    // The runtime and the planner receive it.
    const fsdp::runtime::FsdpOptions options = fsdp::train::fsdp_options(config);
    EXPECT_EQ(options.*member, given) << key << " does not reach the runtime (train::fsdp_options)";
    const fsdp::plan::PlanInput input = fsdp::train::plan_input(config, 2);
    EXPECT_EQ(input.*member, given) << key << " does not reach the planner (train::plan_input)";
  });
  EXPECT_GE(settings, 9);
}

// The planner's prefetch depth: fsdp.prefetch = false plans as K = 0, whatever max_inflight says.
TEST(ShardingSettings, WithoutPrefetchThePlannerCountsNoBuffersInFlight) {
  TrainConfig config = base_config();
  config.fsdp.max_inflight = 3;
  EXPECT_EQ(fsdp::train::plan_input(config, 2).prefetch_depth(), 3);
  config.fsdp.prefetch = false;
  EXPECT_EQ(fsdp::train::plan_input(config, 2).prefetch_depth(), 0);
}

}  // namespace sharding_settings_tests
