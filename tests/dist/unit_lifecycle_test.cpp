// A unit's life in unusual models: frozen weights in every block, a block called twice (with and
// without activation checkpointing), parameters tied across units, and a size-based wrap policy
// meeting modules the model calls directly. At N = 1 to 4.
//
// Inputs: the parity tests' TinyTransformer (dim 30, vocab 61, so flat buffers are padded at 2-4
// ranks), global batch 12 x 8 tokens from a per-step seed. Reference: the same model, same seed,
// unsharded in one process on the whole batch, plain SGD (steps proportional to the gradient, so a
// gradient counted twice or lost shows), no clipping.
// Tolerance 1e-5 on losses and parameters: only summation order differs (see parity_test.cpp);
// a reduction run before the second call's gradient arrived loses a whole term (~1e-2).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/comm/process_group.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"
#include "tiny_transformer.h"

namespace unit_lifecycle_test {

using fsdp::models::TinyConfig;
using fsdp::models::TinyTransformer;
using fsdp::models::TinyTransformerImpl;
using fsdp::runtime::FsdpOptions;
using fsdp::runtime::ShardingStrategy;

constexpr int64_t kSeed = 321;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr double kTolerance = 1e-5;

// Two batches in turn: random tokens, which the model can fit within a few steps.
at::Tensor batch_of_step(int step, int64_t vocab) {
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(77 + step % 2));
  return at::randint(0, vocab, {kGlobalBatch, 9}, generator, at::kLong);
}

template <class Model>
at::Tensor loss_on(Model&& forward, const at::Tensor& ids, int64_t vocab) {
  auto logits = forward(ids.narrow(1, 0, 8));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), ids.narrow(1, 1, 8).reshape(-1));
}

struct Trajectory {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Trajectory reference_sgd(const TinyConfig& config, int steps, double lr) {
  torch::manual_seed(kSeed);
  TinyTransformer model(config);
  std::vector<at::Tensor> trainable;
  for (auto& p : model->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  torch::optim::SGD optimizer(trainable, torch::optim::SGDOptions(lr));
  Trajectory out;
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto loss = loss_on([&](const at::Tensor& x) { return model->forward(x); }, batch_of_step(step, config.vocab),
                        config.vocab);
    loss.backward();
    optimizer.step();
    out.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) out.params[item.key()] = item.value().detach().clone();
  return out;
}

Trajectory fsdp_sgd(const TinyConfig& config, FsdpOptions options, int steps, double lr) {
  auto world = fsdp::comm::init_world();
  options.wrap_policy.module_types = {"AttentionMlpBlock"};
  torch::manual_seed(kSeed);
  auto model = fsdp::runtime::build_fully_sharded<TinyTransformerImpl>(
      world, options, [&] { return std::make_shared<TinyTransformerImpl>(config); });
  fsdp::optim::SgdOptions sgd;
  sgd.lr = lr;
  sgd.momentum = 0;
  sgd.weight_decay = 0;
  fsdp::optim::ShardedSgd optimizer(model.state(), sgd);
  const int64_t local = kGlobalBatch / world->size();
  Trajectory out;
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    at::Tensor ids = batch_of_step(step, config.vocab).narrow(0, world->rank() * local, local);
    auto loss = loss_on([&](const at::Tensor& x) { return model.forward(x); }, ids, config.vocab);
    loss.backward();
    optimizer.step();
    at::Tensor global = at::tensor({loss.item<double>()}, at::kDouble);
    world->all_reduce(global, fsdp::comm::ReduceOp::Average)->wait();
    out.losses.push_back(global.item<double>());
  }
  for (auto& [name, tensor] : model.state().full_parameters()) out.params[name] = tensor;
  EXPECT_EQ(model.state().memory_stats().gathered_bytes, 0) << "everything is freed after backward";
  return out;
}

void expect_same(const Trajectory& sharded, const Trajectory& reference, const std::string& what) {
  ASSERT_EQ(sharded.losses.size(), reference.losses.size());
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    EXPECT_NEAR(sharded.losses[i], reference.losses[i], kTolerance) << what << " step " << i;
  }
  ASSERT_EQ(sharded.params.size(), reference.params.size()) << what;
  for (const auto& [name, expected] : reference.params) {
    auto found = sharded.params.find(name);
    ASSERT_NE(found, sharded.params.end()) << what << ": missing " << name;
    EXPECT_LE((found->second - expected).abs().max().item<double>(), kTolerance) << what << " " << name;
  }
  EXPECT_LT(reference.losses[2], reference.losses[0]) << "the loss on the first batch should fall";
}

// ---- a block called twice in one forward

TEST(UnitCalledTwice, MatchesOneProcessWithAndWithoutCheckpointing) {
  TinyConfig config;
  config.repeat_block = 1;  // blocks 0, 1, 1, 2
  const Trajectory reference = reference_sgd(config, 4, 0.1);
  for (bool checkpointing : {false, true}) {
    for (auto strategy : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp}) {
      FsdpOptions options;
      options.strategy = strategy;
      options.activation_checkpointing = checkpointing;
      const std::string what = std::string(fsdp::runtime::to_string(strategy)) + (checkpointing ? " checkpointed" : "");
      expect_same(fsdp_sgd(config, options, 4, 0.1), reference, what);
    }
  }
}

// ---- frozen weights in every block

TEST(FrozenWeights, FreedRightAfterTheirUnitsBackward) {
  TinyConfig config;
  config.layers = 12;
  config.freeze_mlp_in_every_block = true;  // 7,350 of each block's 11,160 parameters are frozen
  for (int budget : {0, 1, 2}) {
    FsdpOptions options;
    options.max_inflight = budget;
    options.wrap_policy.module_types = {"AttentionMlpBlock"};
    torch::manual_seed(kSeed);
    auto model = fsdp::runtime::build_fully_sharded<TinyTransformerImpl>(
        fsdp::comm::init_world(), options, [&] { return std::make_shared<TinyTransformerImpl>(config); });
    at::Tensor ids = batch_of_step(0, config.vocab).narrow(0, 0, 4);
    auto forward = [&](const at::Tensor& x) { return model.forward(x); };
    loss_on(forward, ids, config.vocab).backward();  // records the orders
    model.state().zero_grad();
    model.state().reset_peak_memory();
    loss_on(forward, ids, config.vocab).backward();
    const auto stats = model.state().memory_stats();
    const int64_t unit = stats.largest_unit_bytes, root = stats.root_unit_bytes;
    if (model.state().group()->rank() == 0) {
      std::printf("frozen MLP in 12 blocks, K=%d: step peak %lld B = root x2 + %.2f units (budget: K + 2 = %d)\n",
                  budget, static_cast<long long>(stats.peak_gathered_bytes),
                  static_cast<double>(stats.peak_gathered_bytes - 2 * root) / unit, budget + 2);
    }
    // The budget of fully_shard.h: the root's parameters and gradient, the computing unit's
    // parameters and gradient, and K buffers in flight. Frozen weights kept to the end of
    // backward would add up to 11 blocks' 7,350 x 4 bytes (about 6.7 units) here.
    EXPECT_LE(stats.peak_gathered_bytes, 2 * root + (budget + 2) * unit) << "K=" << budget;
    EXPECT_EQ(stats.gathered_bytes, 0);
  }
}

// ---- tied parameters

struct SharedWeightBlockImpl : torch::nn::Module {
  at::Tensor shared, own;
  explicit SharedWeightBlockImpl(const at::Tensor& shared_weight) {
    shared = register_parameter("shared", shared_weight);
    own = register_parameter("own", torch::randn({8, 8}) * 0.1);
  }
  at::Tensor forward(const at::Tensor& x) { return torch::tanh(x.matmul(shared) + x.matmul(own)); }
};
TORCH_MODULE(SharedWeightBlock);

// tie_blocks: blocks 0 and 1 share `shared`; else block 0's `shared` is also the root's head.
struct TiedModelImpl : torch::nn::Module {
  torch::nn::ModuleList blocks;
  at::Tensor head;
  explicit TiedModelImpl(bool tie_blocks) {
    blocks = register_module("blocks", torch::nn::ModuleList());
    at::Tensor first = torch::randn({8, 8}) * 0.1;
    fsdp::nn::push_block(blocks, SharedWeightBlock(first));
    fsdp::nn::push_block(blocks, SharedWeightBlock(tie_blocks ? first : torch::randn({8, 8}) * 0.1));
    if (!tie_blocks) head = register_parameter("head", blocks->ptr<SharedWeightBlockImpl>(0)->shared);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = x;
    for (size_t i = 0; i < blocks->size(); ++i) y = fsdp::nn::call(blocks->ptr<SharedWeightBlockImpl>(i), y);
    return head.defined() ? y.matmul(head) : y;
  }
};

std::string wrap_error(bool tie_blocks, bool while_building) {
  FsdpOptions options;
  options.wrap_policy.module_types = {"SharedWeightBlock"};
  torch::manual_seed(kSeed);
  try {
    if (while_building) {
      fsdp::runtime::build_fully_sharded<TiedModelImpl>(fsdp::comm::init_world(), options,
                                                        [&] { return std::make_shared<TiedModelImpl>(tie_blocks); });
    } else {
      fsdp::runtime::fully_shard(std::make_shared<TiedModelImpl>(tie_blocks), fsdp::comm::init_world(), options);
    }
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(TiedParameters, SharedByTwoBlocksIsRefusedNamingBoth) {
  for (bool while_building : {true, false}) {
    const std::string error = wrap_error(/*tie_blocks=*/true, while_building);
    EXPECT_NE(error.find("'blocks.1.shared'"), std::string::npos) << error;
    EXPECT_NE(error.find("'blocks.0.shared'"), std::string::npos) << error;
  }
}

TEST(TiedParameters, SharedByABlockAndTheRootIsRefusedNamingBoth) {
  for (bool while_building : {true, false}) {
    const std::string error = wrap_error(/*tie_blocks=*/false, while_building);
    EXPECT_NE(error.find("'head'"), std::string::npos) << error;
    EXPECT_NE(error.find("'blocks.0.shared'"), std::string::npos) << error;
  }
}

// ---- size-based wrapping and modules called directly

// TinyTransformer looks its embedding up directly (tokens(ids)) and applies its head directly: a
// policy of 1,000 parameters must not make units of them (1,830 and 1,891 parameters), which
// would run on freed parameters; its blocks (11,160) it selects.
TEST(WrapPolicy, MinParamsSelectsOnlyBlocksAndTrains) {
  auto world = fsdp::comm::init_world();
  FsdpOptions options;
  options.wrap_policy.min_params = 1000;
  torch::manual_seed(kSeed);
  TinyConfig config;
  auto model = fsdp::runtime::fully_shard(std::make_shared<TinyTransformerImpl>(config), world, options);
  EXPECT_EQ(model.state().unit_names(), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2", "<root>"}));
  fsdp::optim::ShardedAdamW optimizer(model.state(), {});
  at::Tensor ids = batch_of_step(0, config.vocab).narrow(0, 0, 4);
  auto loss = loss_on([&](const at::Tensor& x) { return model.forward(x); }, ids, config.vocab);
  loss.backward();
  optimizer.step();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
}

TEST(WrapPolicy, UnknownModulePathIsRefused) {
  FsdpOptions options;
  options.wrap_policy.module_paths = {"blocks.7"};
  torch::manual_seed(kSeed);
  try {
    fsdp::runtime::fully_shard(std::make_shared<TinyTransformerImpl>(TinyConfig{}), fsdp::comm::init_world(), options);
    FAIL() << "expected an error for a path the model does not have";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'blocks.7'"), std::string::npos) << e.what();
  }
}

// ---- a model that forgets the contract

// Calls block 1 directly (block->forward(x)) instead of through fsdp::nn::call: its parameters are
// sharded and freed, never gathered. It must fail with an error naming the unit, never compute.
struct ForgetfulModelImpl : TinyTransformerImpl {
  using TinyTransformerImpl::TinyTransformerImpl;
  torch::Tensor forward(torch::Tensor ids) {
    auto x = tokens(ids) + positions.narrow(0, 0, ids.size(1));
    x = fsdp::nn::call(blocks->ptr<fsdp::models::AttentionMlpBlockImpl>(0), x);
    x = blocks->ptr<fsdp::models::AttentionMlpBlockImpl>(1)->forward(x);  // the mistake
    x = fsdp::nn::call(blocks->ptr<fsdp::models::AttentionMlpBlockImpl>(2), x);
    return head(norm(x));
  }
};

TEST(Contract, AUnitCalledDirectlyIsNamed) {
  FsdpOptions options;
  options.wrap_policy.module_types = {"AttentionMlpBlock"};
  torch::manual_seed(kSeed);
  auto model = fsdp::runtime::build_fully_sharded<ForgetfulModelImpl>(
      fsdp::comm::init_world(), options, [] { return std::make_shared<ForgetfulModelImpl>(TinyConfig{}); });
  at::Tensor ids = batch_of_step(0, 61).narrow(0, 0, 2).narrow(1, 0, 8);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the first forward, and one with a recorded order
    try {
      model.forward(ids);
      FAIL() << "a unit called without fsdp::nn::call computed";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("unit 'blocks.1'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fsdp::nn::call"), std::string::npos) << e.what();
    }
  }
}

}  // namespace unit_lifecycle_test
