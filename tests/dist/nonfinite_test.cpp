// Non-finite gradients are never applied. A NaN on one rank reaches every rank's gradient norm (an
// all-reduce), so every rank skips the same step and the parameters stay bit for bit as they were;
// later finite steps train as if the skipped step had never been taken; K non-finite steps in a
// row stop the run with a message; clip_grad_norm leaves non-finite gradients as they are; the
// norm's all-reduce wait counts as exposed communication.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "fsdp/comm/process_group.h"
#include "fsdp/optim/nonfinite_guard.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace nonfinite_test {

using fsdp::comm::ProcessGroupPtr;

struct TrainingRun {
  fsdp::train::ShardedModel sharded;
  std::unique_ptr<fsdp::optim::ShardedAdamW> optimizer;
};

TrainingRun make_run(const ProcessGroupPtr& group) {
  auto config = fsdp::train::parse_train_config("[model]\nname = \"llama-test\"\n", "nonfinite_test");
  config.seed = 3;
  TrainingRun run;
  run.sharded = fsdp::train::build_sharded_model(config, 256, group);
  run.optimizer = std::make_unique<fsdp::optim::ShardedAdamW>(*run.sharded.state,
                                                              fsdp::optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  return run;
}

// Forward and backward of batch `batch` (the same batch for the same number at any run); on
// `poisoned_rank` the loss is multiplied by NaN (-1: no rank).
void forward_backward(TrainingRun& run, const ProcessGroupPtr& group, int batch, int poisoned_rank) {
  run.optimizer->zero_grad();
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + 31 * batch + group->rank()));
  at::Tensor ids = at::randint(0, 256, {2, 9}, generator, at::kLong);
  at::Tensor logits = run.sharded.model.forward(ids.narrow(1, 0, 8));
  at::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 256}), ids.narrow(1, 1, 8).reshape(-1));
  if (group->rank() == poisoned_rank) loss = loss * std::numeric_limits<double>::quiet_NaN();
  loss.backward();
}

// A training step as the trainer takes it: clip, ask the guard, step only when it says so.
bool train_step(TrainingRun& run, const ProcessGroupPtr& group, int batch, int poisoned_rank,
                fsdp::optim::NonFiniteStepGuard& guard) {
  forward_backward(run, group, batch, poisoned_rank);
  const double norm = fsdp::optim::clip_grad_norm(*run.sharded.state, 1.0);
  const bool stepped = guard.should_step(norm, batch);
  if (stepped) run.optimizer->step();
  return stepped;
}

// This rank's parameter shards and optimizer state, copied: [total] fp32.
at::Tensor local_state(TrainingRun& run) {
  std::vector<at::Tensor> parts;
  for (auto* flat : run.sharded.state->flat_params()) parts.push_back(flat->shard().clone());
  for (size_t slot = 0; slot < run.optimizer->slot_count(); ++slot) {
    for (size_t w = 0; w < run.optimizer->state_names().size(); ++w)
      parts.push_back(run.optimizer->state_tensor(slot, w).clone());
  }
  return at::cat(parts);
}

// Bitwise, NaN included: the bytes of two fp32 tensors.
bool same_bits(const at::Tensor& a, const at::Tensor& b) { return torch::equal(a.view(at::kInt), b.view(at::kInt)); }

TEST(NonFinite, EveryRankSkipsTheStepAndLaterStepsTrainNormally) {
  auto world = fsdp::comm::init_world();
  const int poisoned = world->size() - 1;
  TrainingRun run = make_run(world);
  fsdp::optim::NonFiniteStepGuard guard(3);
  ASSERT_TRUE(train_step(run, world, 0, -1, guard));
  ASSERT_TRUE(train_step(run, world, 1, -1, guard));
  const at::Tensor before = local_state(run);
  const int64_t steps_before = run.optimizer->step_count();
  EXPECT_FALSE(train_step(run, world, 2, poisoned, guard))
      << "a NaN on rank " << poisoned << " must skip the step here too";
  EXPECT_TRUE(same_bits(local_state(run), before)) << "the skipped step changed this rank's shards or optimizer state";
  EXPECT_EQ(run.optimizer->step_count(), steps_before);
  EXPECT_EQ(guard.consecutive_skips(), 1);
  EXPECT_TRUE(train_step(run, world, 3, -1, guard));
  EXPECT_TRUE(train_step(run, world, 4, -1, guard));
  EXPECT_EQ(guard.consecutive_skips(), 0);
  EXPECT_EQ(guard.total_skips(), 1);

  // The same run without batch 2 at all: bit for bit the same state (the skip left no trace, and
  // the next step's zero_grad cleared the NaN gradients).
  TrainingRun reference = make_run(world);
  fsdp::optim::NonFiniteStepGuard reference_guard(3);
  for (int batch : {0, 1, 3, 4}) ASSERT_TRUE(train_step(reference, world, batch, -1, reference_guard));
  const at::Tensor after = local_state(run);
  EXPECT_TRUE(at::isfinite(after).all().item<bool>());
  EXPECT_TRUE(same_bits(after, local_state(reference)))
      << "finite steps after a skipped one must train as if it never happened";
}

TEST(NonFinite, StopsAfterMaxConsecutiveNonFiniteSteps) {
  auto world = fsdp::comm::init_world();
  TrainingRun run = make_run(world);
  fsdp::optim::NonFiniteStepGuard guard(3);
  const at::Tensor before = local_state(run);
  EXPECT_FALSE(train_step(run, world, 0, 0, guard));
  EXPECT_FALSE(train_step(run, world, 1, 0, guard));
  try {
    train_step(run, world, 2, 0, guard);
    FAIL() << "the third non-finite step in a row must stop";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "step 2: gradient norm nan, not finite for 3 steps in a row (the limit), 3 steps skipped"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(same_bits(local_state(run), before));
  // A finite step in between starts the count again.
  fsdp::optim::NonFiniteStepGuard again(2);
  EXPECT_FALSE(again.should_step(std::nan(""), 0));
  EXPECT_TRUE(again.should_step(1.0, 1));
  EXPECT_FALSE(again.should_step(INFINITY, 2));
  EXPECT_THROW(again.should_step(-INFINITY, 3), std::runtime_error);
  EXPECT_THROW(fsdp::optim::NonFiniteStepGuard(0), std::invalid_argument);
}

// An infinite gradient on one rank: the norm is infinite on every rank and no gradient is scaled
// (scaling by max_norm / inf = 0 would turn the inf into NaN and zero every other gradient).
TEST(NonFinite, ClipGradNormLeavesNonFiniteGradientsAsTheyAre) {
  auto world = fsdp::comm::init_world();
  TrainingRun run = make_run(world);
  for (const double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    forward_backward(run, world, 0, -1);
    fsdp::shard::FlatParam* first = run.sharded.state->flat_params().front();
    if (world->rank() == 0) first->shard_grad()[0] = bad;
    std::vector<at::Tensor> grads;
    for (auto* flat : run.sharded.state->flat_params()) grads.push_back(flat->shard_grad().clone());
    const double norm = fsdp::optim::clip_grad_norm(*run.sharded.state, 1.0);
    EXPECT_FALSE(std::isfinite(norm)) << "every rank sees the non-finite norm";
    if (std::isinf(bad)) EXPECT_TRUE(std::isinf(norm)) << norm;
    const auto flats = run.sharded.state->flat_params();
    for (size_t i = 0; i < flats.size(); ++i) {
      EXPECT_TRUE(same_bits(flats[i]->shard_grad(), grads[i]))
          << "gradients of " << flats[i]->unit_name() << " changed, norm " << norm;
    }
  }
}

// The norm's all-reduce is waited for on the compute thread: the time it blocks is exposed
// communication. Rank 1 arrives 300 ms late; rank 0's exposed time grows by at least 200 ms (the
// rest for scheduling: rank 0 reaches its wait within microseconds of starting).
TEST(NonFinite, GradNormWaitCountsAsExposedCommunication) {
  auto world = fsdp::comm::init_world();
  if (world->size() < 2) GTEST_SKIP() << "needs a late rank";
  TrainingRun run = make_run(world);
  forward_backward(run, world, 0, -1);
  world->barrier()->wait();
  const double exposed_before = run.sharded.state->comm_stats().exposed_seconds;
  if (world->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  fsdp::optim::grad_norm(*run.sharded.state);
  const double exposed = run.sharded.state->comm_stats().exposed_seconds - exposed_before;
  if (world->rank() == 0) EXPECT_GE(exposed, 0.2) << "rank 0 waited about 0.3 s for the norm's all-reduce";
}

}  // namespace nonfinite_test
