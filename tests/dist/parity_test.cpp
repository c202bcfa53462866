// The anchor: FSDP at N ranks trains exactly like one process without sharding.
//
// Reference: the same TinyTransformer, same seed, trained on the whole global batch by libtorch's
// own torch::optim::AdamW (or SGD) and clip_grad_norm_. FSDP: each rank takes its share of the
// batch (optionally in micro-batches), gradients are averaged across ranks by the runtime, and the
// sharded optimizer steps on shards. Inputs: 20 steps, global batch 24 x 8 tokens drawn from a
// per-step seed, warm-up + cosine learning rate, clipping at norm 1 (and runs without clipping:
// with clipping every step, AdamW's m / sqrt(v) cannot see a gradient scaled by a constant).
// Every step also compares the global gradient norm before clipping with the reference's
// clip_grad_norm_ result (relative 1e-5), which sees a wrong scale (a sum instead of an average, a
// missing 1/R across replicas, a wrong micro-batch divisor) at once; and at the first step each
// rank's gradient shard is compared with its slice of the reference gradient (1e-6: one backward,
// summation order only).
//
// Device: the FSDP runs use the CPU and MPI, or with FSDP_TEST_DEVICE=cuda (a FSDP_CUDA build,
// scripts/gpu-check.sh) this rank's GPU and NCCL, TF32 off; the reference always runs on the CPU.
//
// Tolerance 1e-5 (absolute, on every step's loss and every final parameter): both runs do the same
// fp32 arithmetic except the order of summations (a batch split over ranks and micro-batches, the
// reduce-scatter's sum order, the norm's partial sums), each differing by a few ulps (~1e-7
// relative); 20 Adam steps of at most lr = 3e-3 keep that far below 1e-5, while any real mistake
// (a missing or doubled gradient, a wrong shard offset) shows at 1e-3 or more.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <map>

#include "fsdp/comm/device_group.h"
#include "fsdp/comm/nccl_process_group.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/shard/nf4.h"
#include "tiny_transformer.h"

namespace parity_test {

using fsdp::models::TinyConfig;
using fsdp::models::TinyTransformer;
using fsdp::models::TinyTransformerImpl;
using fsdp::runtime::ShardingStrategy;

constexpr int kSteps = 20;
constexpr int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3, 4 ranks times 2 micro-batches
constexpr double kTolerance = 1e-5;
constexpr int64_t kSeed = 1234;

enum class Accumulation { None, SyncEachMicroBatch, NoSync };
enum class OptimizerKind { AdamW, Sgd };

struct RunConfig {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  Accumulation accumulation = Accumulation::None;
  OptimizerKind optimizer = OptimizerKind::AdamW;
  bool build_while_constructing = true;  // build_fully_sharded, else fully_shard on a built model
  bool freeze = false;                   // first block's qkv frozen
  bool skip_a_block = false;             // block 1 unused at steps 3, 8, 13, 18
  int shard_group_size = 0;              // HybridShard: S (R = N / S replica groups)
  bool cpu_offload = false;              // shards and optimizer state in host memory
  bool clip = true;                      // clip the global gradient norm to 1 each step
  bool freeze_every_block = false;       // fc1 and fc2 frozen in every block
  bool nf4_base = false;                 // the frozen matrices stored as NF4 (QLoRA's base)
  bool fused_adamw_on_host = false;      // AdamW through libtorch's fused kernel on the CPU too
  std::string describe() const {
    std::ostringstream out;
    out << fsdp::runtime::to_string(strategy) << " S=" << shard_group_size
        << " accumulation=" << static_cast<int>(accumulation) << " optimizer=" << static_cast<int>(optimizer)
        << " build=" << build_while_constructing << " freeze=" << freeze << " skip=" << skip_a_block
        << " offload=" << cpu_offload << " clip=" << clip << " freeze_every_block=" << freeze_every_block
        << " nf4_base=" << nf4_base << " fused_adamw_on_host=" << fused_adamw_on_host;
    return out.str();
  }
};

struct RunResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // global norm before clipping, every step
  std::map<std::string, at::Tensor> params;
  std::map<std::string, at::Tensor> first_grads;  // reference: full gradients after step 0's backward
  // FSDP: (name, offset in the flattened parameter, this rank's piece of its step-0 gradient)
  std::vector<std::tuple<std::string, int64_t, at::Tensor>> first_grad_pieces;
};

constexpr double kNoClip = 1e30;  // clip_grad_norm with this bound only measures the norm

TinyConfig model_config(const RunConfig& run) {
  TinyConfig config;
  config.freeze_first_block_attention = run.freeze;
  config.freeze_mlp_in_every_block = run.freeze_every_block;
  return config;
}

// AdamW peaks at 3e-3; SGD needs a larger rate to move the loss in 20 steps.
fsdp::optim::WarmupCosineSchedule schedule(OptimizerKind kind = OptimizerKind::AdamW) {
  const double peak = kind == OptimizerKind::AdamW ? 3e-3 : 0.3;
  return {peak, peak / 10, 5, kSteps};
}

// Global batch of step `step`: ids [24, 9] (inputs are the first 8 columns, targets the last 8).
at::Tensor batch_of_step(int step, int64_t vocab) {
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step));
  return at::randint(0, vocab, {kGlobalBatch, 9}, generator, at::kLong);
}

int64_t skipped_block(const RunConfig& run, int step) { return run.skip_a_block && step % 5 == 3 ? 1 : -1; }

at::Tensor loss_of(TinyTransformerImpl& model, const at::Tensor& ids, int64_t skip, int64_t vocab) {
  auto logits = model.forward(ids.narrow(1, 0, 8), skip);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), ids.narrow(1, 1, 8).reshape(-1));
}

RunResult run_reference(const RunConfig& run) {
  torch::manual_seed(kSeed);
  TinyConfig config = model_config(run);
  TinyTransformer model(config);
  if (run.nf4_base) {
    // What the sharded run computes with: each frozen matrix as NF4 gives it back, in fp32.
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      if (!p.requires_grad() && p.dim() == 2) p.copy_(fsdp::shard::dequantize_nf4(fsdp::shard::quantize_nf4(p)));
    }
  }
  std::vector<at::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (run.optimizer == OptimizerKind::AdamW) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.0)));
    optimizer = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(1e-3));
  } else {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(
                                   torch::optim::SGDOptions(1e-3).momentum(0.9).weight_decay(0.01)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::SGDOptions>(
                                      torch::optim::SGDOptions(1e-3).momentum(0.9).weight_decay(0.0)));
    optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(1e-3));
  }
  RunResult result;
  for (int step = 0; step < kSteps; ++step) {
    const double lr = schedule(run.optimizer).lr_at(step);
    for (auto& group : optimizer->param_groups()) {
      if (run.optimizer == OptimizerKind::AdamW) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      } else {
        static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
      }
    }
    // Zero (not undefine) gradients, as FSDP's shards are: a skipped block still decays and moves.
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    auto loss = loss_of(*model, batch_of_step(step, config.vocab), skipped_block(run, step), config.vocab);
    loss.backward();
    std::vector<at::Tensor> trainable;
    for (auto& p : model->parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    if (step == 0) {
      for (const auto& item : model->named_parameters()) {
        if (item.value().grad().defined()) result.first_grads[item.key()] = item.value().grad().clone();
      }
    }
    result.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(trainable, run.clip ? 1.0 : kNoClip));
    optimizer->step();
    result.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) result.params[item.key()] = item.value().detach().clone();
  return result;
}

bool test_on_cuda() {
  const char* device = std::getenv("FSDP_TEST_DEVICE");
  return device != nullptr && std::string(device) == "cuda";
}

RunResult run_fsdp(const RunConfig& run) {
  auto world = fsdp::comm::init_world();
  const int rank = world->rank(), n = world->size();
  TinyConfig config = model_config(run);
  fsdp::runtime::FsdpOptions options;
  options.strategy = run.strategy;
  options.shard_group_size = run.shard_group_size;
  options.cpu_offload = run.cpu_offload;
  if (run.nf4_base) options.frozen_nf4 = [](const std::string&, const at::Tensor& p) { return p.dim() == 2; };
  if (test_on_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(false);  // fp32 parity: no 10-bit-mantissa matmuls
    options.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(fsdp::comm::local_device_index()));
  }
  // NCCL on a GPU, MPI's world on the CPU, the staged backend under FSDP_DEVICE_COMM=staged (made
  // once: a group per run would split the world anew each time); host tensors (the loss average)
  // still go through world.
  static const fsdp::comm::ProcessGroupPtr group = fsdp::comm::make_device_group(world, options.device);
  torch::manual_seed(kSeed);
  std::shared_ptr<fsdp::runtime::FsdpState> state;
  std::shared_ptr<TinyTransformerImpl> module;
  if (run.build_while_constructing) {
    options.wrap_policy.module_types = {"AttentionMlpBlock"};
    auto model = fsdp::runtime::build_fully_sharded<TinyTransformerImpl>(
        group, options, [&] { return std::make_shared<TinyTransformerImpl>(config); });
    state = model.state_ptr();
    module = model.module();
  } else {
    options.wrap_policy.min_params = 5000;  // selects each block (~11k parameters), not the embedding
    auto model = fsdp::runtime::fully_shard(std::make_shared<TinyTransformerImpl>(config), group, options);
    state = model.state_ptr();
    module = model.module();
  }
  fsdp::runtime::FullyShardedModule<TinyTransformerImpl> model(module, state);
  // NF4: the frozen matrices' shards are the encoded bytes, and training never changes them.
  std::vector<std::pair<fsdp::shard::FlatParam*, at::Tensor>> nf4_shards;
  for (fsdp::shard::FlatParam* flat : state->flat_params()) {
    if (flat->nf4_storage() != nullptr) nf4_shards.emplace_back(flat, flat->shard().cpu().clone());
  }
  if (run.nf4_base) {
    EXPECT_EQ(nf4_shards.size(), static_cast<size_t>(config.layers)) << "each block's frozen fc1 and fc2 stored as NF4";
    for (const auto& [flat, bytes] : nf4_shards) EXPECT_EQ(bytes.scalar_type(), at::kByte) << flat->unit_name();
  }
  if (run.strategy == ShardingStrategy::HybridShard) {
    // R x S: gathers inside groups of S ranks, the replicas of a shard in groups of R.
    EXPECT_EQ(state->shard_group()->size(), run.shard_group_size);
    EXPECT_EQ(state->replicate_group() ? state->replicate_group()->size() : 1, n / run.shard_group_size);
    EXPECT_EQ(state->replica_index(), rank / run.shard_group_size);
  }
  std::unique_ptr<fsdp::optim::ShardedOptimizer> optimizer;
  if (run.optimizer == OptimizerKind::AdamW) {
    fsdp::optim::AdamWOptions adamw;
    adamw.beta2 = 0.95;
    adamw.weight_decay = 0.1;
    if (run.fused_adamw_on_host) adamw.kernel = fsdp::optim::AdamWKernel::Fused;
    optimizer = std::make_unique<fsdp::optim::ShardedAdamW>(*state, adamw);
  } else {
    fsdp::optim::SgdOptions sgd;
    sgd.momentum = 0.9;
    sgd.weight_decay = 0.01;
    optimizer = std::make_unique<fsdp::optim::ShardedSgd>(*state, sgd);
  }
  const int micro_batches = run.accumulation == Accumulation::None ? 1 : 2;
  const int64_t local = kGlobalBatch / n, micro = local / micro_batches;
  RunResult result;
  for (int step = 0; step < kSteps; ++step) {
    optimizer->set_lr(schedule(run.optimizer).lr_at(step));
    optimizer->zero_grad();
    at::Tensor ids = batch_of_step(step, config.vocab).narrow(0, rank * local, local).to(options.device);
    double local_loss = 0;
    for (int m = 0; m < micro_batches; ++m) {
      if (run.accumulation == Accumulation::NoSync) state->set_requires_gradient_sync(m == micro_batches - 1);
      auto loss = [&] {
        auto logits = model.forward(ids.narrow(0, m * micro, micro).narrow(1, 0, 8), skipped_block(run, step));
        return torch::nn::functional::cross_entropy(logits.reshape({-1, config.vocab}),
                                                    ids.narrow(0, m * micro, micro).narrow(1, 1, 8).reshape(-1));
      }() / micro_batches;
      loss.backward();
      local_loss += loss.item<double>();
    }
    if (step == 0) {
      for (fsdp::shard::FlatParam* flat : state->flat_params()) {
        if (!flat->trainable()) continue;
        flat->wait_for_shard_grad();
        const at::Tensor grad = flat->shard_grad().cpu();
        for (const auto& segment : flat->layout().segments_of_shard(flat->shard_index())) {
          result.first_grad_pieces.emplace_back(flat->layout().entries[segment.entry].name, segment.entry_offset,
                                                grad.narrow(0, segment.shard_offset, segment.length).clone());
        }
      }
    }
    result.grad_norms.push_back(fsdp::optim::clip_grad_norm(*state, run.clip ? 1.0 : kNoClip));
    optimizer->step();
    at::Tensor global = at::tensor({local_loss}, at::kDouble);
    world->all_reduce(global, fsdp::comm::ReduceOp::Average)->wait();
    result.losses.push_back(global.item<double>());
  }
  for (auto& [name, tensor] : state->full_parameters()) result.params[name] = tensor.cpu();
  for (const auto& [flat, bytes] : nf4_shards)
    EXPECT_TRUE(flat->shard().cpu().equal(bytes)) << flat->unit_name() << ": NF4 bytes changed";
  return result;
}

void expect_parity(const RunConfig& run) {
  static std::map<std::string, RunResult> references;
  std::string key = std::to_string(static_cast<int>(run.optimizer)) + std::to_string(run.freeze) +
                    std::to_string(run.skip_a_block) + std::to_string(run.clip) +
                    std::to_string(run.freeze_every_block) + std::to_string(run.nf4_base);
  if (!references.count(key)) references[key] = run_reference(run);
  const RunResult& reference = references[key];
  RunResult sharded = run_fsdp(run);
  ASSERT_EQ(sharded.losses.size(), reference.losses.size());
  for (size_t step = 0; step < reference.losses.size(); ++step) {
    EXPECT_NEAR(sharded.losses[step], reference.losses[step], kTolerance) << run.describe() << " step " << step;
  }
  ASSERT_EQ(sharded.grad_norms.size(), reference.grad_norms.size());
  for (size_t step = 0; step < reference.grad_norms.size(); ++step) {
    EXPECT_NEAR(sharded.grad_norms[step], reference.grad_norms[step], 1e-5 * reference.grad_norms[step])
        << run.describe() << " gradient norm at step " << step;
  }
  ASSERT_FALSE(sharded.first_grad_pieces.empty()) << run.describe();
  for (const auto& [name, offset, piece] : sharded.first_grad_pieces) {
    auto found = reference.first_grads.find(name);
    ASSERT_NE(found, reference.first_grads.end()) << run.describe() << ": no reference gradient for " << name;
    const at::Tensor expected = found->second.reshape(-1).narrow(0, offset, piece.numel());
    EXPECT_LE((piece - expected).abs().max().item<double>(), 1e-6) << run.describe() << " step-0 gradient of " << name;
  }
  ASSERT_EQ(sharded.params.size(), reference.params.size()) << run.describe();
  for (const auto& [name, expected] : reference.params) {
    auto found = sharded.params.find(name);
    ASSERT_NE(found, sharded.params.end()) << "missing parameter " << name;
    ASSERT_EQ(found->second.sizes(), expected.sizes()) << name;
    EXPECT_LE((found->second - expected).abs().max().item<double>(), kTolerance) << run.describe() << " " << name;
  }
  // The training did something: the loss fell.
  EXPECT_LT(reference.losses.back(), reference.losses.front() - 0.05);
}

// expect_parity for each strategy, the run otherwise as `configure` sets it.
void expect_parity_under(std::initializer_list<ShardingStrategy> strategies,
                         const std::function<void(RunConfig&)>& configure) {
  for (ShardingStrategy strategy : strategies) {
    RunConfig run;
    run.strategy = strategy;
    configure(run);
    expect_parity(run);
  }
}

class StrategyParity : public ::testing::TestWithParam<std::tuple<ShardingStrategy, Accumulation>> {};

TEST_P(StrategyParity, MatchesSingleProcessAdamW) {
  RunConfig run;
  run.strategy = std::get<0>(GetParam());
  run.accumulation = std::get<1>(GetParam());
  expect_parity(run);
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, StrategyParity,
                         ::testing::Combine(::testing::Values(ShardingStrategy::FullShard,
                                                              ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard),
                                            ::testing::Values(Accumulation::None, Accumulation::SyncEachMicroBatch,
                                                              Accumulation::NoSync)));

// HYBRID_SHARD at every R x S the job allows (at N = 4: 4 x 1, 2 x 2, 1 x 4), built both ways,
// with and without gradient accumulation (no_sync reduces the sum once, across both groups).
TEST(Parity, HybridShardEveryGroupSize) {
  const int n = fsdp::comm::init_world()->size();
  for (int s = 1; s <= n; ++s) {
    if (n % s != 0) continue;
    for (Accumulation accumulation : {Accumulation::None, Accumulation::NoSync}) {
      RunConfig run;
      run.strategy = ShardingStrategy::HybridShard;
      run.shard_group_size = s;
      run.accumulation = accumulation;
      run.build_while_constructing = accumulation == Accumulation::None;
      expect_parity(run);
    }
  }
}

// QLoRA's base (issue 35): the frozen fc1 and fc2 of every block stored as bitsandbytes' NF4 in
// their unit's flat storage (shard/nf4_storage.h: codes and scales sharded as one string of bytes,
// gathered as uint8, decoded after the gather), the other frozen and trainable parameters as usual.
// The reference is one process whose frozen matrices hold NF4's dequantized values: the same
// function, so the 1e-5 tolerance holds; a base gathered unquantized (fp32) misses it (losses by
// up to 9e-4 at N = 2, seen). Under every sharding strategy that shards, with CPU offload, and
// the bytes unchanged by training.
TEST(Parity, Nf4FrozenBase) {
  const int n = fsdp::comm::init_world()->size();
  for (ShardingStrategy strategy :
       {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::HybridShard}) {
    for (bool offload : {false, true}) {
      if (offload && strategy != ShardingStrategy::FullShard) continue;
      RunConfig run;
      run.strategy = strategy;
      run.shard_group_size = strategy == ShardingStrategy::HybridShard ? (n % 2 == 0 ? n / 2 : n) : 0;
      run.freeze_every_block = true;
      run.nf4_base = true;
      run.cpu_offload = offload;
      expect_parity(run);
    }
  }
}

TEST(Parity, HybridShardRefusesAGroupSizeThatDoesNotDivideTheRanks) {
  auto world = fsdp::comm::init_world();
  fsdp::runtime::FsdpOptions options;
  options.strategy = ShardingStrategy::HybridShard;
  options.shard_group_size = world->size() + 1;
  torch::manual_seed(kSeed);
  try {
    fsdp::runtime::fully_shard(std::make_shared<TinyTransformerImpl>(TinyConfig{}), world, options);
    FAIL() << "expected an error for shard_group_size " << options.shard_group_size;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("shard group size to divide the " + std::to_string(world->size()) + " ranks"),
              std::string::npos)
        << e.what();
  }
}

// Shards, gradients and AdamW state in host memory, the step on the CPU. On the CPU device this
// runs the offload's copies (host to host); with FSDP_TEST_DEVICE=cuda, pinned memory and streams.
TEST(Parity, CpuOffload) {
  for (ShardingStrategy strategy : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp}) {
    for (Accumulation accumulation : {Accumulation::None, Accumulation::SyncEachMicroBatch}) {
      RunConfig run;
      run.strategy = strategy;
      run.accumulation = accumulation;
      run.cpu_offload = true;
      expect_parity(run);
    }
  }
}

// AdamW through libtorch's fused kernel (what every GPU run takes) on the CPU: each shard cut at its
// weight decay ranges into two calls, decay inside the kernel for the matrices' ranges only,
// against torch::optim::AdamW's groups (decay 0.1 on matrices, none on biases and norms) within
// kTolerance. Decay applied to every range, or to none, moves the parameters by about 2e-3 of
// their size over the 20 steps.
TEST(Parity, FusedAdamWOnTheHost) {
  expect_parity_under({ShardingStrategy::FullShard, ShardingStrategy::NoShard},
                      [](RunConfig& run) { run.fused_adamw_on_host = true; });
}

TEST(Parity, SgdWithMomentum) {
  RunConfig run;
  run.optimizer = OptimizerKind::Sgd;
  expect_parity(run);
}

TEST(Parity, WrapBuiltModelByParameterCount) {
  RunConfig run;
  run.build_while_constructing = false;
  run.accumulation = Accumulation::SyncEachMicroBatch;
  expect_parity(run);
}

// Without clipping a gradient scaled by a constant changes SGD's steps in proportion, and AdamW's
// through epsilon and weight decay's balance; the norms above see it either way.
TEST(Parity, UnclippedSgdAndAdamW) {
  for (OptimizerKind optimizer : {OptimizerKind::Sgd, OptimizerKind::AdamW}) {
    for (ShardingStrategy strategy : {ShardingStrategy::FullShard, ShardingStrategy::NoShard}) {
      RunConfig run;
      run.optimizer = optimizer;
      run.strategy = strategy;
      run.clip = false;
      run.accumulation = Accumulation::SyncEachMicroBatch;
      expect_parity(run);
    }
  }
  const int n = fsdp::comm::init_world()->size();
  for (int s = 1; s <= n; ++s) {
    if (n % s != 0) continue;
    RunConfig run;
    run.optimizer = OptimizerKind::Sgd;
    run.strategy = ShardingStrategy::HybridShard;
    run.shard_group_size = s;
    run.clip = false;
    run.accumulation = Accumulation::NoSync;
    expect_parity(run);
  }
}

// Frozen weights in every block are freed after each block's backward (not at the end): same values.
TEST(Parity, FrozenWeightsInEveryBlock) {
  expect_parity_under({ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp},
                      [](RunConfig& run) { run.freeze_every_block = true; });
}

TEST(Parity, FrozenParametersAndUnusedUnit) {
  RunConfig run;
  run.freeze = true;
  run.skip_a_block = true;
  expect_parity(run);
}

}  // namespace parity_test
