// Dynamic loss scaling (optim/loss_scaler.h) and how the step guard judges float16 steps
// (src/train/step_guard.h): an overflow backs the scale off and is counted apart from non-finite
// losses; growth after clean steps; the floor stops the run; the scale survives a checkpoint.
// The arithmetic is also held against torch.amp.GradScaler itself by tests/amp/check_grad_scaler.py.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "fsdp/optim/loss_scaler.h"
#include "fsdp/train/config.h"
#include "train/step_guard.h"

namespace loss_scaler_tests {

using fsdp::optim::DynamicLossScaler;
using fsdp::optim::LossScalerOptions;

LossScalerOptions every(int64_t growth_interval) {
  LossScalerOptions options;
  options.growth_interval = growth_interval;
  return options;
}

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterCleanSteps) {
  DynamicLossScaler scaler(every(3));
  EXPECT_EQ(scaler.scale(), 65536.0f);
  EXPECT_EQ(scaler.inv_scale(), 1.0f / 65536.0f);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 32768.0f);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 32768.0f);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  scaler.update(true);  // an overflow restarts the count
  EXPECT_EQ(scaler.scale(), 16384.0f);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 32768.0f);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(LossScaler, NeverGrowsToInfinityNorBacksOffBelowTheFloor) {
  LossScalerOptions options = every(1);
  options.init_scale = 2.0e38f;
  DynamicLossScaler high(options);
  high.update(false);  // 4e38 is inf in fp32: kept
  EXPECT_EQ(high.scale(), 2.0e38f);
  EXPECT_EQ(high.growth_tracker(), 0);

  options.init_scale = 4.0f;
  options.min_scale = 2.0f;
  DynamicLossScaler low(options);
  EXPECT_TRUE(low.update(true));
  EXPECT_EQ(low.scale(), 2.0f);
  EXPECT_FALSE(low.update(true)) << "1 is below the floor of 2";
  EXPECT_EQ(low.scale(), 2.0f);
}

TEST(LossScaler, StateRoundTripsAndBadStateIsNamed) {
  DynamicLossScaler scaler(every(5));
  scaler.update(true);
  scaler.update(false);
  scaler.update(false);
  DynamicLossScaler restored(every(5));
  restored.restore(scaler.state());
  EXPECT_EQ(restored.scale(), 32768.0f);
  EXPECT_EQ(restored.growth_tracker(), 2);
  for (const char* bad :
       {"", "{}", "{\"scale\": -1, \"growth_tracker\": 0}", "{\"scale\": 2, \"growth_tracker\": -1}", "[1"}) {
    try {
      restored.restore(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("loss scale state"), std::string::npos) << e.what();
    }
  }
  // Saved with a longer growth_interval than this run's: one more clean step grows it.
  restored.restore("{\"scale\": 2, \"growth_tracker\": 9}");
  EXPECT_EQ(restored.growth_tracker(), 4);
  restored.update(false);
  EXPECT_EQ(restored.scale(), 4.0f);
  LossScalerOptions wrong;
  wrong.backoff_factor = 1.0f;
  EXPECT_THROW(DynamicLossScaler{wrong}, std::invalid_argument);
}

fsdp::train::TrainConfig fp16_config(int64_t max_nonfinite_steps) {
  fsdp::train::TrainConfig config = fsdp::train::parse_train_config(
      "[model]\nname = \"gpt-test\"\n", "test.toml", {"fsdp.param_dtype=float16", "loss_scale.growth_interval=2"});
  config.max_nonfinite_steps = max_nonfinite_steps;
  return config;
}

const double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::numeric_limits<double>::quiet_NaN();

// Overflows are expected events of loss scaling: many in a row neither stop the run (limit 1 here)
// nor start a rollback streak, and each halves the scale.
TEST(StepGuardFp16, OverflowsAreCountedApartFromNonFiniteSteps) {
  fsdp::train::StepGuard guard(fp16_config(/*max_nonfinite_steps=*/1));
  ASSERT_NE(guard.scaler(), nullptr);
  EXPECT_TRUE(guard.needs_loss(kInf)) << "an inf norm needs the loss to tell an overflow from a bad loss";
  EXPECT_FALSE(guard.needs_loss(1.0));
  for (int step = 0; step < 4; ++step) {
    const auto verdict = guard.judge(step, false, kInf, 2.5);
    EXPECT_FALSE(verdict.apply);
    EXPECT_EQ(verdict.reason, "overflow");
    EXPECT_TRUE(verdict.stop.empty()) << verdict.stop;
  }
  EXPECT_EQ(guard.scaler()->scale(), 65536.0f / 16);
  EXPECT_EQ(guard.overflow_steps(), 4);
  EXPECT_EQ(guard.skipped_steps(), 4);
  EXPECT_EQ(guard.streak_start(), -1) << "overflows start no rollback streak";
  // Two clean steps grow it again.
  EXPECT_TRUE(guard.judge(4, false, 1.0, 2.4).apply);
  EXPECT_TRUE(guard.judge(5, false, 1.0, 2.3).apply);
  EXPECT_EQ(guard.scaler()->scale(), 65536.0f / 8);
  // A non-finite loss is not an overflow: it counts (and the limit of 1 stops the run), scale unchanged.
  const auto bad = guard.judge(6, false, kNan, kNan);
  EXPECT_FALSE(bad.apply);
  EXPECT_EQ(bad.reason, "non-finite");
  EXPECT_NE(bad.stop.find("not finite"), std::string::npos) << bad.stop;
  EXPECT_EQ(guard.scaler()->scale(), 65536.0f / 8);
}

TEST(StepGuardFp16, OverflowAtTheFloorStopsTheRun) {
  fsdp::train::TrainConfig config = fp16_config(5);
  config.loss_scale.init = 2.0;
  fsdp::train::StepGuard guard(config);
  EXPECT_TRUE(guard.judge(0, false, kInf, 3.0).stop.empty());  // 2 -> 1
  const auto verdict = guard.judge(1, false, kInf, 3.0);
  EXPECT_EQ(verdict.reason, "overflow");
  EXPECT_NE(verdict.stop.find("step 2: float16 gradients overflow at loss scale 1"), std::string::npos) << verdict.stop;
  EXPECT_NE(verdict.stop.find("loss_scale.min"), std::string::npos) << verdict.stop;
}

TEST(StepGuardFp16, CheckpointStateKeepsTheScale) {
  fsdp::train::StepGuard guard(fp16_config(5));
  guard.judge(0, false, kInf, 3.0);
  guard.judge(1, false, 1.0, 3.0);
  fsdp::train::StepGuard resumed(fp16_config(5));
  resumed.restore(guard.state());
  EXPECT_EQ(resumed.scaler()->scale(), 32768.0f);
  EXPECT_EQ(resumed.scaler()->growth_tracker(), 1);
  // A checkpoint of a run without scaling (or an older one) starts at loss_scale.init, also for a
  // run that had backed off before rolling back to it.
  ASSERT_EQ(resumed.judge(2, false, kInf, 3.0).reason, "overflow");
  EXPECT_EQ(resumed.scaler()->scale(), 16384.0f);
  resumed.restore("{\"loss_window\": []}");
  EXPECT_EQ(resumed.scaler()->scale(), 65536.0f);
  EXPECT_EQ(resumed.scaler()->growth_tracker(), 0);
  // Without float16 there is no scaler, and no scale in the state.
  fsdp::train::StepGuard fp32(fsdp::train::parse_train_config("[model]\nname = \"gpt-test\"\n", "test.toml"));
  EXPECT_EQ(fp32.scaler(), nullptr);
  EXPECT_EQ(fp32.state().find("loss_scale"), std::string::npos);
}

}  // namespace loss_scaler_tests
