// fsdp-demo: sharded training of a small byte-level transformer on text embedded in the binary.
// The main job until the full trainer (fsdp-train) lands. Launch with mpirun; any rank count.
//
//   mpirun -np 2 build/apps/fsdp-demo --steps 150
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/tiny_transformer.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"

namespace {

// Public-domain prose (the opening of "A Tale of Two Cities" and Lincoln's Gettysburg Address):
// enough structure for a byte-level model to learn from in a minute.
const char* kText =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way - in short, the period was so far like the present period, that some of its "
    "noisiest authorities insisted on its being received, for good or for evil, in the superlative degree "
    "of comparison only. "
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a great "
    "civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure. "
    "We are met on a great battle-field of that war. We have come to dedicate a portion of that field, as a "
    "final resting place for those who here gave their lives that that nation might live. It is altogether "
    "fitting and proper that we should do this. ";

struct Options {
  int steps = 150;
  int64_t global_batch = 32;
  int64_t seq = 32;
  int64_t dim = 96;
  int64_t layers = 4;
  double lr = 3e-3;
  std::string strategy = "full_shard";
  uint64_t seed = 0;
};

int run(const Options& opt) {
  auto world = fsdp::comm::init_world();
  const int rank = world->rank(), n = world->size();
  if (opt.global_batch % n != 0) {
    throw std::invalid_argument("--global-batch " + std::to_string(opt.global_batch) +
                                " must be divisible by the number of ranks (" + std::to_string(n) + ")");
  }
  fsdp::models::TinyConfig config;
  config.vocab = 256;
  config.seq = opt.seq;
  config.dim = opt.dim;
  config.heads = 4;
  config.layers = opt.layers;
  if (config.dim % config.heads != 0) throw std::invalid_argument("--dim must be divisible by 4 (the head count)");

  fsdp::runtime::FsdpOptions options;
  options.strategy = fsdp::runtime::sharding_strategy_from_string(opt.strategy);
  options.wrap_policy.module_types = {"AttentionMlpBlock"};
  torch::manual_seed(opt.seed);
  auto model = fsdp::runtime::build_fully_sharded<fsdp::models::TinyTransformerImpl>(
      world, options, [&] { return std::make_shared<fsdp::models::TinyTransformerImpl>(config); });
  fsdp::optim::ShardedAdamW optimizer(model.state(), {opt.lr, 0.9, 0.95, 1e-8, 0.1});
  fsdp::optim::WarmupCosineSchedule schedule{opt.lr, opt.lr / 10, opt.steps / 10, opt.steps};

  const std::string text(kText);
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kLong);
  for (size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  const int64_t local = opt.global_batch / n;
  auto stats = model.state().memory_stats();
  if (rank == 0) {
    std::printf("fsdp-demo: %d ranks, %s, %zu units, %.2f M parameters, %.1f KiB of shards per rank\n", n,
                opt.strategy.c_str(), model.state().unit_names().size(), stats.unsharded_param_bytes / 4e6,
                stats.sharded_param_bytes / 1024.0);
  }
  auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < opt.steps; ++step) {
    // Every rank draws the same global batch of windows and takes its own rows.
    auto generator = at::detail::createCPUGenerator(opt.seed * 1000003 + step);
    at::Tensor starts = at::randint(0, bytes.numel() - opt.seq - 1, {opt.global_batch}, generator, at::kLong);
    at::Tensor offsets = at::arange(opt.seq + 1, at::kLong);
    at::Tensor windows = bytes.index({(starts.narrow(0, rank * local, local).unsqueeze(1) + offsets)});
    optimizer.set_lr(schedule.lr_at(step));
    optimizer.zero_grad();
    at::Tensor logits = model.forward(windows.narrow(1, 0, opt.seq));
    at::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 256}),
                                                           windows.narrow(1, 1, opt.seq).reshape(-1));
    loss.backward();
    const double norm = fsdp::optim::clip_grad_norm(model.state(), 1.0);
    optimizer.step();
    at::Tensor global = at::tensor({loss.item<double>()}, at::kDouble);
    world->all_reduce(global, fsdp::comm::ReduceOp::Average)->wait();
    if (rank == 0 && (step % 10 == 0 || step == opt.steps - 1)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("step %4d  loss %.4f  lr %.2e  grad norm %.3f  %.0f tokens/s\n", step, global.item<double>(),
                  schedule.lr_at(step), norm, (step + 1) * opt.global_batch * opt.seq / seconds);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-demo: sharded training of a small byte-level transformer on embedded text.\n"
               "Launch under mpirun (e.g. mpirun -np 2 fsdp-demo); each rank holds 1/N of the model."};
  Options opt;
  app.add_option("--steps", opt.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--global-batch", opt.global_batch, "sequences per step, over all ranks")->check(CLI::PositiveNumber);
  app.add_option("--seq", opt.seq, "tokens per sequence")->check(CLI::Range(2, 256));
  app.add_option("--dim", opt.dim, "model width (multiple of 4)")->check(CLI::PositiveNumber);
  app.add_option("--layers", opt.layers, "transformer blocks (each one FSDP unit)")->check(CLI::PositiveNumber);
  app.add_option("--lr", opt.lr, "peak learning rate (warm-up, then cosine)")->check(CLI::PositiveNumber);
  app.add_option("--strategy", opt.strategy, "full_shard, shard_grad_op or no_shard")
      ->check(CLI::IsMember({"full_shard", "shard_grad_op", "no_shard"}));
  app.add_option("--seed", opt.seed, "seed for initialisation and batches");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-demo: error: %s\n", e.what());
    // The other ranks may be waiting in a collective for this one: end the whole job now.
    auto world = fsdp::comm::init_world();
    if (world->size() > 1) world->abort(e.what());
    return 1;
  }
}
