// The step's edge on the device (issue 54, item 5): between the last backward and the optimizer's
// update the host reads no tensor value, so on a GPU it issues the update without waiting for
// backward, the gradient norm's all-reduce and the clipping.
//
// What is measured: the host reads (aten::_local_scalar_dense, behind every .item(), and
// aten::nonzero, whose size a host must read) the trainer's thread runs inside its
// "fsdp::clip_and_step" scope: loss scaling's unscale, the norm, clipping, the verdict and the
// optimizer. On the CPU a read costs nothing, so the trainer takes the same path there and the
// count stands for the wait a GPU would have.
//   Before (the norm read as a double to judge the step and scale the gradients): one read a step.
//   Now, with the fused AdamW (libtorch's CPU kernel here, the default on a GPU), which skips a step
//   whose norm is not finite by the device flag: none. The composed AdamW reads the flag: one a step.
// Inputs: the trainer's llama-test, 4 steps, full_shard, at 1 and 2 ranks; clipped and unclipped
// fp32, and fp16 compute with dynamic loss scaling. On the CPU, and with FSDP_TEST_DEVICE=cuda on
// a GPU (scripts/gpu-check.sh), where the reads counted are the waits the change removes.
//
// And a step skipped on the device is the step the host-judged path skips: the same run with a NaN
// batch, once judged after the update (the device's flag) and once before it (the spike guard
// on, with a z-score no loss reaches), ends with the same bits in every loss, parameter and moment.
// A kernel that ignored the flag would apply NaN gradients (the run stops as diverged); a skipped
// step left counted would shift AdamW's bias corrections from step 4 on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/record_function.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/optim/adamw_kernel.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"
#include "checkpoint_bytes.h"

namespace step_edge_test {

namespace fs = std::filesystem;
using fsdp::optim::AdamWKernel;
using fsdp::train::TrainConfig;

TrainConfig small_llama(AdamWKernel kernel) {
  std::string text = "name = \"step-edge-test\"\n[model]\nname = \"llama-test\"\n[data]\nsource = \"fortunes\"\n";
  text += "[train]\nsteps = 4\nglobal_batch = 8\nseq_len = 32\nthreads = 1\ngrad_clip = 1.0\n";
  text += "[optimizer]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 1\n";
  text += "[eval]\nevery = 0\nsample_tokens = 0\n";
  TrainConfig config = fsdp::train::parse_train_config(text, "step_edge_test");
  config.optimizer.kernel = kernel;
  // FSDP_TEST_DEVICE=cuda (scripts/gpu-check.sh's step_edge stage): on the GPU, where the fused
  // kernel reads its step counts and the flag on the device and the composed update waits for it.
  const char* device = std::getenv("FSDP_TEST_DEVICE");
  if (device != nullptr && std::string(device) == "cuda") config.device = c10::DeviceType::CUDA;
  return config;
}

// Host reads inside the scope on this thread, and the scope's entries.
struct HostReads {
  static int64_t& reads() {
    static thread_local int64_t count = 0;
    return count;
  }
  static int64_t& scopes() {
    static thread_local int64_t count = 0;
    return count;
  }
  static int& depth() {  // open "fsdp::clip_and_step" scopes
    static thread_local int open = 0;
    return open;
  }
  static int& kernel_depth() {  // open aten::_fused_adamw_ calls
    static thread_local int open = 0;
    return open;
  }
  static int& host_coefficient_depth() {  // open kHostCoefficient scopes
    static thread_local int open = 0;
    return open;
  }
  static int64_t& rescales() {  // aten::_foreach_mul_ calls in the scope, outside the fused kernel
    static thread_local int64_t count = 0;
    return count;
  }
};

constexpr const char* kScope = "fsdp::clip_and_step";
// libtorch's CPU kernel reads its own step counts on the host (state_steps[i].item(), in host
// memory); the CUDA kernel reads them on the device. Not counted: the trainer's reads are.
constexpr const char* kFusedKernel = "aten::_fused_adamw_";
// Gradients in host memory (a CPU run, CPU offload): the clipping reads its coefficient there, a
// read of host memory that waits for nothing, to skip a pass over every gradient shard when the
// norm is within the bound. Not counted; on a GPU the scope is never entered.
constexpr const char* kHostCoefficient = "fsdp::clip_coefficient_in_host_memory";

at::CallbackHandle count_host_reads() {
  return at::addThreadLocalCallback(at::RecordFunctionCallback(
                                        [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                                          const std::string name = fn.name();
                                          if (name == kScope) {
                                            ++HostReads::depth();
                                            ++HostReads::scopes();
                                          } else if (name == kFusedKernel) {
                                            ++HostReads::kernel_depth();
                                          } else if (name == kHostCoefficient) {
                                            ++HostReads::host_coefficient_depth();
                                          } else if (HostReads::depth() > 0 && HostReads::kernel_depth() == 0) {
                                            if (HostReads::host_coefficient_depth() == 0 &&
                                                (name == "aten::_local_scalar_dense" || name == "aten::nonzero"))
                                              ++HostReads::reads();
                                            if (name == "aten::_foreach_mul_") ++HostReads::rescales();
                                          }
                                          return nullptr;
                                        },
                                        [](const at::RecordFunction& fn, at::ObserverContext*) {
                                          const std::string name = fn.name();
                                          if (name == kScope) --HostReads::depth();
                                          if (name == kFusedKernel) --HostReads::kernel_depth();
                                          if (name == kHostCoefficient) --HostReads::host_coefficient_depth();
                                        })
                                        .needsInputs(false));
}

struct Counted {
  int64_t reads = 0;
  int64_t scopes = 0;
  int64_t rescales = 0;
};

Counted reads_during(const TrainConfig& config, const fsdp::comm::ProcessGroupPtr& world) {
  HostReads::reads() = 0;
  HostReads::scopes() = 0;
  HostReads::rescales() = 0;
  const at::CallbackHandle handle = count_host_reads();
  const auto summary = fsdp::train::train(config, world, {/*print=*/false, /*write_files=*/false});
  at::removeCallback(handle);
  for (double loss : summary.losses) EXPECT_TRUE(std::isfinite(loss));
  return {HostReads::reads(), HostReads::scopes(), HostReads::rescales()};
}

TEST(StepEdge, TheFusedUpdateIsIssuedWithoutAHostRead) {
  auto world = fsdp::comm::init_world();
  struct Case {
    const char* what;
    double grad_clip;
    at::ScalarType compute;
  };
  for (const Case& c : {Case{"fp32, clipped", 1.0, at::kFloat}, Case{"fp32, unclipped", 0.0, at::kFloat},
                        Case{"fp16, loss scaling, clipped", 1.0, at::kHalf}}) {
    TrainConfig fused = small_llama(AdamWKernel::Fused);
    fused.grad_clip = c.grad_clip;
    fused.fsdp.param_dtype = c.compute;
    const Counted on_device = reads_during(fused, world);
    EXPECT_EQ(on_device.scopes, 4) << c.what << ": the scope is entered once a step";
    EXPECT_EQ(on_device.reads, 0) << c.what << ": host reads between backward and the fused update";

    // The count can see a read: the composed update reads the flag on the host, once a step.
    TrainConfig composed = fused;
    composed.optimizer.kernel = AdamWKernel::Composed;
    const Counted on_host = reads_during(composed, world);
    EXPECT_EQ(on_host.scopes, 4) << c.what;
    EXPECT_EQ(on_host.reads, 4) << c.what << ": the composed update's flag, read once a step";
  }
}

// Clipping multiplies the gradient shards by min(1, max / norm). On a GPU by a coefficient the host
// never reads: one foreach launch a step, even when it is 1. In host memory (a CPU run, or CPU
// offload, where a large model's shards are gigabytes) the coefficient is read for nothing and a
// step within the bound skips the pass. Inputs: the fused update (the only _foreach_mul_ of the
// scope is then the clipping's), fp32, 4 steps; a bound no norm reaches (1e6) and one every norm
// exceeds (1e-3), which shows the count sees the pass.
TEST(StepEdge, GradientsInHostMemoryWithinTheBoundAreNotRescaled) {
  auto world = fsdp::comm::init_world();
  TrainConfig within = small_llama(AdamWKernel::Fused);
  within.grad_clip = 1e6;
  const bool on_gpu = within.device == c10::DeviceType::CUDA;
  EXPECT_EQ(reads_during(within, world).rescales, on_gpu ? 4 : 0) << "clipping within the bound";
  TrainConfig beyond = within;
  beyond.grad_clip = 1e-3;
  EXPECT_EQ(reads_during(beyond, world).rescales, 4) << "clipping beyond the bound: one pass a step";
}

using fsdp_test::checkpoint_data;

TEST(StepEdge, AStepSkippedOnTheDeviceIsTheStepTheHostSkips) {
  auto world = fsdp::comm::init_world();
  const std::string base =
      (fs::temp_directory_path() / ("fsdp_step_edge_test_" + std::to_string(world->size()))).string();
  if (world->rank() == 0) fs::remove_all(base);
  world->barrier()->wait();
  TrainConfig after = small_llama(AdamWKernel::Fused);
  after.steps = 6;
  after.checkpoint.every = 6;
  after.output_dir = base + "/judged-after";
  TrainConfig before = after;  // the spike guard judges every step before its update; no loss is a spike
  before.output_dir = base + "/judged-before";
  before.guard.spike_zscore = 1e9;
  setenv("FSDP_TEST_LOSS_FAULTS", "3:nan", 1);
  const auto device = fsdp::train::train(after, world, {false, true});
  const auto host = fsdp::train::train(before, world, {false, true});
  unsetenv("FSDP_TEST_LOSS_FAULTS");
  EXPECT_EQ(device.skipped_steps, 1);
  EXPECT_EQ(host.skipped_steps, 1);
  ASSERT_EQ(device.grad_norms.size(), 6u);
  EXPECT_TRUE(std::isnan(device.grad_norms[2])) << "read after the update, the NaN norm is recorded as it was";
  ASSERT_EQ(device.losses.size(), 6u);
  ASSERT_EQ(host.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    if (i == 2) {
      EXPECT_TRUE(std::isnan(device.losses[i]) && std::isnan(host.losses[i])) << "step 3's loss is the fault's NaN";
    } else {
      EXPECT_EQ(device.losses[i], host.losses[i]) << "step " << i + 1;
    }
  }
  const auto judged_after = checkpoint_data(after.output_dir + "/checkpoints/step-00000006");
  ASSERT_FALSE(judged_after.empty());
  EXPECT_TRUE(judged_after == checkpoint_data(before.output_dir + "/checkpoints/step-00000006"))
      << "the final parameters or AdamW moments differ between the step skipped on the device and on the host";
  world->barrier()->wait();
  if (world->rank() == 0) fs::remove_all(base);
}

}  // namespace step_edge_test
