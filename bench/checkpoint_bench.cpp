// checkpoint_bench: time to save and load a sharded checkpoint (parameters + AdamW state) and to
// export full weights as safetensors, for a model of a chosen size; every rank writes or reads its
// own file at once. Prints a table, writes JSON; asserts nothing.
//
//   mpirun -np 2 build/bench/checkpoint_bench --model gpt2 --dir /tmp/ckpt_bench --json out/bench/checkpoint_np2.json
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int64_t directory_bytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) total += static_cast<int64_t>(entry.file_size());
  }
  return total;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"checkpoint_bench: sharded save/load and safetensors export times"};
  std::string model = "gpt2", dir = "/tmp/fsdp_checkpoint_bench", json_path;
  int repeats = 3;
  app.add_option("--model", model, "model zoo name (fsdp-train --list-models)");
  app.add_option("--dir", dir, "scratch directory (removed afterwards)");
  app.add_option("--repeats", repeats, "repetitions (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "write the figures as JSON here");
  CLI11_PARSE(app, argc, argv);

  auto world = fsdp::comm::init_world();
  const int rank = world->rank(), n = world->size();
  auto config = fsdp::train::parse_train_config("[model]\nname = \"" + model + "\"\n", "checkpoint_bench");
  const int64_t vocab = fsdp::models::is_language_model(config.model) ? fsdp::models::vocab_size(config.model) : 0;
  auto sharded = fsdp::train::build_sharded_model(config, vocab, world);
  fsdp::optim::ShardedAdamW optimizer(*sharded.state, {});
  for (size_t slot = 0; slot < optimizer.slot_count(); ++slot) {
    optimizer.state_tensor(slot, 0).normal_();
    optimizer.state_tensor(slot, 1).uniform_();
  }
  const int64_t parameters = fsdp::models::parameter_count(sharded.config);
  if (rank == 0) std::filesystem::remove_all(dir);
  world->barrier()->wait();

  std::vector<double> save_s, load_s, export_s;
  int64_t checkpoint_bytes = 0, export_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    world->barrier()->wait();
    auto start = Clock::now();
    const std::string saved =
        fsdp::checkpoint::save_checkpoint(dir + "/ckpt", *sharded.state, &optimizer, {r + 1, model, ""});
    world->barrier()->wait();
    save_s.push_back(seconds_since(start));
    if (rank == 0) checkpoint_bytes = directory_bytes(saved);
    // Note: the load reads from the page cache (the files were just written), as a resume right
    // after a save does; a cold read from disk is slower.
    world->barrier()->wait();
    start = Clock::now();
    fsdp::checkpoint::load_checkpoint(saved, *sharded.state, &optimizer);
    world->barrier()->wait();
    load_s.push_back(seconds_since(start));
    start = Clock::now();
    export_bytes = fsdp::checkpoint::export_weights(*sharded.state, sharded.config, dir + "/model.safetensors");
    world->barrier()->wait();
    export_s.push_back(seconds_since(start));
    if (rank == 0) fsdp::checkpoint::prune_checkpoints(dir + "/ckpt", 1);
  }
  if (rank == 0) {
    const double gb = 1e9;
    std::printf("checkpoint_bench: %s, %.1f M parameters, %d ranks, median of %d\n", model.c_str(), parameters / 1e6, n,
                repeats);
    std::printf("%-28s %12s %10s %10s\n", "operation", "bytes", "seconds", "GB/s");
    std::printf("%-28s %12lld %10.3f %10.3f\n", "save (params + AdamW)", static_cast<long long>(checkpoint_bytes),
                median(save_s), checkpoint_bytes / median(save_s) / gb);
    std::printf("%-28s %12lld %10.3f %10.3f\n", "load (params + AdamW)", static_cast<long long>(checkpoint_bytes),
                median(load_s), checkpoint_bytes / median(load_s) / gb);
    std::printf("%-28s %12lld %10.3f %10.3f\n", "export safetensors fp32", static_cast<long long>(export_bytes),
                median(export_s), export_bytes / median(export_s) / gb);
    if (!json_path.empty()) {
      nlohmann::json out = {{"model", model},
                            {"parameters", parameters},
                            {"ranks", n},
                            {"repeats", repeats},
                            {"checkpoint_bytes", checkpoint_bytes},
                            {"save_seconds", save_s},
                            {"load_seconds", load_s},
                            {"export_bytes", export_bytes},
                            {"export_seconds", export_s}};
      std::ofstream(json_path) << out.dump(2) << "\n";
    }
    std::filesystem::remove_all(dir);
  }
  return 0;
}
