// Ranks that issue different collectives are caught at the step's end. The last rank runs the
// blocks in reverse order: every all-gather and reduce-scatter has the same size on every rank,
// so MPI pairs them without complaint (a silent wrong pairing), and only the units' labels in
// the fingerprint tell them apart. Every rank must stop with the first differing collective named
// on rank 0's side and on the last rank's; the same run in the same order on every rank passes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fsdp/comm/agreement.h"
#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fully_shard.h"
#include "tiny_transformer.h"

namespace {

// One forward and backward on every rank, the last rank in reverse block order when `diverge`;
// then every rank's fingerprint, all-gathered as the trainer does, and the check.
void step_and_check(bool diverge) {
  auto world = fsdp::comm::init_world();
  const int n = world->size();
  fsdp::models::TinyConfig config;  // three blocks of the same shapes
  config.reverse_blocks = diverge && world->rank() == n - 1;
  fsdp::runtime::FsdpOptions options;
  options.wrap_policy.module_types = {"AttentionMlpBlock"};
  torch::manual_seed(0);
  auto model = fsdp::runtime::build_fully_sharded<fsdp::models::TinyTransformerImpl>(
      world, options, [&] { return std::make_shared<fsdp::models::TinyTransformerImpl>(config); });
  fsdp::comm::begin_collective_step(1);
  at::Tensor ids = at::randint(0, config.vocab, {2, config.seq}, at::kLong);
  model.forward(ids).sum().backward();

  double mine[3];
  fsdp::comm::fingerprint_to_doubles(fsdp::comm::collective_fingerprint(), mine);
  at::Tensor all = at::empty({3 * n}, at::kDouble);
  world->all_gather(all, at::tensor({mine[0], mine[1], mine[2]}, at::kDouble))->wait();
  std::vector<fsdp::comm::CollectiveFingerprint> every_rank;
  for (int r = 0; r < n; ++r) every_rank.push_back(fsdp::comm::fingerprint_from_doubles(all.data_ptr<double>() + 3 * r));
  fsdp::comm::check_collectives_agree(world, every_rank);
}

TEST(Divergence, TheSameCodePathOnEveryRankPasses) { EXPECT_NO_THROW(step_and_check(/*diverge=*/false)); }

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
    EXPECT_NE(what.find("on rank " + std::to_string(n - 1) + ": unit 'blocks.2': all_gather("), std::string::npos) << what;
  }
}

}  // namespace
