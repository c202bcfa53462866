// examples/custom_model.cpp: your own libtorch model, sharded with fully_shard, trained with the
// sharded AdamW, checkpointed, and resumed.
//
//   mpirun -np 2 ./custom_model                    # sharded over 2 ranks
//   ./custom_model --single-process                # the same model and data, plain libtorch
//
// Each prints "step <i> loss <value>" for 12 steps of a global batch of 24 rows (each rank takes
// its share); the two agree to about 1e-6, since only the order of summations differs.
// After step 6 the sharded run saves a checkpoint, then builds a second model from another seed,
// loads the checkpoint into it and trains steps 6-11 again: "resume: identical" when those losses
// equal the first run's bit for bit.
#include <fsdp/checkpoint/sharded_checkpoint.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/optim/sharded_optimizer.h>
#include <fsdp/runtime/fully_shard.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "residual_mlp.h"

namespace {

constexpr int kSteps = 12, kSaveAfter = 6;
constexpr int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3 and 4 ranks

// ShardedAdamW's settings; torch::optim::AdamW gets the same, with weight decay on matrices only.
fsdp::optim::AdamWOptions adamw() {
  fsdp::optim::AdamWOptions options;
  options.lr = 3e-3;
  return options;
}

int single_process() {
  torch::manual_seed(0);
  ResidualMlp model(8, 32, 4);
  const auto ours = adamw();
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = torch::optim::AdamWOptions(ours.lr).betas({ours.beta1, ours.beta2}).eps(ours.eps);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options.weight_decay(ours.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(options.weight_decay(0.0)));
  torch::optim::AdamW optimizer(groups, options);
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch_of_step(step, kGlobalBatch);
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
    std::printf("step %d loss %.8f\n", step, loss.item<double>());
  }
  return 0;
}

struct Sharded {
  fsdp::runtime::FullyShardedModule<ResidualMlpImpl> model;
  std::unique_ptr<fsdp::optim::ShardedAdamW> optimizer;
};

Sharded build(const fsdp::comm::ProcessGroupPtr& world, uint64_t seed) {
  fsdp::runtime::FsdpOptions options;
  options.wrap_policy.module_types = {"ResidualBlock"};  // each block is a unit; the rest, the root
  torch::manual_seed(seed);                              // the same on every rank: initial values must agree (checked)
  auto model = fsdp::runtime::fully_shard(std::make_shared<ResidualMlpImpl>(8, 32, 4), world, options);
  auto optimizer = std::make_unique<fsdp::optim::ShardedAdamW>(model.state(), adamw());
  return {model, std::move(optimizer)};
}

// One optimizer step on this rank's share of the global batch; returns the global loss.
double train_step(Sharded& s, const fsdp::comm::ProcessGroupPtr& world, int step) {
  const int64_t local = kGlobalBatch / world->size();
  auto [x, y] = batch_of_step(step, kGlobalBatch);
  s.optimizer->zero_grad();
  auto loss = torch::mse_loss(s.model.forward(x.narrow(0, world->rank() * local, local)),
                              y.narrow(0, world->rank() * local, local));
  loss.backward();  // gathers each block again, reduce-scatters the averaged gradients
  s.optimizer->step();
  at::Tensor global = at::tensor({loss.item<double>()}, at::kDouble);
  world->all_reduce(global, fsdp::comm::ReduceOp::Average)->wait();
  return global.item<double>();
}

int sharded(const std::string& checkpoints) {
  auto world = fsdp::comm::init_world();
  Sharded first = build(world, 0);
  std::vector<double> losses;
  std::string saved;
  for (int step = 0; step < kSteps; ++step) {
    losses.push_back(train_step(first, world, step));
    if (world->rank() == 0) std::printf("step %d loss %.8f\n", step, losses.back());
    if (step + 1 == kSaveAfter) {
      fsdp::checkpoint::CheckpointInfo info;
      info.step = kSaveAfter;
      info.model_name = "residual-mlp";
      saved = fsdp::checkpoint::save_checkpoint(checkpoints, first.model.state(), first.optimizer.get(), info);
    }
  }
  // Resume into a model built from another seed: every value must come from the checkpoint.
  Sharded second = build(world, 123);
  const auto info = fsdp::checkpoint::load_checkpoint(saved, second.model.state(), second.optimizer.get());
  bool identical = true;
  for (int step = static_cast<int>(info.step); step < kSteps; ++step) {
    identical &= train_step(second, world, step) == losses[static_cast<size_t>(step)];
  }
  if (world->rank() == 0) std::printf("resume: %s\n", identical ? "identical" : "DIFFERENT");
  return identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string checkpoints = (std::filesystem::temp_directory_path() / "custom_model_checkpoints").string();
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--single-process") return single_process();
      if (arg == "--checkpoints" && i + 1 < argc) {
        checkpoints = argv[++i];
      } else {
        std::fprintf(stderr, "usage: custom_model [--single-process] [--checkpoints DIR]\n");
        return 2;
      }
    }
    return sharded(checkpoints);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_model: %s\n", e.what());
    return 1;
  }
}
