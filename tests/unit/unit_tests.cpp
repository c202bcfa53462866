// Single-process tests of the pieces that need no other rank.
#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>
#include <memory>
#include <mutex>
#include <vector>

#include <cstdlib>
#include <fstream>

#include "fsdp/comm/collective_agreement.h"
#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/device_assignment.h"
#include "fsdp/comm/launch.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/nn/hooks.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/shard/flat_param.h"
#include "fsdp/shard/host_heap.h"
#include "fsdp/shard/nf4_storage.h"
#include "fsdp/shard/storage.h"
#include "process_memory.h"

namespace unit_tests {

TEST(Launch, NoLauncherMeansOneProcess) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) unsetenv(name);
  auto info = fsdp::comm::launch_info_from_env();
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.launcher, "none");
}

TEST(Launch, SlurmVariables) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) unsetenv(name);
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  auto info = fsdp::comm::launch_info_from_env();
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.launcher, "slurm");
  setenv("SLURM_NTASKS", "eight", 1);
  EXPECT_THROW(fsdp::comm::launch_info_from_env(), std::runtime_error);
  setenv("SLURM_NTASKS", "4", 1);  // rank 5 of 4
  EXPECT_THROW(fsdp::comm::launch_info_from_env(), std::runtime_error);
  unsetenv("SLURM_PROCID");
}

// Issue 40: what the launcher does not say is known as unknown, and Slurm's tasks on this node come
// from SLURM_TASKS_PER_NODE when --ntasks-per-node was not given (before: the world size, which
// made hybrid sharding's default shard group the whole world).
TEST(Launch, LocalRankAndSizeKnownOrNot) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                           "SLURM_TASKS_PER_NODE", "SLURM_NODEID"}) {
    unsetenv(name);
  }
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  auto info = fsdp::comm::launch_info_from_env();
  EXPECT_FALSE(info.local_rank_known);
  EXPECT_FALSE(info.local_world_size_known);
  EXPECT_EQ(info.local_world_size, 8);
  EXPECT_EQ(info.local_rank_variable, "SLURM_LOCALID");
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
  setenv("SLURM_NODEID", "1", 1);
  info = fsdp::comm::launch_info_from_env();
  EXPECT_TRUE(info.local_rank_known);
  EXPECT_TRUE(info.local_world_size_known);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.local_world_size_variable, "SLURM_TASKS_PER_NODE");
  setenv("SLURM_NTASKS_PER_NODE", "2", 1);  // said outright: that wins
  EXPECT_EQ(fsdp::comm::launch_info_from_env().local_world_size, 2);
  for (const char* name : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                           "SLURM_TASKS_PER_NODE", "SLURM_NODEID"}) {
    unsetenv(name);
  }
}

TEST(Launch, SlurmTasksPerNode) {
  using fsdp::comm::slurm_tasks_on_node;
  EXPECT_EQ(slurm_tasks_on_node("8", 0), 8);
  EXPECT_EQ(slurm_tasks_on_node("8", 1), -1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), -1);
  EXPECT_EQ(slurm_tasks_on_node("4,3(x2)", 2), 3);
  for (const char* bad : {"", "x", "2(x3", "2(3)", "-1", "2(x0)", "0"})
    EXPECT_EQ(slurm_tasks_on_node(bad, 0), -1) << bad;
}

// Two ranks on one device (more ranks on a node than devices, or no local rank from the launcher)
// are refused before NCCL starts, naming the ranks, the device and the launcher's variables.
TEST(DeviceAssignment, TwoRanksOnOneDeviceAreRefusedByName) {
  using fsdp::comm::DeviceClaim;
  fsdp::comm::LaunchInfo launch;
  launch.launcher = "openmpi";
  launch.world_size = 4;
  launch.local_world_size = 4;
  launch.local_rank_variable = "OMPI_COMM_WORLD_LOCAL_RANK";
  launch.local_world_size_variable = "OMPI_COMM_WORLD_LOCAL_SIZE";
  // 4 ranks on a node with 2 devices: local ranks 0..3 take devices 0, 1, 0, 1.
  std::vector<DeviceClaim> claims;
  for (int local = 0; local < 4; ++local) {
    launch.local_rank = local;
    const int index = fsdp::comm::device_index_for(launch, 2);
    claims.push_back(
        fsdp::comm::claim_from_text(fsdp::comm::to_text({"node1", "GPU-" + std::to_string(index), index})));
  }
  std::string message;
  try {
    fsdp::comm::check_one_rank_per_device(claims, launch, 2);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("ranks 0 and 2 both took CUDA device 0 (GPU-0) of host 'node1'"), std::string::npos)
      << message;
  EXPECT_NE(message.find("4 ranks run on this machine (OMPI_COMM_WORLD_LOCAL_SIZE=4) and each sees 2 CUDA devices"),
            std::string::npos)
      << message;
  // One device bound to each task (srun --gpus-per-task=1): each is index 0, of distinct devices.
  std::vector<DeviceClaim> bound;
  for (int local = 0; local < 4; ++local) {
    launch.local_rank = local;
    bound.push_back({"node1", "GPU-" + std::to_string(local), fsdp::comm::device_index_for(launch, 1)});
    EXPECT_EQ(bound.back().device_index, 0);
  }
  EXPECT_NO_THROW(fsdp::comm::check_one_rank_per_device(bound, launch, 1));
  // The same device index on two hosts is two devices.
  EXPECT_NO_THROW(fsdp::comm::check_one_rank_per_device({{"a", "GPU-0", 0}, {"b", "GPU-0", 0}}, launch, 1));
  // A launcher without a local rank: every rank took local rank 0.
  launch.local_rank_known = false;
  launch.launcher = "pmi";
  launch.local_rank_variable = "MPI_LOCALRANKID";
  message.clear();
  try {
    fsdp::comm::check_one_rank_per_device({{"a", "GPU-0", 0}, {"a", "GPU-0", 0}}, launch, 8);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("the launcher (pmi) gives no rank on the machine (MPI_LOCALRANKID is unset)"),
            std::string::npos)
      << message;
  EXPECT_THROW(fsdp::comm::device_index_for(launch, 0), std::runtime_error);
}

TEST(CommWait, FromTheEnvironmentOrRefusedByName) {
  using fsdp::comm::CommWait;
  unsetenv("FSDP_COMM_WAIT");
  EXPECT_EQ(fsdp::comm::comm_wait_from_env(CommWait::kBackoff), CommWait::kBackoff);
  setenv("FSDP_COMM_WAIT", "spin", 1);
  EXPECT_EQ(fsdp::comm::comm_wait_from_env(CommWait::kBackoff), CommWait::kSpin);
  setenv("FSDP_COMM_WAIT", "backoff", 1);
  EXPECT_EQ(fsdp::comm::comm_wait_from_env(CommWait::kSpin), CommWait::kBackoff);
  setenv("FSDP_COMM_WAIT", "sleepy", 1);
  try {
    fsdp::comm::comm_wait_from_env(CommWait::kBackoff);
    ADD_FAILURE() << "FSDP_COMM_WAIT=sleepy was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("FSDP_COMM_WAIT='sleepy'"), std::string::npos) << e.what();
  }
  unsetenv("FSDP_COMM_WAIT");
}

TEST(FlatLayout, PaddingAndSegments) {
  std::vector<fsdp::shard::FlatEntry> entries = {{"a", {}, {3, 4}, 0, 12}, {"b", {}, {5}, 0, 5}};
  auto layout = fsdp::shard::FlatLayout::make(entries, 3);
  EXPECT_EQ(layout.numel, 17);
  EXPECT_EQ(layout.shard_numel, 8);  // ceil(17 / 3) = 6, rounded up to 8 elements
  EXPECT_EQ(layout.padded_numel, 24);
  EXPECT_EQ(layout.entries[1].offset, 12);
  // shard 1 covers [8, 16): the last 4 elements of a, the first 4 of b.
  auto segments = layout.segments_of_shard(1);
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[0].entry, 0u);
  EXPECT_EQ(segments[0].entry_offset, 8);
  EXPECT_EQ(segments[0].shard_offset, 0);
  EXPECT_EQ(segments[0].length, 4);
  EXPECT_EQ(segments[1].entry, 1u);
  EXPECT_EQ(segments[1].entry_offset, 0);
  EXPECT_EQ(segments[1].shard_offset, 4);
  EXPECT_EQ(segments[1].length, 4);
  // shard 2 covers [16, 24): b's last element, then padding.
  segments = layout.segments_of_shard(2);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].entry_offset, 4);
  EXPECT_EQ(segments[0].length, 1);
}

// Every rank's piece of a gathered buffer starts on 16 bytes in bf16 (and so in fp32), an NF4
// string's on 16 bytes, for any size and number of shards; one shard needs no padding (a unit of
// one parameter adopts its memory). Issue 54: only the buffer's end was padded, and a rank's
// bf16 piece started 2 bytes off whenever ceil(numel / N) was odd.
TEST(FlatLayout, EachShardStartsOnSixteenBytes) {
  for (int64_t numel : {0, 1, 7, 8, 9, 17, 1000, 4097, 1234567}) {
    const std::vector<fsdp::shard::FlatEntry> entries = {{"w", {}, {numel}, 0, numel}};
    for (int shards = 1; shards <= 9; ++shards) {
      const auto layout = fsdp::shard::FlatLayout::make(entries, shards);
      const std::string where = "numel " + std::to_string(numel) + ", " + std::to_string(shards) + " shards";
      EXPECT_EQ(layout.padded_numel, layout.shard_numel * shards) << where;
      EXPECT_GE(layout.padded_numel, std::max<int64_t>(numel, 1)) << where;
      if (shards == 1) {
        EXPECT_EQ(layout.shard_numel, std::max<int64_t>(numel, 1)) << where;
        continue;
      }
      EXPECT_EQ(layout.shard_numel * 2 % 16, 0) << where << ": a bf16 shard of " << layout.shard_numel;
      EXPECT_LT(layout.shard_numel - std::max<int64_t>((numel + shards - 1) / shards, 1), 8)
          << where << ": more padding than alignment";
      const auto storage = fsdp::shard::Nf4StorageLayout::make(layout, {false}, shards, true, at::kBFloat16);
      EXPECT_EQ(storage.shard_bytes % 16, 0) << where << ": an NF4 shard of " << storage.shard_bytes << " bytes";
      EXPECT_EQ(storage.padded_bytes, storage.shard_bytes * shards) << where;
    }
  }
}

TEST(Schedule, WarmupThenCosine) {
  fsdp::optim::WarmupCosineSchedule s{1.0, 0.1, 4, 14};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1.0);
  EXPECT_NEAR(s.lr_at(9), 0.55, 1e-12);  // half-way through the decay
  EXPECT_DOUBLE_EQ(s.lr_at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(100), 0.1);
  EXPECT_THROW(s.lr_at(-1), std::invalid_argument);
}

TEST(Hooks, CallRunsHooksAroundForward) {
  torch::nn::Linear linear(3, 2);
  std::vector<std::string> events;
  fsdp::nn::ForwardHooks hooks;
  hooks.pre_forward = [&] { events.push_back("pre"); };
  hooks.post_forward = [&](const std::vector<at::Tensor>& outputs) {
    events.push_back("post:" + std::to_string(outputs.size()) + ":" + std::to_string(outputs[0].size(1)));
  };
  auto plain = fsdp::nn::call(linear, torch::ones({1, 3}));
  EXPECT_TRUE(events.empty());
  fsdp::nn::set_forward_hooks(linear.get(), hooks);
  auto hooked = fsdp::nn::call(linear, torch::ones({1, 3}));
  EXPECT_TRUE(hooked.equal(plain));
  EXPECT_EQ(events, (std::vector<std::string>{"pre", "post:1:2"}));
  fsdp::nn::clear_forward_hooks(linear.get());
  fsdp::nn::call(linear, torch::ones({1, 3}));
  EXPECT_EQ(events.size(), 2u);
}

TEST(Storage, FreeReallocateKeepsAutogradViewsValid) {
  // 64 MiB buffer whose views autograd saves; freeing it must return the memory and backward must
  // still work once it is refilled.
  const int64_t n = 16 << 20;
  at::Tensor flat = at::randn({n});
  at::Tensor keep = flat.clone();
  at::Tensor weight = torch::empty({4096, 4096}, torch::requires_grad());
  weight.set_data(flat.view({4096, 4096}));
  at::Tensor x = torch::randn({2, 4096}, torch::requires_grad());
  at::Tensor y = torch::matmul(x, weight);
  const int64_t before = fsdp::testing::resident_bytes();
  fsdp::shard::free_storage(flat);
  const int64_t after = fsdp::testing::resident_bytes();
  EXPECT_FALSE(fsdp::shard::storage_is_allocated(flat));
  EXPECT_GT(before - after, n * 4 * 9 / 10) << "freeing did not return the memory";
  fsdp::shard::allocate_storage(flat, n * 4);
  std::memcpy(flat.data_ptr(), keep.data_ptr(), n * 4);
  y.sum().backward();
  at::Tensor expected = torch::ones({2, 4096}).matmul(keep.view({4096, 4096}).t());
  EXPECT_TRUE(torch::allclose(x.grad(), expected, 1e-4, 1e-4));
}

}  // namespace unit_tests
using namespace unit_tests;  // (helpers above, used below)

// Activation checkpointing on its own: a block with dropout, called through fsdp::nn::call with
// checkpoint_activations set, against the same block run plainly from the same generator state.
namespace unit_tests {
struct DropoutBlockImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  torch::nn::Dropout drop{nullptr};
  int forwards = 0;
  DropoutBlockImpl() {
    a = register_module("a", torch::nn::Linear(16, 64));
    b = register_module("b", torch::nn::Linear(64, 16));
    drop = register_module("drop", torch::nn::Dropout(0.3));
  }
  // Two tensor arguments and a plain one: the recomputation must get all three back.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& scale, double shift) {
    ++forwards;
    return x + drop(b(torch::gelu(a(x)))) * scale + shift;
  }
};
TORCH_MODULE(DropoutBlock);
}  // namespace unit_tests
using namespace unit_tests;  // (helpers above, used below)

// A region whose inputs need no gradient (the first block over a frozen embedding, LoRA's case):
// the checkpoint adds an anchor that requires grad so its parameters still get their gradients.
TEST(Checkpoint, InputsWithoutGradientStillGiveParametersTheirs) {
  torch::manual_seed(5);
  torch::nn::Linear plain(6, 3), checkpointed(6, 3);
  {
    torch::NoGradGuard no_grad;
    checkpointed->weight.copy_(plain->weight);
    checkpointed->bias.copy_(plain->bias);
  }
  const at::Tensor x = torch::randn({4, 6});  // requires no grad
  plain(x).pow(2).sum().backward();
  at::Tensor y = fsdp::nn::checkpoint([&](const std::vector<at::Tensor>& in) { return checkpointed(in[0]); }, {x});
  y.pow(2).sum().backward();
  ASSERT_TRUE(checkpointed->weight.grad().defined());
  EXPECT_TRUE(at::allclose(checkpointed->weight.grad(), plain->weight.grad(), 0, 1e-6));
  EXPECT_TRUE(at::allclose(checkpointed->bias.grad(), plain->bias.grad(), 0, 1e-6));
}

TEST(Checkpoint, GradientsAndDropoutMatchThePlainRun) {
  torch::manual_seed(3);
  DropoutBlock plain, checkpointed;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < plain->parameters().size(); ++i) checkpointed->parameters()[i].copy_(plain->parameters()[i]);
  }
  fsdp::nn::ForwardHooks hooks;
  hooks.checkpoint_activations = true;
  fsdp::nn::set_forward_hooks(checkpointed.ptr().get(), hooks);

  at::Tensor x = torch::randn({8, 16}), scale = torch::full({16}, 0.5);
  at::Tensor x1 = x.clone().requires_grad_(), x2 = x.clone().requires_grad_();
  torch::manual_seed(11);
  at::Tensor y1 = fsdp::nn::call(plain, x1, scale, 0.25);
  torch::manual_seed(11);
  at::Tensor y2 = fsdp::nn::call(checkpointed, x2, scale, 0.25);
  EXPECT_TRUE(at::equal(y1, y2));
  (void)torch::rand({4});  // move the generator on: the recomputation must not draw from here
  auto generator_state = [] {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  };
  const at::Tensor before_backward = generator_state();
  y1.pow(2).sum().backward();
  y2.pow(2).sum().backward();
  EXPECT_EQ(checkpointed->forwards, 2) << "forward, then the recomputation in backward";
  EXPECT_TRUE(at::allclose(x1.grad(), x2.grad(), 0, 1e-6));
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    EXPECT_TRUE(at::allclose(plain->parameters()[i].grad(), checkpointed->parameters()[i].grad(), 0, 1e-6)) << i;
  }
  EXPECT_TRUE(at::equal(generator_state(), before_backward)) << "backward leaves the generator where it was";
  fsdp::nn::clear_forward_hooks(checkpointed.ptr().get());

  // Without grad mode: a plain forward, nothing saved.
  torch::NoGradGuard no_grad;
  at::Tensor z = fsdp::nn::call(checkpointed, x, scale, 0.0);
  EXPECT_FALSE(z.requires_grad());
}

TEST(Storage, BufferCacheReusesSameSizeWithinCapacity) {
  fsdp::shard::clear_buffer_cache();
  const int64_t before = fsdp::shard::buffer_cache_capacity();
  fsdp::shard::set_buffer_cache_capacity(3 * 4096);
  at::Tensor a = at::ones({1024}), b = at::ones({1024}), c = at::ones({1024}), d = at::ones({1024});
  fsdp::shard::free_storage(a, /*keep_in_cache=*/true);
  EXPECT_EQ(fsdp::shard::buffer_cache_bytes(), 4096);
  fsdp::shard::free_storage(b, true);
  fsdp::shard::free_storage(c, true);
  fsdp::shard::free_storage(d, true);  // over capacity: back to the allocator
  EXPECT_EQ(fsdp::shard::buffer_cache_bytes(), 3 * 4096);
  fsdp::shard::free_storage(at::ones({10}), false);  // not kept
  EXPECT_EQ(fsdp::shard::buffer_cache_bytes(), 3 * 4096);
  // Same size: served from the cache (one of the three kept buffers); another size is not.
  fsdp::shard::allocate_storage(a, 4096);
  EXPECT_EQ(fsdp::shard::buffer_cache_bytes(), 2 * 4096);
  at::Tensor e = fsdp::shard::empty_from_cache(1024, at::kFloat);
  EXPECT_EQ(fsdp::shard::buffer_cache_bytes(), 4096);
  at::Tensor f = fsdp::shard::empty_from_cache(1000, at::kFloat);
  EXPECT_EQ(fsdp::shard::buffer_cache_bytes(), 4096);
  fsdp::shard::clear_buffer_cache();
  EXPECT_EQ(fsdp::shard::buffer_cache_bytes(), 0);
  fsdp::shard::set_buffer_cache_capacity(before);
}

// The heap's bytes in use follow the program's allocations, whichever malloc serves it: glibc's in
// this test program, which does not link tcmalloc (the apps do: tests/cli/config_memory.py checks
// their runs report it).
TEST(HostHeap, CountsTheProgramsLiveBytesAndHandsFreePagesBack) {
  EXPECT_EQ(fsdp::shard::host_heap(), fsdp::shard::HostHeap::Glibc);
  EXPECT_STREQ(fsdp::shard::host_heap_name(), "glibc");
  const int64_t before = fsdp::shard::host_heap_bytes().in_use;
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 64; ++i) blocks.emplace_back(new char[64 << 10]());  // 4 MiB in 64 KiB blocks
  const fsdp::shard::HostHeapBytes held = fsdp::shard::host_heap_bytes();
  EXPECT_GE(held.in_use - before, 4 << 20);
  EXPECT_GE(held.mapped, held.in_use);
  blocks.clear();
  EXPECT_LT(fsdp::shard::host_heap_bytes().in_use - before, 1 << 20);
  fsdp::shard::release_free_host_memory();
  EXPECT_LE(fsdp::shard::host_heap_bytes().mapped, held.mapped);
}

// FSDP's host buffers of 1 MiB or more live outside glibc's heap (so their holes cannot fragment
// it), when made and when re-allocated after a free; smaller ones come from the heap as usual.
TEST(Storage, LargeHostBuffersAreMappedOutsideTheHeap) {
  auto heap_in_use = [] { return fsdp::shard::host_heap_bytes().in_use; };
  const int64_t numel = (8 << 20) / 4;  // 8 MiB of float32: under glibc's 32 MiB mmap threshold
  const int64_t before = heap_in_use();
  at::Tensor large = fsdp::shard::empty_buffer(numel, at::kFloat).fill_(2.0f);
  EXPECT_LT(heap_in_use() - before, 1 << 20) << "an 8 MiB buffer came from the heap";
  EXPECT_EQ(large.numel(), numel);
  EXPECT_EQ(large.sum().item<double>(), 2.0 * numel);
  fsdp::shard::free_storage(large);
  fsdp::shard::allocate_storage(large, static_cast<size_t>(numel) * 4);
  EXPECT_LT(heap_in_use() - before, 1 << 20) << "re-allocation came from the heap";
  large.fill_(3.0f);
  EXPECT_EQ(large.sum().item<double>(), 3.0 * numel);
  at::Tensor small = fsdp::shard::empty_buffer(1024, at::kFloat).fill_(1.0f);
  EXPECT_EQ(small.sum().item<double>(), 1024.0);
}

// When ranks agree on collectives before use (collective_agreement.h): first_step covers what runs
// before the first step and the first step begun, whatever its number (a resumed run's); a
// setting overrides the environment and the backend's default.
TEST(CollectiveAgreement, DueInTheFirstStepOrEveryStep) {
  using fsdp::comm::collective_agreement_due;
  using fsdp::comm::CollectiveAgreementMode;
  EXPECT_FALSE(collective_agreement_due(CollectiveAgreementMode::kOff));
  EXPECT_TRUE(collective_agreement_due(CollectiveAgreementMode::kFirstStep));  // construction, loading
  fsdp::comm::begin_collective_step(7);
  EXPECT_TRUE(collective_agreement_due(CollectiveAgreementMode::kFirstStep));
  fsdp::comm::begin_collective_step(8);
  EXPECT_FALSE(collective_agreement_due(CollectiveAgreementMode::kFirstStep));
  EXPECT_TRUE(collective_agreement_due(CollectiveAgreementMode::kEveryStep));
  fsdp::comm::set_collective_agreement(CollectiveAgreementMode::kEveryStep);
  EXPECT_EQ(fsdp::comm::collective_agreement_mode(CollectiveAgreementMode::kOff), CollectiveAgreementMode::kEveryStep);
  fsdp::comm::set_collective_agreement(std::nullopt);
  if (std::getenv("FSDP_AGREE_COLLECTIVES") == nullptr) {
    EXPECT_EQ(fsdp::comm::collective_agreement_mode(CollectiveAgreementMode::kFirstStep),
              CollectiveAgreementMode::kFirstStep);
  }
}
