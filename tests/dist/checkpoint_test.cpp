// Sharded checkpoints: saved at S ranks and loaded at L ranks (every S, L up to the job's size,
// using sub-groups), parameters and optimizer state come back bit for bit; corrupt or foreign
// checkpoints are refused on every rank; Hugging Face safetensors export and import round-trip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/agreement.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace {

namespace fs = std::filesystem;
using fsdp::comm::ProcessGroupPtr;

struct ModelUnderTest {
  fsdp::train::ShardedModel sharded;
  std::unique_ptr<fsdp::optim::ShardedAdamW> optimizer;
};

// shard_group_size > 0: hybrid_shard with that S; 0: full_shard.
ModelUnderTest make(const std::string& model, const ProcessGroupPtr& group, uint64_t seed, int shard_group_size = 0) {
  std::string toml = "[model]\nname = \"" + model + "\"\n";
  if (shard_group_size > 0) {
    toml += "[fsdp]\nstrategy = \"hybrid_shard\"\nshard_group_size = " + std::to_string(shard_group_size) + "\n";
  }
  auto config = fsdp::train::parse_train_config(toml, "checkpoint_test");
  config.seed = seed;
  ModelUnderTest s;
  s.sharded = fsdp::train::build_sharded_model(config, 256, group);
  s.optimizer = std::make_unique<fsdp::optim::ShardedAdamW>(*s.sharded.state, fsdp::optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  return s;
}

void train_steps(ModelUnderTest& s, const ProcessGroupPtr& group, int steps) {
  const int64_t local = 4;
  for (int step = 0; step < steps; ++step) {
    s.optimizer->zero_grad();
    auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(77 + step * 31 + group->rank()));
    at::Tensor ids = at::randint(0, 256, {local, 9}, generator, at::kLong);
    at::Tensor logits = s.sharded.model.forward(ids.narrow(1, 0, 8));
    torch::nn::functional::cross_entropy(logits.reshape({-1, 256}), ids.narrow(1, 1, 8).reshape(-1)).backward();
    s.optimizer->step();
  }
}

// Every parameter and moment, unsharded and unpadded, concatenated: [total] fp32. Collective.
at::Tensor everything(ModelUnderTest& s) {
  const ProcessGroupPtr& group = s.sharded.state->shard_group();  // one copy of the model
  std::vector<at::Tensor> parts;
  for (auto& [name, tensor] : s.sharded.state->full_parameters()) parts.push_back(tensor.reshape(-1));
  for (size_t slot = 0; slot < s.optimizer->slot_count(); ++slot) {
    const auto& layout = s.optimizer->flat_of_slot(slot)->layout();
    for (size_t w = 0; w < 2; ++w) {
      at::Tensor full = at::empty({layout.shard_numel * group->size()}, at::kFloat);
      group->all_gather(full, s.optimizer->state_tensor(slot, w))->wait();
      parts.push_back(full.narrow(0, 0, layout.numel));
    }
  }
  return at::cat(parts);
}

std::string test_dir(const ProcessGroupPtr& world, const std::string& name) {
  return (fs::temp_directory_path() / ("fsdp_checkpoint_test_np" + std::to_string(world->size()) + "_" + name)).string();
}

void fresh_dir(const ProcessGroupPtr& world, const std::string& dir) {
  if (world->rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world->barrier()->wait();
}

// Saved at S ranks, loaded at L ranks, for every S and L from 1 to N (ranks >= L load at N - L at
// the same time). Exact equality: loading copies bytes, nothing is recomputed.
TEST(Checkpoint, LoadsAtAnyWorldSizeBitForBit) {
  auto world = fsdp::comm::init_world();
  const int n = world->size(), rank = world->rank();
  const std::string root = test_dir(world, "reshard");
  fresh_dir(world, root);
  for (int saved = 1; saved <= n; ++saved) {
    auto save_group = world->split(rank < saved ? 0 : 1, rank);
    at::Tensor reference;
    std::string dir;
    if (rank < saved) {
      ModelUnderTest s = make("llama-test", save_group, 11);
      train_steps(s, save_group, 3);
      dir = fsdp::checkpoint::save_checkpoint(root + "/saved_at_" + std::to_string(saved), *s.sharded.state,
                                              s.optimizer.get(), {3, "llama-test", ""});
      reference = everything(s);
    }
    // Rank 0 holds the reference; every rank gets it to compare with.
    at::Tensor size = at::tensor({reference.defined() ? reference.numel() : int64_t{0}}, at::kLong);
    world->broadcast(size, 0)->wait();
    if (!reference.defined()) reference = at::empty({size.item<int64_t>()}, at::kFloat);
    world->broadcast(reference, 0)->wait();
    dir = root + "/saved_at_" + std::to_string(saved) + "/step-00000003";
    for (int loaded = 1; loaded <= n; ++loaded) {
      auto load_group = world->split(rank < loaded ? 0 : 1, rank);
      ModelUnderTest s = make("llama-test", load_group, 99);  // another initialisation: values must come from disk
      auto info = fsdp::checkpoint::load_checkpoint(dir, *s.sharded.state, s.optimizer.get());
      EXPECT_EQ(info.step, 3);
      EXPECT_EQ(s.optimizer->step_count(), 3);
      EXPECT_TRUE(torch::equal(everything(s), reference))
          << "saved at " << saved << " ranks, loaded at " << load_group->size();
    }
  }
}

// hybrid_shard (R x S, every S dividing N) saves one copy (replica group 0's S files); it loads
// bit for bit into full_shard at N ranks, and full_shard's N files load into hybrid_shard. After
// training, every replica group holds the same shards.
TEST(Checkpoint, HybridAndFullShardLoadEachOther) {
  auto world = fsdp::comm::init_world();
  const int n = world->size();
  const std::string root = test_dir(world, "hybrid");
  for (int s = 1; s <= n; ++s) {
    if (n % s != 0) continue;
    fresh_dir(world, root);
    ModelUnderTest hybrid = make("llama-test", world, 11, s);
    train_steps(hybrid, world, 3);
    const at::Tensor trained = everything(hybrid);
    if (auto replicas = hybrid.sharded.state->replicate_group()) {
      at::Tensor mine = trained.sum().to(at::kDouble).reshape({1}), highest = mine.clone();
      replicas->all_reduce(highest, fsdp::comm::ReduceOp::Max)->wait();
      EXPECT_EQ(mine.item<double>(), highest.item<double>()) << "replica groups diverged at S = " << s;
    }
    const std::string hybrid_dir = fsdp::checkpoint::save_checkpoint(root + "/from_hybrid", *hybrid.sharded.state,
                                                                      hybrid.optimizer.get(), {3, "llama-test", ""});
    if (world->rank() == 0) {
      int files = 0;
      for (const auto& entry : fs::directory_iterator(hybrid_dir)) files += entry.path().extension() == ".safetensors";
      EXPECT_EQ(files, s) << "hybrid_shard at S = " << s << " writes one file per shard rank";
    }
    ModelUnderTest full = make("llama-test", world, 99);
    fsdp::checkpoint::load_checkpoint(hybrid_dir, *full.sharded.state, full.optimizer.get());
    EXPECT_TRUE(torch::equal(everything(full), trained)) << "hybrid S = " << s << " -> full_shard";

    train_steps(full, world, 2);
    const at::Tensor full_trained = everything(full);
    const std::string full_dir = fsdp::checkpoint::save_checkpoint(root + "/from_full", *full.sharded.state,
                                                                    full.optimizer.get(), {5, "llama-test", ""});
    ModelUnderTest back = make("llama-test", world, 99, s);
    auto info = fsdp::checkpoint::load_checkpoint(full_dir, *back.sharded.state, back.optimizer.get());
    EXPECT_EQ(info.step, 5);
    EXPECT_TRUE(torch::equal(everything(back), full_trained)) << "full_shard -> hybrid S = " << s;
  }
}

TEST(Checkpoint, RefusesCorruptAndForeignCheckpointsOnEveryRank) {
  auto world = fsdp::comm::init_world();
  const std::string root = test_dir(world, "bad");
  fresh_dir(world, root);
  ModelUnderTest s = make("llama-test", world, 5);
  const std::string dir = fsdp::checkpoint::save_checkpoint(root, *s.sharded.state, s.optimizer.get(), {1, "llama-test", ""});
  const at::Tensor before = everything(s);

  // Another model: refused, naming a parameter.
  ModelUnderTest other = make("gpt-test", world, 5);
  try {
    fsdp::checkpoint::load_checkpoint(dir, *other.sharded.state, other.optimizer.get());
    FAIL() << "expected a refusal";
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report()) EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
  // A flipped byte in the last rank's file: its checksum fails; nothing is loaded anywhere.
  world->barrier()->wait();
  if (world->rank() == 0) {
    char name[64];
    std::snprintf(name, sizeof(name), "/rank-%05d-of-%05d.safetensors", world->size() - 1, world->size());
    std::fstream file(dir + name, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-1, std::ios::end);
    char last = 0;
    file.read(&last, 1);
    last ^= 0x55;
    file.seekp(-1, std::ios::end);
    file.write(&last, 1);
  }
  world->barrier()->wait();
  ModelUnderTest fresh = make("llama-test", world, 6);
  const at::Tensor fresh_before = everything(fresh);
  try {
    fsdp::checkpoint::load_checkpoint(dir, *fresh.sharded.state, fresh.optimizer.get());
    FAIL() << "expected a checksum failure";
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report()) EXPECT_NE(std::string(e.what()).find("fails its checksum"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(everything(fresh), fresh_before)) << "nothing may be loaded half-way";
  // A directory whose save never finished.
  if (world->rank() == 0) fs::create_directories(root + "/step-00000009.partial");
  world->barrier()->wait();
  EXPECT_THROW(fsdp::checkpoint::load_checkpoint(root + "/step-00000009.partial", *fresh.sharded.state, nullptr),
               fsdp::comm::AgreedStop);
  EXPECT_EQ(fsdp::checkpoint::find_latest_checkpoint(root), dir);
  (void)before;
}

// Export to Hugging Face names and import into a differently initialised model: exact in fp32
// (one file, and the sharded set with its index); bf16 gives the fp32 values rounded to bf16.
TEST(HfWeights, ExportThenImportRoundTrips) {
  auto world = fsdp::comm::init_world();
  const std::string root = test_dir(world, "hf");
  fresh_dir(world, root);
  for (const char* model : {"gpt-test", "llama-test"}) {
    ModelUnderTest s = make(model, world, 21);
    train_steps(s, world, 1);
    std::map<std::string, at::Tensor> expected;
    for (auto& [name, tensor] : s.sharded.state->full_parameters()) expected[name] = tensor;
    const std::string file = root + "/" + model + ".safetensors";
    const std::string set = root + "/" + model + "-set";
    fsdp::checkpoint::export_weights(*s.sharded.state, s.sharded.config, file);
    fsdp::checkpoint::ExportOptions sharded_set;
    sharded_set.max_file_bytes = 20000;  // several files
    fsdp::checkpoint::export_weights(*s.sharded.state, s.sharded.config, set, sharded_set);
    fsdp::checkpoint::ExportOptions bf16;
    bf16.dtype = at::kBFloat16;
    fsdp::checkpoint::export_weights(*s.sharded.state, s.sharded.config, file + ".bf16", bf16);
    world->barrier()->wait();
    for (const std::string& path : {file, set, file + ".bf16"}) {
      ModelUnderTest t = make(model, world, 22);
      fsdp::checkpoint::import_weights(*t.sharded.state, t.sharded.config, path);
      for (auto& [name, tensor] : t.sharded.state->full_parameters()) {
        const at::Tensor want = path == file + ".bf16" ? expected[name].to(at::kBFloat16).to(at::kFloat) : expected[name];
        EXPECT_TRUE(torch::equal(tensor, want)) << model << " " << path << " " << name;
      }
    }
    if (world->rank() == 0) {
      fsdp::checkpoint::SafetensorsFile exported(file);
      if (std::string(model) == "gpt-test") {
        // Hugging Face GPT-2 layout: Conv1D weights stored [in, out]; the head is tied (absent).
        EXPECT_EQ(exported.info("h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{32, 96}));
        EXPECT_FALSE(exported.contains("lm_head.weight"));
      } else {
        EXPECT_TRUE(exported.contains("model.layers.1.self_attn.k_proj.weight"));
        EXPECT_TRUE(exported.contains("lm_head.weight"));
      }
      EXPECT_TRUE(fs::exists(set + "/model.safetensors.index.json"));
      int files = 0;
      for (auto& e : fs::directory_iterator(set)) files += e.path().extension() == ".safetensors";
      EXPECT_GE(files, 2) << "a sharded set of several files";
    }
    world->barrier()->wait();
  }
  // Weights with a wrong shape or dtype are refused, naming the tensor; nothing is loaded.
  ModelUnderTest g = make("gpt-test", world, 1);
  const at::Tensor untouched = everything(g);
  if (world->rank() == 0) {
    fsdp::checkpoint::SafetensorsFile good(root + "/gpt-test.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> wrong_shape, wrong_dtype;
    for (const auto& info : good.tensors()) {
      at::Tensor t = good.read(info.name);
      wrong_shape.emplace_back(info.name, info.name == "wpe.weight" ? t.narrow(0, 0, 10).contiguous() : t);
      wrong_dtype.emplace_back(info.name, info.name == "ln_f.weight" ? t.to(at::kLong) : t);
    }
    fsdp::checkpoint::write_safetensors(root + "/wrong_shape.safetensors", wrong_shape);
    fsdp::checkpoint::write_safetensors(root + "/wrong_dtype.safetensors", wrong_dtype);
  }
  world->barrier()->wait();
  for (const auto& [file, expected] : std::vector<std::pair<std::string, std::string>>{
           {"wrong_shape", "tensor 'wpe.weight' has shape [10, 32], the model expects [64, 32]"},
           {"wrong_dtype", "tensor 'ln_f.weight' has dtype I64"}}) {
    try {
      fsdp::checkpoint::import_weights(*g.sharded.state, g.sharded.config, root + "/" + file + ".safetensors");
      ADD_FAILURE() << "expected a refusal of " << file;
    } catch (const fsdp::comm::AgreedStop& e) {
      if (e.should_report()) EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(torch::equal(everything(g), untouched));
  try {
    fsdp::checkpoint::import_weights(*g.sharded.state, g.sharded.config, root + "/llama-test.safetensors");
    FAIL() << "expected a refusal";
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report()) EXPECT_NE(std::string(e.what()).find("no tensor"), std::string::npos) << e.what();
  }
}

}  // namespace
