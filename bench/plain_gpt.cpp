// plain_gpt: the baseline a libtorch user writes without fsdp.cpp: one process, the whole GPT in
// memory, torch::optim::AdamW, no sharding, no communication.
//
//   build/bench/plain_gpt --layers 6 --dim 256 --heads 8 --seq 256 --batch 16 --steps 20 --json out.json
//
// The model is fsdp.cpp's own GPT module (models/ knows nothing of sharding: it is plain
// torch::nn), so bench/compare measures the same arithmetic with and without the FSDP runtime.
// The data are uniformly random byte tokens from a seeded generator: throughput and memory do not
// depend on the token values. Per step: seconds and loss; reported: median tokens/s over the
// steps after --warmup, the process's peak resident memory (VmHWM) and the parameter count.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "fsdp/models/gpt.h"
#include "fsdp/shard/host_heap.h"
#include "fsdp/train/reporting.h"

int main(int argc, char** argv) {
  CLI::App app{"plain_gpt: one-process GPT training with plain libtorch (bench/compare's baseline)"};
  fsdp::models::GptConfig config;
  config.vocab = 256;
  config.context = 256;
  int64_t seq = 256, batch = 16, steps = 20, warmup = 3;
  int threads = 0;
  bool keep_mapped = false;
  std::string json_path;
  app.add_option("--layers", config.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--dim", config.dim, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", config.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--vocab", config.vocab, "vocabulary")->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "tokens per window (also the context)")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "windows per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "steps left out of the median")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "intra-op threads (0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_flag("--keep-freed-memory-mapped", keep_mapped,
               "the malloc settings fsdp-train uses (freed blocks stay mapped: fewer page faults)");
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);
  config.context = seq;
  if (warmup >= steps) {
    std::fprintf(stderr, "plain_gpt: --warmup %lld must be below --steps %lld\n", static_cast<long long>(warmup),
                 static_cast<long long>(steps));
    return 2;
  }
  if (keep_mapped) fsdp::shard::keep_freed_host_memory_mapped();
  if (threads > 0) torch::set_num_threads(threads);
  try {
    config.validate();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plain_gpt: %s\n", e.what());
    return 2;
  }

  torch::manual_seed(1234);
  fsdp::models::Gpt model(config);
  model->train();
  // fsdp-train's defaults for the optimizer (configs/gpt-fortunes-tiny.toml), constant rate.
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  auto generator = at::detail::createCPUGenerator(42);

  std::vector<double> step_seconds, losses;
  for (int64_t step = 0; step < steps; ++step) {
    // [batch, seq + 1] int64: inputs are the first seq tokens, targets the last seq.
    auto window = at::randint(0, config.vocab, {batch, seq + 1}, generator, at::TensorOptions().dtype(at::kLong));
    const auto start = std::chrono::steady_clock::now();
    for (auto& p : model->parameters()) p.mutable_grad().reset();  // set to none (1.13's zero_grad() zeroes)
    auto logits = model->forward(window.narrow(1, 0, seq));        // [batch, seq, vocab] fp32
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, config.vocab}),
                                                     window.narrow(1, 1, seq).reshape({-1}));
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
    step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    losses.push_back(loss.item<double>());
    std::printf("step %3lld  loss %.4f  %.3f s\n", static_cast<long long>(step + 1), losses.back(),
                step_seconds.back());
    std::fflush(stdout);
  }

  std::vector<double> measured(step_seconds.begin() + warmup, step_seconds.end());
  std::sort(measured.begin(), measured.end());
  const size_t m = measured.size();
  const double median_step = m % 2 ? measured[m / 2] : 0.5 * (measured[m / 2 - 1] + measured[m / 2]);
  const double tokens_per_second = static_cast<double>(batch * seq) / median_step;
  const int64_t peak = fsdp::train::peak_resident_bytes();
  std::printf("plain_gpt: %lld parameters, %d threads, median step %.3f s, %.0f tokens/s, peak resident %.1f MiB\n",
              static_cast<long long>(config.parameter_count()), torch::get_num_threads(), median_step,
              tokens_per_second, static_cast<double>(peak) / (1 << 20));
  if (!json_path.empty()) {
    nlohmann::json out = {{"parameters", config.parameter_count()},
                          {"threads", torch::get_num_threads()},
                          {"batch", batch},
                          {"seq", seq},
                          {"steps", steps},
                          {"warmup", warmup},
                          {"keep_freed_memory_mapped", keep_mapped},
                          {"step_seconds", step_seconds},
                          {"losses", losses},
                          {"median_step_seconds", median_step},
                          {"tokens_per_second", tokens_per_second},
                          {"peak_resident_bytes", peak}};
    std::ofstream(json_path) << out.dump(2) << "\n";
  }
  return 0;
}
