// The staged test backend (comm/staged_process_group.h) on the CPU, where CPU tensors stand in for
// device memory: every collective equals the MPI backend's result bit for bit (it runs the same
// MPI collectives on host copies), the output is written only when the collective is waited for
// (NCCL's stream order: a caller that reads before wait() sees the old values, here at once rather
// than by chance), the caller's memory is held until then, and collectives are agreed on over the
// bootstrap group while agreement is due, naming the group's channel.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "fsdp/comm/agreement.h"
#include "fsdp/comm/collective_agreement.h"
#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/staged_process_group.h"
#include "fsdp/shard/storage.h"

using fsdp::comm::ReduceOp;

namespace staged_group_test {

fsdp::comm::ProcessGroupPtr staged() {
  static const fsdp::comm::ProcessGroupPtr group = fsdp::comm::make_staged_group(fsdp::comm::init_world(), at::kCPU);
  return group;
}

// Values that differ per rank and element and are exact in every dtype used (< 256 for bf16).
at::Tensor input_of(int rank, int64_t numel, at::ScalarType type) {
  return (at::arange(numel, at::kDouble).remainder(31) + 7 * rank).to(type);
}

TEST(StagedGroup, EveryCollectiveEqualsTheMpiBackendsResult) {
  auto world = fsdp::comm::init_world();
  auto group = staged();
  EXPECT_EQ(group->rank(), world->rank());
  EXPECT_EQ(group->size(), world->size());
  EXPECT_EQ(group->channel(), "world/staged");
  const int n = world->size(), rank = world->rank();
  for (auto type : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16, at::kHalf}) {
    for (const int64_t k : {int64_t{5}, int64_t{20000}}) {  // MPI's own reduce-scatter, and the ring
      const at::Tensor input = input_of(rank, k, type);
      at::Tensor ours = at::full({k * n}, -1, type), theirs = at::full({k * n}, -1, type);
      group->all_gather(ours, input)->wait();
      world->all_gather(theirs, input)->wait();
      EXPECT_TRUE(ours.equal(theirs)) << "all_gather " << type << " k " << k;
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average}) {
        if (op == ReduceOp::Average && type == at::kLong) continue;
        const at::Tensor whole = input_of(rank, k * n, type);
        at::Tensor mine = at::empty({k}, type), mpi = at::empty({k}, type);
        group->reduce_scatter(mine, whole, op)->wait();
        world->reduce_scatter(mpi, whole, op)->wait();
        EXPECT_TRUE(mine.equal(mpi)) << "reduce_scatter " << fsdp::comm::to_string(op) << " " << type;
      }
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max}) {
        if (op == ReduceOp::Average && type == at::kLong) continue;
        at::Tensor mine = input_of(rank, k, type), mpi = input_of(rank, k, type);
        group->all_reduce(mine, op)->wait();
        world->all_reduce(mpi, op)->wait();
        EXPECT_TRUE(mine.equal(mpi)) << "all_reduce " << fsdp::comm::to_string(op) << " " << type;
      }
      for (int root = 0; root < n; ++root) {
        at::Tensor t = input_of(rank, k, type);
        group->broadcast(t, root)->wait();
        EXPECT_TRUE(t.equal(input_of(root, k, type))) << "broadcast from " << root << " " << type;
      }
    }
  }
  group->barrier()->wait();
  // A split is a staged group over the part: even and odd ranks.
  auto part = group->split(rank % 2, rank);
  ASSERT_NE(part, nullptr);
  at::Tensor t = at::tensor({static_cast<int64_t>(rank)}, at::kLong);
  part->all_reduce(t, ReduceOp::Sum)->wait();
  int64_t expected = 0;
  for (int r = rank % 2; r < n; r += 2) expected += r;
  EXPECT_EQ(t.item<int64_t>(), expected);
  EXPECT_NE(part->channel().find("/staged"), std::string::npos) << part->channel();
}

// As on a GPU, where the collective writes the output on its own stream: until wait(), the caller
// sees the old values, even once the collective has completed on the wire. A caller that reads
// the result without waiting reads garbage on NCCL by chance; here, always. The input is read at
// issue: what the caller writes into it afterwards does not travel.
TEST(StagedGroup, TheOutputIsWrittenWhenTheCollectiveIsWaitedFor) {
  auto group = staged();
  const int n = group->size();
  at::Tensor input = at::full({4}, static_cast<float>(group->rank() + 1));
  at::Tensor output = at::full({4 * n}, -1.0f);
  auto work = group->all_gather(output, input);
  input.fill_(100.0f);  // after issue: not what the peers receive
  for (int polls = 0; !work->is_completed() && polls < 5000; ++polls)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(work->is_completed());
  EXPECT_TRUE(output.equal(at::full({4 * n}, -1.0f))) << "written before wait()";
  work->wait();
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(output[4 * r].item<float>(), static_cast<float>(r + 1)) << "rank " << r << "'s block";
  work->wait();  // a second wait returns at once
}

// The caller's memory is the collective's until wait(): shard::free_storage refuses it naming the
// collective on the staged group's channel, as on the MPI and NCCL backends.
TEST(StagedGroup, MemoryInUseByACollectiveIsNotHandedBack) {
  auto group = staged();
  at::Tensor input = at::full({16}, 1.0f);
  at::Tensor output = fsdp::shard::empty_buffer(16 * group->size(), at::kFloat);
  fsdp::comm::CollectiveLabel label("unit 'blocks.2'");
  auto work = group->all_gather(output, input);
  std::string refused;
  try {
    fsdp::shard::free_storage(output);
  } catch (const std::logic_error& e) {
    refused = e.what();
  }
  EXPECT_NE(refused.find("in use by a collective in flight"), std::string::npos) << refused;
  EXPECT_NE(refused.find("fsdp staged group world"), std::string::npos) << refused;
  EXPECT_NE(refused.find("unit 'blocks.2'"), std::string::npos) << refused;
  work->wait();
  EXPECT_NO_THROW(fsdp::shard::free_storage(output));
}

// Ranks whose code labels the same-shaped collective differently (a code path that differs) are
// stopped in wait(), every rank alike, naming both sides and the staged group's channel: agreed
// over the bootstrap group (the world: AgreedStop), before the result is used.
TEST(StagedGroup, RanksAgreeOnEachCollectiveBeforeUse) {
  auto group = staged();
  if (group->size() < 2) GTEST_SKIP() << "needs two code paths";
  fsdp::comm::set_collective_agreement(fsdp::comm::CollectiveAgreementMode::kEveryStep);
  at::Tensor input = at::ones({8}), output = at::empty({8 * group->size()});
  std::string stopped;
  bool should_report = false;
  {
    fsdp::comm::CollectiveLabel label(group->rank() == 1 ? "unit 'blocks.1'" : "unit 'blocks.0'");
    auto work = group->all_gather(output, input);
    try {
      work->wait();
    } catch (const fsdp::comm::AgreedStop& e) {
      stopped = e.what();
      should_report = e.should_report();
    }
  }
  fsdp::comm::set_collective_agreement(std::nullopt);
  EXPECT_NE(stopped.find("ranks issued different collectives on group world/staged"), std::string::npos) << stopped;
  EXPECT_NE(stopped.find("on rank 1: unit 'blocks.1': all_gather(8 x " + std::to_string(group->size()) + " Float)"),
            std::string::npos)
      << stopped;
  EXPECT_NE(stopped.find("unit 'blocks.0'"), std::string::npos) << stopped;
  EXPECT_EQ(should_report, group->rank() == 0);
  // The group still works after the stop (both sides' collectives were the same size).
  at::Tensor t = at::ones({3});
  group->all_reduce(t, ReduceOp::Sum)->wait();
  EXPECT_EQ(t[0].item<float>(), static_cast<float>(group->size()));
}

TEST(StagedGroup, RefusesATensorOnAnotherDevice) {
  auto group = staged();
  at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
  EXPECT_THROW(group->all_reduce(meta, ReduceOp::Sum), std::invalid_argument);
  EXPECT_THROW(fsdp::comm::make_staged_group(fsdp::comm::init_world(), at::Device(at::kMeta)), std::invalid_argument);
}

}  // namespace staged_group_test
