// Collectives at every rank count, every dtype, with inputs whose results have a closed form.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/nccl_process_group.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/shard/storage.h"

using fsdp::comm::ReduceOp;

namespace comm_test {

fsdp::comm::ProcessGroupPtr world() { return fsdp::comm::init_world(); }

const std::vector<at::ScalarType> kAllTypes = {at::kFloat, at::kDouble, at::kLong, at::kBFloat16, at::kHalf};

// Relative error a 16-bit float sum may carry: its inputs rounded once and the fp32 sum rounded once
// more (bf16 keeps 8 significant bits, fp16 11); the others are exact here.
double sum_tolerance(at::ScalarType type) {
  if (type == at::kBFloat16) return 2.0 / 256;
  if (type == at::kHalf) return 2.0 / 2048;
  return 0.0;
}

// Input of rank r: element i = r * k + i (exact in every dtype for the sizes used: < 256 for bf16).
at::Tensor ramp(int rank, int64_t k, at::ScalarType type) { return (at::arange(k, at::kDouble) + rank * k).to(type); }

TEST(Comm, AllGatherEveryDtype) {
  auto g = world();
  const int64_t k = 7;
  for (auto type : kAllTypes) {
    at::Tensor input = ramp(g->rank(), k, type);
    at::Tensor output = at::full({k * g->size()}, -1, type);
    g->all_gather(output, input)->wait();
    // Rank r's block holds r*k .. r*k+k-1: the whole output is 0 .. N*k-1.
    EXPECT_TRUE(output.to(at::kDouble).equal(at::arange(k * g->size(), at::kDouble))) << type;
  }
}

TEST(Comm, ReduceScatterSumAndAverage) {
  auto g = world();
  const int n = g->size();
  // 5: MPI's own reduce-scatter; 20000 per rank: our ring (large buffers).
  for (const int64_t k : {int64_t{5}, int64_t{20000}})
    for (auto type : kAllTypes) {
      // Every rank contributes (r + 1) * (i mod 1000); the sum is N(N+1)/2 * (i mod 1000), below fp16's
      // largest value (65504) at N <= 4.
      at::Tensor input = (at::arange(k * n, at::kDouble).remainder(1000) * (g->rank() + 1)).to(type);
      at::Tensor output = at::empty({k}, type);
      g->reduce_scatter(output, input, ReduceOp::Sum)->wait();
      at::Tensor expected =
          at::arange(g->rank() * k, (g->rank() + 1) * k, at::kDouble).remainder(1000) * (n * (n + 1) / 2.0);
      if (sum_tolerance(type) > 0) {
        EXPECT_TRUE(at::allclose(output.to(at::kDouble), expected, /*rtol=*/sum_tolerance(type), /*atol=*/0))
            << type << " k=" << k;
      } else {
        EXPECT_TRUE(output.to(at::kDouble).equal(expected)) << type << " k=" << k;
      }
      if (type == at::kLong) continue;  // average of int64 is refused (tested below)
      g->reduce_scatter(output, input, ReduceOp::Average)->wait();
      EXPECT_TRUE(at::allclose(output.to(at::kDouble), expected / n, std::max(sum_tolerance(type), 1e-7), 0))
          << type << " k=" << k;
    }
}

// Buffers large enough for the point-to-point ring paths (FSDP_COMM_WAIT=backoff: all-gather of
// >= 16384 elements in all; all-reduce sums of >= 16384 per rank that split evenly), and one that
// does not split evenly (MPI's own all-reduce). Integer-valued, so every sum is exact.
TEST(Comm, LargeBuffersGatherAndReduceExactly) {
  auto g = world();
  const int n = g->size();
  const int64_t k = 20000;
  for (auto type : {at::kFloat, at::kDouble, at::kLong}) {
    at::Tensor output = at::full({k * n}, -1, type);
    g->all_gather(output, ramp(g->rank(), k, type))->wait();
    EXPECT_TRUE(output.to(at::kDouble).equal(at::arange(k * n, at::kDouble))) << type;
  }
  for (auto type : {at::kFloat, at::kDouble}) {
    for (const int64_t count : {k * n, k * n + 1}) {
      at::Tensor t = ramp(g->rank(), count, type);
      g->all_reduce(t, ReduceOp::Sum)->wait();
      // sum_r (r * count + i) = count N(N-1)/2 + N i
      const at::Tensor expected = at::arange(count, at::kDouble) * n + static_cast<double>(count) * n * (n - 1) / 2;
      EXPECT_TRUE(t.to(at::kDouble).equal(expected)) << type << " count=" << count;
      t = ramp(g->rank(), count, type);
      g->all_reduce(t, ReduceOp::Average)->wait();
      EXPECT_TRUE(at::allclose(t.to(at::kDouble), expected / n, 1e-7, 0)) << type << " count=" << count;
    }
  }
}

TEST(Comm, AllReduceSumAverageMax) {
  auto g = world();
  const int n = g->size();
  for (auto type : kAllTypes) {
    at::Tensor t = ramp(g->rank(), 6, type);
    g->all_reduce(t, ReduceOp::Max)->wait();
    EXPECT_TRUE(t.to(at::kDouble).equal(ramp(n - 1, 6, at::kDouble))) << type;
    t = ramp(g->rank(), 6, type);
    g->all_reduce(t, ReduceOp::Sum)->wait();
    // sum_r (r*6 + i) = 6 N(N-1)/2 + N i
    at::Tensor expected = at::arange(6, at::kDouble) * n + 6.0 * n * (n - 1) / 2;
    EXPECT_TRUE(at::allclose(t.to(at::kDouble), expected, sum_tolerance(type) / 2, 0)) << type;
    if (type == at::kLong) continue;
    t = ramp(g->rank(), 6, type);
    g->all_reduce(t, ReduceOp::Average)->wait();
    EXPECT_TRUE(at::allclose(t.to(at::kDouble), expected / n, std::max(sum_tolerance(type) / 2, 1e-7), 0)) << type;
  }
}

// bf16 and fp16 sums are taken in fp32 and rounded once: no worse than one rounding of the exact sum.
TEST(Comm, SixteenBitSumsLoseNoMoreThanOneRounding) {
  auto g = world();
  for (const auto& [type, mantissa_bits] : {std::pair{at::kBFloat16, 8}, std::pair{at::kHalf, 11}}) {
    // Values the type holds exactly, whose pairwise sums in the type would round at every step.
    at::Tensor values = at::randn({4096}, at::TensorOptions().dtype(at::kFloat)).mul_(g->rank() + 1);
    at::Tensor mine = values.to(type);
    // fp64 reference of the exact sum of what every rank holds.
    at::Tensor all = at::empty({4096 * g->size()}, type);
    g->all_gather(all, mine)->wait();
    at::Tensor exact = all.to(at::kDouble).view({g->size(), 4096}).sum(0);
    at::Tensor summed = mine.clone();
    g->all_reduce(summed, ReduceOp::Sum)->wait();
    // One rounding of the exact result: at most half an ulp, 2^(floor(log2|x|) - bits), plus fp32's
    // own rounding while accumulating (relative 2^-24 per addition, covered by the 1e-5 slack).
    // fp16's subnormals (below 2^-14) have a fixed ulp of 2^-24.
    at::Tensor error = (summed.to(at::kDouble) - exact).abs();
    at::Tensor half_ulp = at::pow(2.0, at::floor(at::log2(exact.abs() + 1e-30)) - mantissa_bits)
                              .clamp_min(type == at::kHalf ? std::pow(2.0, -25) : 0.0);
    at::Tensor excess = error - half_ulp * (1 + 1e-5);
    EXPECT_LE(excess.max().item<double>(), 0.0) << type << " sum lost more than one rounding";
  }
}

TEST(Comm, BroadcastAndBarrier) {
  auto g = world();
  for (int root = 0; root < g->size(); ++root) {
    for (auto type : kAllTypes) {
      at::Tensor t = ramp(g->rank(), 9, type);
      g->broadcast(t, root)->wait();
      EXPECT_TRUE(t.to(at::kDouble).equal(ramp(root, 9, at::kDouble))) << type << " root " << root;
    }
  }
  g->barrier()->wait();
}

TEST(Comm, SplitIntoSubGroups) {
  auto g = world();
  // Even and odd ranks form two groups; ordered by descending rank inside each.
  auto sub = g->split(g->rank() % 2, -g->rank());
  ASSERT_NE(sub, nullptr);
  const int expected_size = (g->size() + 1 - g->rank() % 2) / 2;
  EXPECT_EQ(sub->size(), expected_size);
  at::Tensor t = at::tensor({static_cast<int64_t>(g->rank())}, at::kLong);
  sub->all_reduce(t, ReduceOp::Sum)->wait();
  int64_t expected = 0;
  for (int r = g->rank() % 2; r < g->size(); r += 2) expected += r;
  EXPECT_EQ(t.item<int64_t>(), expected);
  // A negative color joins nothing.
  auto none = g->split(g->rank() == 0 ? -1 : 0, 0);
  EXPECT_EQ(none == nullptr, g->rank() == 0);
}

// The NcclGroup tests run on a GPU only (FSDP_TEST_DEVICE=cuda: scripts/gpu-check.sh); skipped on
// the CPU. Each makes a NCCL group over the world on this rank's device.
bool device_tests_asked() {
  const char* device = std::getenv("FSDP_TEST_DEVICE");
  return device != nullptr && std::string(device) == "cuda";
}

struct NcclOnThisRank {
  at::Device device;
  fsdp::comm::ProcessGroupPtr group;
};

NcclOnThisRank nccl_on_this_rank() {
  const int device_index = fsdp::comm::local_device_index();
  return {at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)),
          fsdp::comm::make_nccl_group(world(), device_index)};
}

// On a GPU (FSDP_TEST_DEVICE=cuda: scripts/gpu-check.sh runs it; skipped on the CPU): a NCCL
// group's split makes each part's communicator from the parent's (ncclCommSplit), with the ranks
// in the bootstrap split's order (descending here, seen in an all-gather), and a negative color
// joins none (NCCL_SPLIT_NOCOLOR: at N = 1 every rank, which NCCL must take too). With one GPU
// (gpu-check's machine) N = 1: the orders are trivial there, the two calls into NCCL are not.
TEST(NcclGroup, SplitsFromItsCommunicator) {
  if (!device_tests_asked()) GTEST_SKIP() << "a device test (FSDP_TEST_DEVICE=cuda)";
  const NcclOnThisRank on_gpu = nccl_on_this_rank();
  const at::Device cuda = on_gpu.device;
  const fsdp::comm::ProcessGroupPtr& nccl = on_gpu.group;
  const int rank = nccl->rank(), n = nccl->size();
  auto sub = nccl->split(rank % 2, -rank);
  std::vector<int64_t> members;  // the part's parent ranks, in its rank order: descending
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == rank % 2) members.push_back(r);
  }
  EXPECT_NE(sub, nullptr);
  if (sub && sub->size() == static_cast<int>(members.size())) {  // else each rank fails alone, none waits
    at::Tensor mine = at::full({3}, static_cast<float>(rank), at::TensorOptions(cuda));
    at::Tensor gathered = at::empty({3 * sub->size()}, at::TensorOptions(cuda));
    sub->all_gather(gathered, mine)->wait();
    const at::Tensor on_host = gathered.cpu();
    for (size_t i = 0; i < members.size(); ++i)
      EXPECT_EQ(on_host[3 * i].item<float>(), static_cast<float>(members[i])) << "position " << i;
    at::Tensor sum = at::full({5}, static_cast<float>(rank + 1), at::TensorOptions(cuda));
    sub->all_reduce(sum, ReduceOp::Sum)->wait();
    float expected = 0;
    for (int64_t r : members) expected += static_cast<float>(r + 1);
    EXPECT_TRUE(sum.cpu().equal(at::full({5}, expected))) << sum.cpu();
  } else if (sub) {
    ADD_FAILURE() << "the part has " << sub->size() << " ranks, expected " << members.size();
  }

  auto none = nccl->split(rank == 0 ? -1 : 0, 0);
  EXPECT_EQ(none == nullptr, rank == 0);
  if (none) {
    at::Tensor one = at::ones({2}, at::TensorOptions(cuda));
    none->all_reduce(one, ReduceOp::Sum)->wait();
    EXPECT_EQ(one.cpu()[0].item<float>(), static_cast<float>(n - 1));
  }
  nccl->barrier()->wait();
}

// On a GPU a wait blocks no host thread: the exposed communication is the time the caller's stream
// stands still at it, timed by events around the queued wait (NcclWork::wait_timing_stream).
// Sixteen gathers of 256 MiB queued back to back (about 0.2 ms each on an H100 at N = 1, a device
// copy) and the last waited for at once: the stream stands still for about all of them. The same
// after the device has finished them: next to nothing. A plain wait() is not timed.
TEST(NcclGroup, TimesHowLongTheCallersStreamStoodStill) {
  if (!device_tests_asked()) GTEST_SKIP() << "a device test (FSDP_TEST_DEVICE=cuda)";
  const NcclOnThisRank on_gpu = nccl_on_this_rank();
  const at::Device cuda = on_gpu.device;
  const fsdp::comm::ProcessGroupPtr& nccl = on_gpu.group;
  const int64_t k = int64_t{64} << 20;  // fp32 elements per rank: 256 MiB
  at::Tensor input = at::ones({k}, at::TensorOptions(cuda));
  at::Tensor output = at::empty({k * nccl->size()}, at::TensorOptions(cuda));
  torch::cuda::synchronize();

  const double before = nccl->stream_wait_seconds();
  const auto issued = std::chrono::steady_clock::now();
  fsdp::comm::WorkPtr last;
  for (int i = 0; i < 16; ++i) last = nccl->all_gather(output, input);
  EXPECT_TRUE(last->wait_timing_stream());
  torch::cuda::synchronize();
  const double host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - issued).count();
  const double stood = nccl->stream_wait_seconds() - before;

  auto done = nccl->all_gather(output, input);
  torch::cuda::synchronize();  // the gather has run before the stream reaches the wait
  done->wait_timing_stream();
  torch::cuda::synchronize();
  const double stood_after_it_ran = nccl->stream_wait_seconds() - before - stood;

  const double counted = nccl->stream_wait_seconds();
  for (int i = 0; i < 16; ++i) last = nccl->all_gather(output, input);
  last->wait();  // not timed
  torch::cuda::synchronize();
  EXPECT_EQ(nccl->stream_wait_seconds(), counted) << "a plain wait() was timed";

  EXPECT_GT(stood, 0.0);
  EXPECT_LE(stood, host_seconds) << "more than the time from issue to the device's end";
  EXPECT_LT(stood_after_it_ran, 1e-3) << "a wait on a collective already done stood " << stood_after_it_ran
                                      << " s, one on sixteen queued gathers " << stood << " s";
  EXPECT_LT(stood_after_it_ran * 10, stood);
  nccl->barrier()->wait();
}

TEST(Comm, ManyCollectivesInFlightCompleteInOrder) {
  auto g = world();
  std::vector<at::Tensor> outputs;
  std::vector<fsdp::comm::WorkPtr> works;
  for (int i = 0; i < 16; ++i) {
    at::Tensor input = at::full({3}, static_cast<float>(i * 100 + g->rank()));
    outputs.push_back(at::empty({3 * g->size()}));
    works.push_back(g->all_gather(outputs.back(), input));
  }
  for (int i = 0; i < 16; ++i) {
    works[i]->wait();
    for (int r = 0; r < g->size(); ++r) EXPECT_EQ(outputs[i][r * 3].item<float>(), i * 100 + r);
  }
}

TEST(Comm, AllGatherProgressesWhileCallerComputes) {
  auto g = world();
  const int64_t k = 8 << 20;  // 32 MiB per rank
  at::Tensor input = at::full({k}, static_cast<float>(g->rank()));
  at::Tensor output = at::empty({k * g->size()});
  at::Tensor a = at::randn({256, 256}), b = at::randn({256, 256});
  g->barrier()->wait();
  auto start = std::chrono::steady_clock::now();
  auto work = g->all_gather(output, input);
  // The caller computes; the collective must complete without the caller entering MPI.
  int products = 0;
  bool completed_while_computing = false;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    a = at::matmul(a, b).div_(256);
    ++products;
    if (work->is_completed()) {
      completed_while_computing = true;
      break;
    }
  }
  EXPECT_TRUE(completed_while_computing) << "all_gather of " << k * 4 << " bytes did not progress in 60 s";
  EXPECT_GT(products, 0);
  work->wait();
  for (int r = 0; r < g->size(); ++r) EXPECT_EQ(output[r * k + k - 1].item<float>(), r);
  EXPECT_GT(work->busy_seconds(), 0.0);
}

// ---- bad input: thrown on the calling rank before anything is sent

TEST(CommBadInput, AllGatherWrongOutputSize) {
  auto g = world();
  at::Tensor input = at::zeros({4});
  at::Tensor output = at::zeros({4 * g->size() + 1});
  try {
    g->all_gather(output, input);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("all_gather"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(g->rank())), std::string::npos) << what;
    EXPECT_NE(what.find("[4]"), std::string::npos) << what;
  }
}

TEST(CommBadInput, ReduceScatterWrongSizeMismatchedDtypeNonContiguous) {
  auto g = world();
  EXPECT_THROW(g->reduce_scatter(at::zeros({3}), at::zeros({3 * g->size() + 2}), ReduceOp::Sum), std::invalid_argument);
  EXPECT_THROW(g->reduce_scatter(at::zeros({3}, at::kDouble), at::zeros({3 * g->size()}), ReduceOp::Sum),
               std::invalid_argument);
  at::Tensor strided = at::zeros({3 * g->size(), 2}).select(1, 0);
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_THROW(g->reduce_scatter(at::zeros({3}), strided, ReduceOp::Sum), std::invalid_argument);
  EXPECT_THROW(g->all_reduce(at::zeros({3}, at::kLong), ReduceOp::Average), std::invalid_argument);
}

TEST(CommBadInput, UnsupportedDtypeAndDevice) {
  auto g = world();
  EXPECT_THROW(g->all_reduce(at::zeros({3}, at::kInt), ReduceOp::Sum), std::invalid_argument);
  EXPECT_THROW(g->all_reduce(at::zeros({3}, at::kComplexFloat), ReduceOp::Sum), std::invalid_argument);
  EXPECT_THROW(g->all_reduce(at::zeros({3}, at::TensorOptions().device(at::kMeta)), ReduceOp::Sum),
               std::invalid_argument);
  EXPECT_THROW(g->broadcast(at::zeros({3}), g->size()), std::invalid_argument);
  EXPECT_THROW(g->all_gather(at::Tensor(), at::zeros({1})), std::invalid_argument);
  // uint8 carries packed bytes (an NF4 base): reductions of it are refused by name.
  try {
    g->all_reduce(at::zeros({3}, at::kByte), ReduceOp::Sum);
    ADD_FAILURE() << "a uint8 all_reduce was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("uint8 tensors carry packed bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g->reduce_scatter(at::zeros({1}, at::kByte), at::zeros({g->size()}, at::kByte), ReduceOp::Max),
               std::invalid_argument);
}

// Packed bytes (uint8) gather and broadcast unchanged, short buffers and ring-sized ones alike.
TEST(Comm, BytesGatherAndBroadcastUnchanged) {
  auto g = world();
  for (const int64_t k : {int64_t{13}, int64_t{300001}}) {
    const at::Tensor input = (at::arange(k, at::kLong) * 7 + g->rank() * 31).remainder(256).to(at::kByte);
    at::Tensor output = at::zeros({k * g->size()}, at::kByte);
    g->all_gather(output, input)->wait();
    for (int r = 0; r < g->size(); ++r) {
      EXPECT_TRUE(
          output.narrow(0, r * k, k).equal((at::arange(k, at::kLong) * 7 + r * 31).remainder(256).to(at::kByte)))
          << r;
    }
    at::Tensor t = input.clone();
    g->broadcast(t, g->size() - 1)->wait();
    EXPECT_TRUE(t.equal((at::arange(k, at::kLong) * 7 + (g->size() - 1) * 31).remainder(256).to(at::kByte)));
  }
}

}  // namespace comm_test

// Issue 40: memory handed back while a collective may still write it. Rank 1 joins the all-gather
// 300 ms late, so rank 0's is in flight when it frees the output's memory (shard::free_storage,
// as the runtime frees a gathered buffer): refused, naming the collective, and the memory kept
// for the collective to finish into. Once waited for, the same free goes through. Before the
// check, the free went through and the MPI thread wrote into unmapped memory.
TEST(Comm, MemoryInUseByACollectiveIsNotHandedBack) {
  auto world = fsdp::comm::init_world();
  if (world->size() < 2) GTEST_SKIP() << "needs a late peer";
  const int64_t k = 1 << 18;  // 1 MiB of fp32 per rank: a mapped buffer of its own
  at::Tensor input = at::full({k}, static_cast<float>(world->rank() + 1));
  at::Tensor output = fsdp::shard::empty_buffer(k * world->size(), at::kFloat);
  if (world->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  fsdp::comm::CollectiveLabel label("unit 'blocks.3'");
  auto work = world->all_gather(output, input);
  if (world->rank() == 0) {
    std::string refused;
    try {
      fsdp::shard::free_storage(output);
    } catch (const std::logic_error& e) {
      refused = e.what();
    }
    EXPECT_NE(refused.find("in use by a collective in flight"), std::string::npos) << refused;
    EXPECT_NE(refused.find("all_gather(262144 x " + std::to_string(world->size()) + " Float)"), std::string::npos)
        << refused;
    EXPECT_NE(refused.find("unit 'blocks.3'"), std::string::npos) << refused;
  }
  work->wait();
  EXPECT_TRUE(fsdp::shard::storage_is_allocated(output));
  EXPECT_EQ(output[k * world->size() - 1].item<float>(), static_cast<float>(world->size()));
  EXPECT_NO_THROW(fsdp::shard::free_storage(output));
  EXPECT_FALSE(fsdp::shard::storage_is_allocated(output));
}
