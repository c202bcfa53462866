// Ranks that issue different collectives are caught at the step's end. The last rank runs the
// blocks in reverse order: every all-gather and reduce-scatter has the same size on every rank,
// so MPI pairs them without complaint (a silent wrong pairing), and only the units' labels in
// the fingerprint tell them apart. Every rank must stop with the first differing collective named
// on rank 0's side and on the last rank's; the same run in the same order on every rank passes.
// Both under full sharding (one communicator) and hybrid sharding, whose replica all-reduces go
// on a second communicator at times that depend on when each reduce-scatter completes: the
// interleaving of the two differs between ranks and steps, and must not count as divergence.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/comm/agreement.h"
#include "fsdp/comm/collective_agreement.h"
#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fully_shard.h"
#include "tiny_transformer.h"

namespace divergence_test {

// One forward and backward on every rank, the last rank in reverse block order when `diverge`;
// then every rank's fingerprint, all-gathered as the trainer does, and the check.
// Every rank's fingerprint of the step so far, all-gathered as the trainer does.
std::vector<fsdp::comm::CollectiveFingerprint> every_rank_fingerprint(const fsdp::comm::ProcessGroupPtr& world) {
  constexpr int k = fsdp::comm::kFingerprintDoubles;
  double mine[k];
  fsdp::comm::fingerprint_to_doubles(fsdp::comm::collective_fingerprint(), mine);
  const int n = world->size();
  at::Tensor all = at::empty({k * n}, at::kDouble);
  world->all_gather(all, at::tensor(std::vector<double>(mine, mine + k), at::kDouble))->wait();
  std::vector<fsdp::comm::CollectiveFingerprint> every_rank;
  for (int r = 0; r < n; ++r)
    every_rank.push_back(fsdp::comm::fingerprint_from_doubles(all.data_ptr<double>() + k * r));
  return every_rank;
}

// Hybrid: shard groups of 2 at N = 4 (2 x 2), of 1 below (every rank a replica of the others).
fsdp::runtime::FsdpOptions options_for(fsdp::runtime::ShardingStrategy strategy, int n) {
  fsdp::runtime::FsdpOptions options;
  options.wrap_policy.module_types = {"AttentionMlpBlock"};
  options.strategy = strategy;
  if (strategy == fsdp::runtime::ShardingStrategy::HybridShard) options.shard_group_size = n % 2 == 0 && n >= 4 ? 2 : 1;
  return options;
}

void step_and_check(bool diverge, fsdp::runtime::ShardingStrategy strategy = fsdp::runtime::ShardingStrategy::FullShard,
                    int steps = 1) {
  auto world = fsdp::comm::init_world();
  const int n = world->size();
  fsdp::models::TinyConfig config;  // three blocks of the same shapes
  config.reverse_blocks = diverge && world->rank() == n - 1;
  torch::manual_seed(0);
  auto model = fsdp::runtime::build_fully_sharded<fsdp::models::TinyTransformerImpl>(
      world, options_for(strategy, n), [&] { return std::make_shared<fsdp::models::TinyTransformerImpl>(config); });
  at::Tensor ids = at::randint(0, config.vocab, {2, config.seq}, at::kLong);
  for (int step = 1; step <= steps; ++step) {
    fsdp::comm::begin_collective_step(step);
    model.forward(ids).sum().backward();
  }

  fsdp::comm::check_collectives_agree(world, every_rank_fingerprint(world));
}

TEST(Divergence, TheSameCodePathOnEveryRankPasses) { EXPECT_NO_THROW(step_and_check(/*diverge=*/false)); }

// The fingerprint itself, on records made by hand: two communicators interleaved one way on even
// ranks and the other way on odd ranks agree (hybrid sharding's replica all-reduces are issued
// when a reduce-scatter completes, so their interleaving with the shard group's collectives
// depends on timing); the same two records swapped within one communicator do not.
TEST(Divergence, OnlyTheOrderWithinEachCommunicatorCounts) {
  auto world = fsdp::comm::init_world();
  const bool odd = world->rank() % 2 == 1;
  fsdp::comm::begin_collective_step(1);
  if (odd) {
    fsdp::comm::record_collective("world/split#2", "all_reduce(average, 8 Float)");
    fsdp::comm::record_collective("world/split#1", "reduce_scatter(average, 16 Float)");
    fsdp::comm::record_collective("world/split#1", "all_gather(8 x 2 Float)");
  } else {
    fsdp::comm::record_collective("world/split#1", "reduce_scatter(average, 16 Float)");
    fsdp::comm::record_collective("world/split#1", "all_gather(8 x 2 Float)");
    fsdp::comm::record_collective("world/split#2", "all_reduce(average, 8 Float)");
  }
  EXPECT_NO_THROW(fsdp::comm::check_collectives_agree(world, every_rank_fingerprint(world)));

  if (world->size() < 2) return;
  fsdp::comm::begin_collective_step(2);
  fsdp::comm::record_collective("world/split#1", odd ? "all_gather(8 x 2 Float)" : "reduce_scatter(average, 16 Float)");
  fsdp::comm::record_collective("world/split#1", odd ? "reduce_scatter(average, 16 Float)" : "all_gather(8 x 2 Float)");
  try {
    fsdp::comm::check_collectives_agree(world, every_rank_fingerprint(world));
    FAIL() << "two collectives swapped on one communicator must stop every rank";
  } catch (const fsdp::comm::AgreedStop& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("on rank 0: reduce_scatter(average, 16 Float) [group world/split#1, collective 1 there]"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("on rank 1: all_gather(8 x 2 Float) [group world/split#1, collective 1 there]"),
              std::string::npos)
        << what;
  }
}

// A device backend (NCCL) needs the interleaving across groups to agree as well (it may deadlock
// otherwise): the same records, checked with one_issue_order, stop every rank naming the first
// collective of the step whose group differs, on each side.
TEST(Divergence, ADeviceBackendAlsoNeedsOneOrderAcrossGroups) {
  auto world = fsdp::comm::init_world();
  if (world->size() < 2) GTEST_SKIP() << "one rank cannot diverge from itself";
  const bool odd = world->rank() % 2 == 1;
  fsdp::comm::begin_collective_step(1);
  if (odd) fsdp::comm::record_collective("world/split#2", "all_reduce(average, 8 Float)");
  fsdp::comm::record_collective("world/split#1", "reduce_scatter(average, 16 Float)");
  if (!odd) fsdp::comm::record_collective("world/split#2", "all_reduce(average, 8 Float)");
  const auto every_rank = every_rank_fingerprint(world);
  EXPECT_NO_THROW(fsdp::comm::check_collectives_agree(world, every_rank)) << "MPI: each group's own order agrees";
  try {
    fsdp::comm::check_collectives_agree(world, every_rank, /*one_issue_order=*/true);
    FAIL() << "two groups interleaved otherwise on some ranks must stop every rank";
  } catch (const fsdp::comm::AgreedStop& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ranks issued their groups' collectives in different orders in step 1: collective 1 of the "
                        "step was, on rank 0: reduce_scatter(average, 16 Float) [group world/split#1, collective 1 "
                        "there]"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("on rank 1: all_reduce(average, 8 Float) [group world/split#2, collective 1 there]"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("NCCL"), std::string::npos) << what;
  }
}

// The real runtime under hybrid sharding, several steps: passes whatever the interleaving.
TEST(Divergence, HybridShardingTheSameCodePathOnEveryRankPasses) {
  EXPECT_NO_THROW(step_and_check(/*diverge=*/false, fsdp::runtime::ShardingStrategy::HybridShard, /*steps=*/4));
}

TEST(Divergence, HybridShardingStillCatchesARankRunningBlocksInAnotherOrder) {
  auto world = fsdp::comm::init_world();
  const int n = world->size();
  if (n < 2) GTEST_SKIP() << "one rank cannot diverge from itself";
  try {
    step_and_check(/*diverge=*/true, fsdp::runtime::ShardingStrategy::HybridShard);
    FAIL() << "expected every rank to stop";
  } catch (const fsdp::comm::AgreedStop& e) {
    const std::string what = e.what();
    if (e.should_report()) std::printf("%s\n", what.c_str());
    EXPECT_NE(what.find("ranks issued different collectives in step 1"), std::string::npos) << what;
    // The forward's first gathers on the shard group (the second split of world at N = 4, the
    // first below it, where the shard groups of one rank are still split off).
    EXPECT_NE(what.find("on rank 0: unit 'blocks.0': all_gather("), std::string::npos) << what;
    EXPECT_NE(what.find("on rank " + std::to_string(n - 1) + ": unit 'blocks.2': all_gather("), std::string::npos)
        << what;
    EXPECT_NE(what.find("[group world/split#"), std::string::npos) << what;
  }
}

TEST(Divergence, ARankRunningBlocksInAnotherOrderStopsEveryRankNamingTheCollectiveOnBothSides) {
  const int n = fsdp::comm::init_world()->size();
  if (n < 2) GTEST_SKIP() << "one rank cannot diverge from itself";
  try {
    step_and_check(/*diverge=*/true);
    FAIL() << "expected every rank to stop";
  } catch (const fsdp::comm::AgreedStop& e) {
    const std::string what = e.what();
    if (e.should_report()) std::printf("%s\n", what.c_str());
    EXPECT_EQ(e.should_report(), fsdp::comm::init_world()->rank() == 0);
    // Rank 0 starts with blocks.0; the last rank with blocks.2 (the forward's first gathers).
    EXPECT_NE(what.find("ranks issued different collectives in step 1"), std::string::npos) << what;
    EXPECT_NE(what.find("on rank 0: unit 'blocks.0': all_gather("), std::string::npos) << what;
    EXPECT_NE(what.find("on rank " + std::to_string(n - 1) + ": unit 'blocks.2': all_gather("), std::string::npos)
        << what;
  }
}

// Agreement before use (collective_agreement.h; on the GPU the default for the first step, where
// the step's end may never come): the same divergence stops every rank at the first differing
// collective's wait, inside the forward, naming both sides; the fingerprint at the step's end
// (above) never runs. Without agreement this test fails: the stop comes from the step's end.
struct ScopedAgreement {
  explicit ScopedAgreement(fsdp::comm::CollectiveAgreementMode mode) { fsdp::comm::set_collective_agreement(mode); }
  ~ScopedAgreement() { fsdp::comm::set_collective_agreement(std::nullopt); }
};

TEST(Divergence, AgreedBeforeUseStopsEveryRankInsideTheStep) {
  const int n = fsdp::comm::init_world()->size();
  if (n < 2) GTEST_SKIP() << "one rank cannot diverge from itself";
  ScopedAgreement every_step(fsdp::comm::CollectiveAgreementMode::kEveryStep);
  try {
    step_and_check(/*diverge=*/true);
    FAIL() << "expected every rank to stop";
  } catch (const fsdp::comm::AgreedStop& e) {
    const std::string what = e.what();
    if (e.should_report()) std::printf("%s\n", what.c_str());
    EXPECT_EQ(e.should_report(), fsdp::comm::init_world()->rank() == 0);
    EXPECT_NE(what.find("ranks issued different collectives on group world (agreed before use"), std::string::npos)
        << what;
    EXPECT_NE(what.find(std::string(n > 2 ? "on ranks 0, " : "on rank 0: ")), std::string::npos) << what;
    EXPECT_NE(what.find("unit 'blocks.0': all_gather("), std::string::npos) << what;
    EXPECT_NE(what.find("on rank " + std::to_string(n - 1) + ": unit 'blocks.2': all_gather("), std::string::npos)
        << what;
    EXPECT_EQ(what.find("in step 1"), std::string::npos) << "stopped at the step's end, not before use: " << what;
  }
}

// No false stop, and no deadlock, where every rank runs the same code: full sharding, and hybrid
// sharding's replica reductions (issued at times that differ between ranks) over several steps.
TEST(Divergence, AgreedBeforeUseLetsTheSameCodePathPass) {
  ScopedAgreement every_step(fsdp::comm::CollectiveAgreementMode::kEveryStep);
  EXPECT_NO_THROW(step_and_check(/*diverge=*/false));
  EXPECT_NO_THROW(step_and_check(/*diverge=*/false, fsdp::runtime::ShardingStrategy::HybridShard, /*steps=*/4));
}

}  // namespace divergence_test
