// LLaVA under FSDP trains exactly like the same model in one process on the whole global batch.
//
// Reference: models::build_model("llava-test") in one process (a CLIP image tower of two blocks
// read after its first, a projector, a two-block Llama), the loss the mean token cross-entropy over
// the global batch's answer tokens (data::ImageChatWriter: 16 image tokens, the question, "A
// sneaker." and end-of-text; only the answer trained), libtorch's SGD with momentum and
// clip_grad_norm_. FSDP: the same build sharded block by block (both kinds of block, the Llama's
// embedding and head and the tower's embeddings units of their own; the projector and the norms in
// the root), each rank on its 12 / N examples, its summed loss times N / (the global batch's answer
// tokens), as fsdp-train scales it. 8 steps of 12 random images (their pixels shifted by the label,
// so the answer can be read from them) and their chats.
//
// Tolerance 1e-5 on every step's loss and every final parameter, 1e-5 relative on the gradient
// norm. SGD, not AdamW, for the reason ClipParity gives (the tower's key biases: true gradient 0).
// The tower's second block and post_layernorm are not read (vision_feature_layer -2): frozen, they
// must end where they started, to the bit; so must a frozen tower, and a LoRA run's base. Seen
// failing with the unread block trainable: the sharded SGD's weight decay moved its weights by
// 6.3e-3 (their gradient is zero), where libtorch's SGD skips a parameter that got none.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "fsdp/comm/process_group.h"
#include "fsdp/data/captions.h"
#include "fsdp/data/image_chat.h"
#include "fsdp/models/registry.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"
#include "reference_trajectory.h"

namespace llava_parity_test {

constexpr int kSteps = 8;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr double kTolerance = 1e-5;
constexpr double kLr = 0.3;

using fsdp_test::Trajectory;

struct Case {
  fsdp::runtime::ShardingStrategy strategy = fsdp::runtime::ShardingStrategy::FullShard;
  bool freeze_vision = false;
  int64_t lora_rank = 0;    // adapters on every linear layer of the Llama (its base frozen)
  bool tower_unit = false;  // the image tower one unit (fsdp.wrap = "tower"), the Llama's blocks units

  fsdp::models::LlavaConfig model() const {
    auto config = std::get<fsdp::models::LlavaConfig>(fsdp::models::model_config("llava-test"));
    config.freeze_vision = freeze_vision;
    if (lora_rank > 0) {
      config.text.lora.rank = lora_rank;
      config.text.lora.alpha = 8.0;
      config.text.lora.targets = {fsdp::models::LoraSpec::kAllLinear};
    }
    return config;
  }
};

struct Examples {
  at::Tensor images;   // [B, 1, 28, 28]
  at::Tensor ids;      // [B, t]
  at::Tensor targets;  // [B, t], -100 but for the answers
};

Examples examples_of_step(int step) {
  const auto config = Case{}.model();
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(700 + step));
  const at::Tensor labels = at::randint(0, 10, {kGlobalBatch}, generator, at::kLong);
  const at::Tensor images =
      at::randn({kGlobalBatch, 1, 28, 28}, generator) * 0.5 + labels.to(at::kFloat).view({-1, 1, 1, 1}) / 5.0;
  const fsdp::data::ImageChatWriter writer(fsdp::data::fashion_mnist_class_names(), config.image_tokens(),
                                           config.image_token, 256);
  const auto rows = writer.examples(labels);
  return {images, rows.ids, rows.targets};
}

Trajectory run_reference(const Case& c) {
  torch::manual_seed(7);
  auto model = fsdp::models::build_model(c.model());
  auto optimizer = fsdp_test::reference_sgd(*model.module, kLr, 0.01);
  std::vector<at::Tensor> trained;
  for (auto& p : model.module->parameters()) {
    if (p.requires_grad()) trained.push_back(p);
  }
  Trajectory result;
  for (int step = 0; step < kSteps; ++step) {
    optimizer->zero_grad();
    const Examples batch = examples_of_step(step);
    const at::Tensor logits = model.image_text_logits(batch.images, batch.ids);  // [B, t, vocab]
    const at::Tensor loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape(-1),
                                             torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
    loss.backward();
    result.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(trained, 1.0));
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
  if (c.tower_unit) {
    options.wrap_policy.module_types = {"LlamaBlock"};
    options.wrap_policy.module_paths = {"vision_tower", "language_model.embed_tokens", "language_model.lm_head"};
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
  EXPECT_EQ(state->unit_names().size(), c.tower_unit ? 1u + 2u + 2u + 1u : 2u + 2u + 3u + 1u)
      << "the tower, two Llama blocks, the Llama's embedding and head and the root; or two blocks of each kind, three "
         "embedding units and the root";
  fsdp::optim::ShardedSgd optimizer(*state, fsdp::optim::SgdOptions{kLr, 0.9, 0.01});
  const int64_t local = kGlobalBatch / n;
  Trajectory result;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const Examples batch = examples_of_step(step);
    const double answer_tokens = batch.targets.ne(-100).sum().item<double>();  // the whole global batch's
    const at::Tensor share =
        model.image_text_loss(batch.images.narrow(0, rank * local, local), batch.ids.narrow(0, rank * local, local),
                              batch.targets.narrow(0, rank * local, local), /*chunk_rows=*/16);
    // The trainer's convention: each rank's sum times N / (the global count); FSDP averages over ranks.
    (share * (static_cast<double>(n) / answer_tokens)).backward();
    result.grad_norms.push_back(fsdp::optim::clip_grad_norm(*state, 1.0));
    optimizer.step();
    at::Tensor global = at::tensor({share.item<double>()}, at::kDouble);
    world->all_reduce(global, fsdp::comm::ReduceOp::Sum)->wait();
    result.losses.push_back(global.item<double>() / answer_tokens);
  }
  for (auto& [name, tensor] : state->full_parameters()) result.params[name] = tensor;
  return result;
}

void expect_parity(const Case& c) {
  const Trajectory reference = run_reference(c);
  const Trajectory sharded = run_fsdp(c);
  fsdp_test::expect_same_trajectory(reference, sharded, kTolerance);
  EXPECT_LT(reference.losses.back(), reference.losses.front() - 0.1) << "the loss should fall";
  // What is frozen (the unread block and post_layernorm always; the tower or the LoRA base when
  // asked) is where it started, to the bit; the projector trains.
  torch::manual_seed(7);
  auto initial = fsdp::models::build_model(c.model());
  int64_t frozen = 0;
  for (const auto& item : initial.module->named_parameters()) {
    const bool moved = !sharded.params.at(item.key()).equal(item.value());
    if (!item.value().requires_grad()) {
      ++frozen;
      EXPECT_FALSE(moved) << item.key() << " moved though frozen";
    }
  }
  EXPECT_GE(frozen, 16 + 2) << "the unread block's 16 tensors and post_layernorm's 2";
  EXPECT_FALSE(sharded.params.at("multi_modal_projector.linear_1.weight")
                   .equal(initial.module->named_parameters()["multi_modal_projector.linear_1.weight"]));
}

using fsdp::runtime::ShardingStrategy;
TEST(LlavaParity, AnswerLossFullShard) { expect_parity({ShardingStrategy::FullShard}); }
TEST(LlavaParity, AnswerLossShardGradOp) { expect_parity({ShardingStrategy::ShardGradOp}); }
TEST(LlavaParity, AnswerLossHybridTwoByTwo) {
  if (fsdp::comm::init_world()->size() != 4) GTEST_SKIP() << "2 replicas x 2 shards needs 4 ranks";
  expect_parity({ShardingStrategy::HybridShard});
}
TEST(LlavaParity, FrozenImageTower) { expect_parity({ShardingStrategy::FullShard, true}); }
TEST(LlavaParity, ImageTowerOneUnit) { expect_parity({ShardingStrategy::FullShard, false, 0, true}); }
// LLaVA's usual fine-tune: the tower frozen, the projector trained, LoRA on a frozen Llama.
TEST(LlavaParity, FrozenTowerLoraOnTheLlama) { expect_parity({ShardingStrategy::FullShard, true, 4}); }

}  // namespace llava_parity_test
