// checkpoint.async: the save in the background gives the checkpoint a synchronous save gives,
// byte for byte, without changing the training it runs beside.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/agreement.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace async_checkpoint_test {

namespace fs = std::filesystem;

fsdp::train::TrainConfig config_for(const fs::path& dir, bool async) {
  std::string text = "name = \"async-test\"\noutput_dir = \"" + dir.string() + "\"\n[model]\nname = \"gpt-test\"\n";
  text += "[train]\nsteps = 7\nglobal_batch = 12\nseq_len = 32\nthreads = 1\n";
  text += "[optimizer]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 2\n";
  text += "[eval]\nevery = 0\nsample_tokens = 0\n";
  text += "[checkpoint]\nevery = 2\nkeep = 0\nasync = " + std::string(async ? "true" : "false") + "\n";
  auto config = fsdp::train::parse_train_config(text, "async_checkpoint_test");
  auto gpt = std::get<fsdp::models::GptConfig>(config.model);
  gpt.dropout = 0.1;  // the RNG states matter: they are saved and must be the step's
  config.model = gpt;
  return config;
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every checkpoint (steps 2, 4, 6 and the last, 7) of an async run equals the synchronous run's:
// each rank file byte for byte, the manifests alike but for the config's own checkpoint.async; the
// losses are the same, bitwise; and a resume from the async run's step 4 continues as the run did.
TEST(AsyncCheckpoint, EqualsASynchronousSaveByteForByte) {
  auto world = fsdp::comm::init_world();
  const fs::path root = fs::temp_directory_path() / ("fsdp_async_checkpoint_test_" + std::to_string(world->size()));
  if (world->rank() == 0) fs::remove_all(root);
  world->barrier()->wait();
  const auto sync_config = config_for(root / "sync", false), async_config = config_for(root / "async", true);
  const auto sync_run = fsdp::train::train(sync_config, world, {false, true});
  // Rank 0's thread sleeps 300 ms before writing each file (the checkpoint test hook), so the
  // steps after a save run while it writes: a write from the live tensors, not from the staging
  // copies, would save the next steps' values.
  setenv("FSDP_TEST_PAUSE_IN_SAVE_MS", "300", 1);
  const auto async_run = fsdp::train::train(async_config, world, {false, true});
  unsetenv("FSDP_TEST_PAUSE_IN_SAVE_MS");
  ASSERT_EQ(async_run.losses.size(), 7u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(async_run.losses[i], sync_run.losses[i]) << "step " << i + 1;
  EXPECT_EQ(async_run.last_checkpoint, (root / "async" / "checkpoints" / "step-00000007").string());
  if (world->rank() == 0) {
    for (const char* step : {"step-00000002", "step-00000004", "step-00000006", "step-00000007"}) {
      const fs::path a = root / "async" / "checkpoints" / step, s = root / "sync" / "checkpoints" / step;
      ASSERT_TRUE(fs::exists(a / "manifest.json")) << a;
      int files = 0;
      for (const auto& entry : fs::directory_iterator(s)) {
        if (entry.path().extension() != ".safetensors") continue;
        ++files;
        EXPECT_EQ(bytes_of(a / entry.path().filename()), bytes_of(entry.path()))
            << step << " " << entry.path().filename();
      }
      EXPECT_EQ(files, world->size());
      auto manifest_a = nlohmann::json::parse(bytes_of(a / "manifest.json"));
      auto manifest_s = nlohmann::json::parse(bytes_of(s / "manifest.json"));
      EXPECT_NE(manifest_a.at("config_toml"), manifest_s.at("config_toml"));  // async = true against false
      manifest_a.erase("config_toml");
      manifest_s.erase("config_toml");
      // Two runs: each its own id (run_directory.h); the rest must be equal.
      EXPECT_NE(manifest_a.at("run_id"), manifest_s.at("run_id"));
      manifest_a.erase("run_id");
      manifest_s.erase("run_id");
      EXPECT_EQ(manifest_a, manifest_s) << step;
    }
    EXPECT_FALSE(fs::exists(root / "async" / "checkpoints" / "step-00000004.partial"));
    int beside = 0;
    std::ifstream metrics(root / "async" / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);)
      beside += nlohmann::json::parse(line).value("save_in_flight", false);
    EXPECT_GE(beside, 3) << "steps should have run while a save was being written";
  }
  fsdp::train::TrainerOptions resume{false, true};
  resume.resume = (root / "async" / "checkpoints" / "step-00000004").string();
  auto resume_config = async_config;
  resume_config.output_dir = (root / "resumed").string();
  const auto resumed = fsdp::train::train(resume_config, world, resume);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], sync_run.losses[4 + i]) << "step " << 5 + i;
  world->barrier()->wait();
  if (world->rank() == 0) fs::remove_all(root);
}

// A run that stops itself (here: a NaN loss at step 3 with train.max_nonfinite_steps = 1) while the
// step-2 checkpoint is still being written publishes that checkpoint before it stops: it is the one
// to resume from. Before the fix the stop left it as step-00000002.partial.
TEST(AsyncCheckpoint, AStoppingRunPublishesTheSaveInFlight) {
  auto world = fsdp::comm::init_world();
  const fs::path root =
      fs::temp_directory_path() / ("fsdp_async_checkpoint_stop_test_" + std::to_string(world->size()));
  if (world->rank() == 0) fs::remove_all(root);
  world->barrier()->wait();
  auto config = config_for(root, true);
  config.max_nonfinite_steps = 1;
  setenv("FSDP_TEST_PAUSE_IN_SAVE_MS", "300", 1);  // the write is still running at step 3
  setenv("FSDP_TEST_LOSS_FAULTS", "3:nan", 1);
  bool stopped = false;
  try {
    fsdp::train::train(config, world, {false, true});
  } catch (const fsdp::comm::AgreedStop& e) {
    stopped = std::string(e.what()).find("not finite") != std::string::npos;
  }
  unsetenv("FSDP_TEST_PAUSE_IN_SAVE_MS");
  unsetenv("FSDP_TEST_LOSS_FAULTS");
  EXPECT_TRUE(stopped) << "the run should stop at step 3 on its NaN loss";
  if (world->rank() == 0) {
    EXPECT_TRUE(fs::exists(root / "checkpoints" / "step-00000002" / "manifest.json"));
    EXPECT_FALSE(fs::exists(root / "checkpoints" / "step-00000002.partial"));
  }
  world->barrier()->wait();
  if (world->rank() == 0) fs::remove_all(root);
}

}  // namespace async_checkpoint_test
