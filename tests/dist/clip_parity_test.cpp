// CLIP under FSDP trains exactly like the same model in one process on the whole global batch.
//
// Reference: models::build_model("clip-test") in one process, the symmetric contrastive loss over
// the whole global batch written out directly here (logits_per_image = exp(logit_scale) I T^T over
// all 12 pairs, the mean of both cross-entropies), libtorch's SGD with momentum and clip_grad_norm_. FSDP: the
// same build sharded block by block (both towers' blocks and both embeddings units of their own,
// logit_scale, a 0-D parameter, in the root), each rank on its 12 / N pairs, the loss through
// train::contrastive_loss_share (features gathered across ranks, their gradients reduce-scattered).
// 8 steps of 12 pairs: random images and byte captions of random labels (data::CaptionWriter).
// LoRA on one tower: adapters on every linear layer of the text tower's blocks, everything else
// (the image tower, embeddings, norms, projections, logit_scale) frozen.
//
// Tolerance 1e-5 on every step's loss and every final parameter, and 1e-5 relative on the gradient
// norm (about 120 at step 0: fp32's rounding of it alone is 1e-5): only summation order differs.
// SGD, not AdamW: the attention's key bias cannot change a softmax, so its true gradient is 0 and
// Adam would turn each summation order's rounding noise into full-size steps (seen: 2.8e-5 on
// k_proj.bias at N = 1, everything else within 1e-6); with SGD the published architecture, biases
// included, is compared. A rank that kept only its own rows' gradient (no reduce-scatter of the gathered
// features' gradients, scaled to the sum) moves step 0's gradient norm from 120.36 to 249.62 at N = 2
// (seen failing so).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "fsdp/comm/process_group.h"
#include "fsdp/data/captions.h"
#include "fsdp/models/registry.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"
#include "reference_trajectory.h"
#include "fsdp/train/contrastive_loss.h"

namespace clip_parity_test {

constexpr int kSteps = 8;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr double kTolerance = 1e-5;
constexpr double kLr = 0.2;

using fsdp_test::Trajectory;

fsdp::models::ClipConfig clip_test() {
  return std::get<fsdp::models::ClipConfig>(fsdp::models::model_config("clip-test"));
}

struct Case {
  fsdp::runtime::ShardingStrategy strategy = fsdp::runtime::ShardingStrategy::FullShard;
  bool freeze_text = false, freeze_vision = false;
  bool tower_units = false;  // each tower one unit (fsdp.wrap = "tower"), else each block and embedding
  int64_t lora_rank = 0;     // adapters on every linear layer of the towers not frozen (the rest frozen)

  fsdp::models::ClipConfig model() const {
    auto config = clip_test();
    config.freeze_text = freeze_text;
    config.freeze_vision = freeze_vision;
    if (lora_rank > 0) {
      config.lora.rank = lora_rank;
      config.lora.alpha = 8.0;
      config.lora.targets = {fsdp::models::LoraSpec::kAllLinear};
    }
    return config;
  }
};

struct Pairs {
  at::Tensor images;  // [B, 1, 28, 28]
  at::Tensor ids;     // [B, context]
};

Pairs pairs_of_step(int step) {
  const auto config = clip_test();
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(900 + step));
  at::Tensor labels = at::randint(0, 10, {kGlobalBatch}, generator, at::kLong);
  // Images that depend on the label, so that the towers have something to agree on.
  at::Tensor images =
      at::randn({kGlobalBatch, 1, 28, 28}, generator) * 0.5 + labels.to(at::kFloat).view({-1, 1, 1, 1}) / 5.0;
  fsdp::data::CaptionWriter writer(fsdp::data::fashion_mnist_class_names(), fsdp::data::caption_templates(),
                                   config.context, config.eos_token);
  std::vector<int64_t> indices(kGlobalBatch);
  for (int64_t i = 0; i < kGlobalBatch; ++i) indices[i] = i;
  return {images, writer.captions(labels, indices, step, 5)};
}

Trajectory run_reference(const Case& c) {
  torch::manual_seed(7);
  auto model = fsdp::models::build_model(c.model());
  auto optimizer = fsdp_test::reference_sgd(*model.module, kLr, 0.01);
  Trajectory result;
  for (int step = 0; step < kSteps; ++step) {
    optimizer->zero_grad();
    const Pairs pairs = pairs_of_step(step);
    const fsdp::models::ContrastiveOutput out = model.contrastive(pairs.images, pairs.ids);
    const at::Tensor logits_per_image = out.scale * out.image_embeds.matmul(out.text_embeds.t());
    const at::Tensor labels = torch::arange(kGlobalBatch, at::kLong);
    const at::Tensor loss = (torch::nn::functional::cross_entropy(logits_per_image, labels) +
                             torch::nn::functional::cross_entropy(logits_per_image.t(), labels)) /
                            2;
    loss.backward();
    result.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(model.module->parameters(), 1.0));
    optimizer->step();
    result.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model.module->named_parameters()) result.params[item.key()] = item.value().detach().clone();
  return result;
}

Trajectory run_fsdp(const Case& c) {
  auto world = fsdp::comm::init_world();
  const int rank = world->rank(), n = world->size();
  fsdp::runtime::FsdpOptions options;
  options.strategy = c.strategy;
  if (c.strategy == fsdp::runtime::ShardingStrategy::HybridShard)
    options.shard_group_size = 2;  // 2 replicas x 2 shards
  const fsdp::models::ModelConfig config = c.model();
  if (c.tower_units) {
    options.wrap_policy.module_paths = fsdp::models::tower_paths(config);
  } else {
    options.wrap_policy.module_types = fsdp::models::block_type_names(config);
    options.wrap_policy.module_paths = fsdp::models::embedding_and_head_paths(config);
  }
  torch::manual_seed(7);
  fsdp::models::BuiltModel model;
  std::shared_ptr<fsdp::runtime::FsdpState> state;
  {
    fsdp::runtime::BuildListener listener(world, options);
    model = fsdp::models::build_model(config);
    state = fsdp::runtime::make_fsdp_state(model.module, world, options, listener.take_units());
  }
  EXPECT_EQ(state->unit_names().size(), c.tower_units ? 3u : 4u + 2u + 1u)
      << "two towers and the root, or two blocks per tower, two embeddings and the root";
  fsdp::optim::ShardedSgd optimizer(*state, fsdp::optim::SgdOptions{kLr, 0.9, 0.01});
  const int64_t local = kGlobalBatch / n;
  Trajectory result;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const Pairs pairs = pairs_of_step(step);
    const fsdp::models::ContrastiveOutput out =
        model.contrastive(pairs.images.narrow(0, rank * local, local), pairs.ids.narrow(0, rank * local, local));
    const at::Tensor share = fsdp::train::contrastive_loss_share(out, world);
    // The trainer's convention: each rank's share times N / B; FSDP averages gradients over ranks.
    (share * (static_cast<double>(n) / kGlobalBatch)).backward();
    result.grad_norms.push_back(fsdp::optim::clip_grad_norm(*state, 1.0));
    optimizer.step();
    at::Tensor global = at::tensor({share.item<double>()}, at::kDouble);
    world->all_reduce(global, fsdp::comm::ReduceOp::Sum)->wait();
    result.losses.push_back(global.item<double>() / kGlobalBatch);
  }
  for (auto& [name, tensor] : state->full_parameters()) result.params[name] = tensor;
  return result;
}

void expect_parity(const Case& c) {
  const Trajectory reference = run_reference(c);
  const Trajectory sharded = run_fsdp(c);
  fsdp_test::expect_same_trajectory(reference, sharded, kTolerance);
  EXPECT_LT(reference.losses.back(), reference.losses.front() - 0.05) << "the loss should fall";
  if (c.lora_rank == 0) {
    EXPECT_NE(reference.params.at("logit_scale").item<double>(), std::log(1.0 / 0.07))
        << "the temperature should train";
  }
  // A frozen tower is where it started, to the bit.
  if (c.freeze_text || c.freeze_vision) {
    torch::manual_seed(7);
    auto initial = fsdp::models::build_model(c.model());
    int64_t frozen = 0;
    for (const auto& item : initial.module->named_parameters()) {
      if (item.value().requires_grad()) continue;
      ++frozen;
      EXPECT_TRUE(sharded.params.at(item.key()).equal(item.value())) << item.key() << " moved though frozen";
    }
    EXPECT_GT(frozen, 10);
  }
  if (c.lora_rank > 0) {  // adapters in the trained tower only, and they trained
    int64_t adapters = 0;
    for (const auto& [name, tensor] : reference.params) {
      if (name.find(".lora_") == std::string::npos) continue;
      ++adapters;
      EXPECT_EQ(name.rfind(c.freeze_vision ? "text_model." : "vision_model.", 0), 0u)
          << name << " is in the frozen tower";
    }
    EXPECT_EQ(adapters, 2 * 2 * 6) << "two blocks x six linear layers x (A, B)";
  }
}

using fsdp::runtime::ShardingStrategy;
TEST(ClipParity, GlobalBatchLossFullShard) { expect_parity({ShardingStrategy::FullShard}); }
TEST(ClipParity, GlobalBatchLossShardGradOp) { expect_parity({ShardingStrategy::ShardGradOp}); }
// Hybrid sharding: the loss's gather spans the whole world, both replica groups.
TEST(ClipParity, GlobalBatchLossHybridTwoByTwo) {
  if (fsdp::comm::init_world()->size() != 4) GTEST_SKIP() << "2 replicas x 2 shards needs 4 ranks";
  expect_parity({ShardingStrategy::HybridShard});
}
TEST(ClipParity, EachTowerOneUnit) { expect_parity({ShardingStrategy::FullShard, false, false, true}); }
TEST(ClipParity, FrozenImageTower) { expect_parity({ShardingStrategy::FullShard, false, true}); }
TEST(ClipParity, FrozenTextTowerEachTowerOneUnit) { expect_parity({ShardingStrategy::FullShard, true, false, true}); }
// LoRA on one tower (the image tower frozen): adapters in the text tower's blocks, all else frozen.
TEST(ClipParity, LoraOnTheTextTower) { expect_parity({ShardingStrategy::FullShard, false, true, false, 4}); }

// The loss's gather and reduce-scatter are over the group given; with one rank they are copies.
TEST(ClipParity, MismatchedEmbeddingsAreRefusedByName) {
  fsdp::models::ContrastiveOutput out{at::zeros({2, 4}), at::zeros({3, 4}), at::ones({})};
  try {
    fsdp::train::contrastive_loss_share(out, fsdp::comm::init_world());
    FAIL() << "expected a refusal";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 4], [3, 4]"), std::string::npos) << e.what();
  }
}

}  // namespace clip_parity_test
