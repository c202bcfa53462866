// overlap_bench: how much of FSDP's communication prefetching hides, in one run.
//
//   mpirun -np 4 build/bench/overlap_bench --json out/bench/overlap_np4.json
//
// Model: wide residual MLP blocks (x + fc2(gelu(fc1(x))), dim -> 4 dim -> dim), each block one
// FSDP unit, a small per-rank batch: communication matters. Three modes, every rank running each
// mode at the same time, one after the other:
//   compute_only  each rank trains an unsharded copy on its batch: no communication at all (the
//                 same per-rank arithmetic, the same CPU sharing between ranks)
//   no_prefetch   FULL_SHARD, max_inflight 0: every gather and reduction waited for when issued
//   prefetch      FULL_SHARD, prefetch with max_inflight K (default 2)
// A step is forward + backward (the optimizer is left out: it is not part of the overlap).
// Per step, each rank measures: step seconds, communication busy seconds (the collectives'
// time on the communication thread) and exposed seconds (the time the compute thread waited);
// hidden = 1 - exposed / busy. Reported: medians over the measured steps of the slowest rank.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/shard/host_heap.h"

namespace {

using Clock = std::chrono::steady_clock;

struct WideMlpBlockImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  explicit WideMlpBlockImpl(int64_t dim) {
    fc1 = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::gelu(fc1(x))); }
};
TORCH_MODULE(WideMlpBlock);

struct WideMlpImpl : torch::nn::Module {
  torch::nn::ModuleList blocks;
  WideMlpImpl(int64_t dim, int64_t depth) {
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < depth; ++i) fsdp::nn::push_block(blocks, WideMlpBlock(dim));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < blocks->size(); ++i) x = fsdp::nn::call(blocks->ptr<WideMlpBlockImpl>(i), x);
    return x;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct StepTimes {
  std::vector<double> step, busy, exposed;  // per measured step, slowest rank
};

// Per step: [step seconds, busy, exposed] of every rank; the step's figures are the maxima.
void record(StepTimes& times, const fsdp::comm::ProcessGroupPtr& world, double step, double busy, double exposed) {
  at::Tensor mine = at::tensor({step, busy, exposed}, at::kDouble);
  world->all_reduce(mine, fsdp::comm::ReduceOp::Max)->wait();
  times.step.push_back(mine[0].item<double>());
  times.busy.push_back(mine[1].item<double>());
  times.exposed.push_back(mine[2].item<double>());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"overlap_bench: FSDP step time with and without prefetch, beside a compute-only run"};
  int64_t dim = 1024, depth = 8, tokens = 64, steps = 10, warmup = 2;
  int max_inflight = 2;
  std::string json_path;
  app.add_option("--dim", dim, "block width (a block holds 8 dim^2 parameters)")->check(CLI::PositiveNumber);
  app.add_option("--depth", depth, "blocks")->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "rows of the per-rank batch")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "measured steps per mode")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "unmeasured steps first (the first records the prefetch order)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-inflight", max_inflight, "K for the prefetch mode")->check(CLI::Range(0, 64));
  app.add_option("--json", json_path, "write the results here as JSON");
  bool fresh_pages = false;
  app.add_flag("--fresh-pages", fresh_pages,
               "no memory reuse: malloc defaults and no FSDP buffer cache (every buffer faulted in afresh)");
  CLI11_PARSE(app, argc, argv);
  if (!fresh_pages) fsdp::shard::keep_freed_host_memory_mapped();

  auto world = fsdp::comm::init_world();
  const int n = world->size(), rank = world->rank();
  torch::set_num_threads(std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(n)));
  at::Tensor x = torch::randn({tokens, dim}, at::detail::createCPUGenerator(rank + 1));

  struct Mode {
    std::string name;
    StepTimes times;
  };
  std::vector<Mode> modes = {{"compute_only", {}}, {"no_prefetch", {}}, {"prefetch", {}}};
  for (Mode& mode : modes) {
    torch::manual_seed(0);
    if (mode.name == "compute_only") {
      auto model = std::make_shared<WideMlpImpl>(dim, depth);
      for (int64_t s = 0; s < warmup + steps; ++s) {
        world->barrier()->wait();
        const auto start = Clock::now();
        for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
        model->forward(x).pow(2).mean().backward();
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (s >= warmup) record(mode.times, world, seconds, 0.0, 0.0);
      }
      continue;
    }
    fsdp::runtime::FsdpOptions options;
    options.wrap_policy.module_types = {"WideMlpBlock"};
    options.max_inflight = mode.name == "prefetch" ? max_inflight : 0;
    options.cache_buffers = !fresh_pages;
    auto model = fsdp::runtime::build_fully_sharded<WideMlpImpl>(
        world, options, [&] { return std::make_shared<WideMlpImpl>(dim, depth); });
    for (int64_t s = 0; s < warmup + steps; ++s) {
      world->barrier()->wait();
      const double busy_before = world->communication_seconds();
      const double exposed_before = model.state().exposed_seconds();
      const auto start = Clock::now();
      model.state().zero_grad();
      model.forward(x).pow(2).mean().backward();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const double busy = world->communication_seconds() - busy_before;
      const double exposed = model.state().exposed_seconds() - exposed_before;
      if (s >= warmup) record(mode.times, world, seconds, busy, exposed);
    }
  }

  const double compute = median(modes[0].times.step);
  nlohmann::json results = nlohmann::json::array();
  if (rank == 0) {
    std::printf(
        "overlap_bench: %d ranks, %lld blocks of %lld -> %lld -> %lld (%.1f MiB fp32 each), %lld rows per rank, "
        "%d threads per rank, K = %d%s; medians of %lld steps (slowest rank)\n",
        n, static_cast<long long>(depth), static_cast<long long>(dim), static_cast<long long>(4 * dim),
        static_cast<long long>(dim), 8.0 * dim * dim * 4 / 1048576.0, static_cast<long long>(tokens),
        torch::get_num_threads(), max_inflight, fresh_pages ? ", fresh pages" : "", static_cast<long long>(steps));
    std::printf("%-14s %10s %12s %10s %11s %8s\n", "mode", "step (s)", "vs compute", "comm (s)", "exposed (s)",
                "hidden");
  }
  for (const Mode& mode : modes) {
    const double step = median(mode.times.step), busy = median(mode.times.busy), exposed = median(mode.times.exposed);
    const double hidden = busy > 0 ? std::max(0.0, 1.0 - exposed / busy) : 0.0;
    if (rank == 0) {
      std::printf("%-14s %10.3f %11.2fx %10.3f %11.3f %7.0f%%\n", mode.name.c_str(), step, step / compute, busy,
                  exposed, 100.0 * hidden);
    }
    results.push_back({{"mode", mode.name},
                       {"ranks", n},
                       {"step_seconds", step},
                       {"vs_compute_only", step / compute},
                       {"communication_seconds", busy},
                       {"exposed_seconds", exposed},
                       {"hidden_fraction", hidden},
                       {"step_seconds_all", mode.times.step},
                       {"exposed_seconds_all", mode.times.exposed}});
  }
  if (rank == 0 && !json_path.empty()) {
    nlohmann::json doc = {{"benchmark", "overlap"},
                          {"dim", dim},
                          {"depth", depth},
                          {"tokens_per_rank", tokens},
                          {"threads_per_rank", torch::get_num_threads()},
                          {"max_inflight", max_inflight},
                          {"fresh_pages", fresh_pages},
                          {"results", results}};
    std::ofstream(json_path) << doc.dump(2) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
