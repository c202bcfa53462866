// Sharded checkpoints: saved at S ranks and loaded at L ranks (every S, L up to the job's size,
// using sub-groups), parameters, optimizer state and module buffers come back bit for bit; corrupt
// or foreign checkpoints are refused on every rank, and a corrupt tensor no rank reads is never
// looked at; version 1 and 2 checkpoints still load; Hugging Face safetensors export and import
// round-trip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <malloc.h>

#include "fsdp/checkpoint/hf_weights.h"
#include "process_memory.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/shard/nf4.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/agreement.h"
#include "fsdp/optim/adamw_kernel.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace checkpoint_test {

namespace fs = std::filesystem;
using fsdp::comm::ProcessGroupPtr;

struct ModelUnderTest {
  fsdp::train::ShardedModel sharded;
  std::unique_ptr<fsdp::optim::ShardedAdamW> optimizer;
};

// The model a config's text describes, sharded over `group`, with AdamW.
ModelUnderTest make_from_toml(const std::string& toml, const ProcessGroupPtr& group, uint64_t seed) {
  auto config = fsdp::train::parse_train_config(toml, "checkpoint_test");
  config.seed = seed;
  ModelUnderTest s;
  s.sharded = fsdp::train::build_sharded_model(config, 256, group);
  s.optimizer = std::make_unique<fsdp::optim::ShardedAdamW>(*s.sharded.state,
                                                            fsdp::optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  return s;
}

// shard_group_size > 0: hybrid_shard with that S; 0: full_shard.
ModelUnderTest make(const std::string& model, const ProcessGroupPtr& group, uint64_t seed, int shard_group_size = 0) {
  std::string toml = "[model]\nname = \"" + model + "\"\n";
  if (shard_group_size > 0) {
    toml += "[fsdp]\nstrategy = \"hybrid_shard\"\nshard_group_size = " + std::to_string(shard_group_size) + "\n";
  }
  return make_from_toml(toml, group, seed);
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
  return (fs::temp_directory_path() / ("fsdp_checkpoint_test_np" + std::to_string(world->size()) + "_" + name))
      .string();
}

void fresh_dir(const ProcessGroupPtr& world, const std::string& dir) {
  if (world->rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world->barrier()->wait();
}

std::string rank_file(const std::string& dir, int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof(name), "/rank-%05d-of-%05d.safetensors", rank, world);
  return dir + name;
}

// XORs one byte of a file with 0x55 (twice restores it).
void flip_byte(const std::string& path, int64_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file) << path;
  file.seekg(offset);
  char byte = 0;
  file.read(&byte, 1);
  byte ^= 0x55;
  file.seekp(offset);
  file.write(&byte, 1);
}

// Where tensor `name`'s first data byte lies in a safetensors file: after the 8-byte header length
// and the header.
int64_t first_byte_of(const std::string& path, const std::string& name) {
  uint64_t header = 0;
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(&header), 8);
  return 8 + static_cast<int64_t>(header) + fsdp::checkpoint::SafetensorsFile(path).info(name).begin;
}

// The text of a refusal, on the ranks that report it ("" elsewhere); fails the test if it loads.
template <class Fn>
std::string refusal_of(Fn&& load) {
  try {
    load();
  } catch (const fsdp::comm::AgreedStop& e) {
    return e.should_report() ? e.what() : "";
  }
  ADD_FAILURE() << "expected the load to be refused";
  return "";
}

// A small convolutional network with BatchNorm buffers (running_mean, running_var [4] fp32,
// num_batches_tracked [] int64 per block): two Conv2d+BatchNorm2d+ReLU blocks, each an FSDP unit,
// and a Linear head in the root. track_running_stats = false: the same parameters, no buffers.
struct ConvBlockImpl : torch::nn::Module {
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
  ConvBlockImpl(int64_t in, int64_t out, bool track_running_stats) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    norm = register_module(
        "norm", torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(out).track_running_stats(track_running_stats)));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::relu(norm(conv(x))); }
};
TORCH_MODULE(ConvBlock);

struct ConvNetImpl : torch::nn::Module {
  torch::nn::ModuleList blocks;
  torch::nn::Linear head{nullptr};
  explicit ConvNetImpl(bool track_running_stats) {
    blocks = register_module("blocks", torch::nn::ModuleList());
    fsdp::nn::push_block(blocks, ConvBlock(1, 4, track_running_stats));
    fsdp::nn::push_block(blocks, ConvBlock(4, 4, track_running_stats));
    head = register_module("head", torch::nn::Linear(4 * 8 * 8, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < blocks->size(); ++i) x = fsdp::nn::call(blocks->ptr<ConvBlockImpl>(i), x);
    return head(x.flatten(1));
  }
};

struct ConvNetUnderTest {
  fsdp::runtime::FullyShardedModule<ConvNetImpl> model;
  std::unique_ptr<fsdp::optim::ShardedAdamW> optimizer;
};

ConvNetUnderTest make_conv_net(const ProcessGroupPtr& group, uint64_t seed, bool track_running_stats = true) {
  fsdp::runtime::FsdpOptions options;
  options.wrap_policy.module_types = {"ConvBlock"};
  torch::manual_seed(seed);
  auto model = fsdp::runtime::build_fully_sharded<ConvNetImpl>(
      group, options, [&] { return std::make_shared<ConvNetImpl>(track_running_stats); });
  auto optimizer =
      std::make_unique<fsdp::optim::ShardedAdamW>(model.state(), fsdp::optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  return {std::move(model), std::move(optimizer)};
}

// Trains in train mode, so BatchNorm updates its running statistics. Every rank takes the same
// batch: until the runtime keeps buffers equal across ranks, equal data keeps them equal.
void train_conv_net(ConvNetUnderTest& s, int steps) {
  for (int step = 0; step < steps; ++step) {
    s.optimizer->zero_grad();
    auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(500 + step));
    at::Tensor images = at::randn({6, 1, 8, 8}, generator) * 2.0 + 0.5;  // running stats move off 0 and 1
    at::Tensor labels = at::randint(0, 10, {6}, generator, at::kLong);
    torch::nn::functional::cross_entropy(s.model.forward(images), labels).backward();
    s.optimizer->step();
  }
}

// name -> a copy of each buffer (fresh tensors: later training cannot change them).
std::map<std::string, at::Tensor> buffers_of(torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_buffers(true)) {
    if (item.value().defined()) out[item.key()] = item.value().clone();
  }
  return out;
}

// Every parameter, unsharded, concatenated: [total] fp32. Collective over the model's group.
at::Tensor all_parameters(fsdp::runtime::FsdpState& state) {
  std::vector<at::Tensor> parts;
  for (auto& [name, tensor] : state.full_parameters()) parts.push_back(tensor.reshape(-1));
  return at::cat(parts);
}

// Saved at S ranks, loaded at L ranks, for every S and L from 1 to N (ranks >= L load at N - L at
// the same time). Exact equality: loading copies bytes, nothing is recomputed.
// ShardedOptimizer::uncount_step takes back a step_unless's count, once (the trainer's step skipped
// on the device, tests/dist/step_edge_test.cpp); before any step, after step() or a second time it
// throws, rather than shifting AdamW's bias corrections. The composed update (host-read flag) and
// the fused one (the kernel's found_inf) both.
TEST(StepCount, UncountTakesBackAStepUnlessOnce) {
  auto world = fsdp::comm::init_world();
  ConvNetUnderTest s = make_conv_net(world, 7);
  EXPECT_THROW(s.optimizer->uncount_step(), std::logic_error) << "before any step";
  train_conv_net(s, 1);
  fsdp::optim::AdamWOptions fused_options;
  fused_options.kernel = fsdp::optim::AdamWKernel::Fused;
  fsdp::optim::ShardedAdamW fused(s.model.state(), fused_options);
  fused.set_step_count(1);
  for (fsdp::optim::ShardedOptimizer* optimizer : {static_cast<fsdp::optim::ShardedOptimizer*>(s.optimizer.get()),
                                                   static_cast<fsdp::optim::ShardedOptimizer*>(&fused)}) {
    EXPECT_THROW(optimizer->uncount_step(), std::logic_error) << "after step(), or a resume's count";
    EXPECT_EQ(optimizer->step_count(), 1);
    optimizer->step_unless(at::ones({1}));
    EXPECT_EQ(optimizer->step_count(), 2) << "counted as step() would";
    optimizer->uncount_step();
    EXPECT_EQ(optimizer->step_count(), 1);
    EXPECT_THROW(optimizer->uncount_step(), std::logic_error) << "a second time";
    EXPECT_EQ(optimizer->step_count(), 1);
  }
}

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

// A model whose last flat (wpe 2 x 4 and ln_f: 16 elements) is smaller than N^2: from N = 7 the
// last ranks save empty slices, zero-length tensors at the offset where the next tensor begins,
// which the safetensors reader once took for an overlap (user_files_tests has the reader's case).
// Saved at the job's N and loaded back at N, bit for bit; CTest runs it at N = 1..8.
TEST(Checkpoint, SmallFlatsWithEmptySlicesLoadBack) {
  auto world = fsdp::comm::init_world();
  const std::string root = test_dir(world, "small_flats");
  fresh_dir(world, root);
  auto build = [&](uint64_t seed) {
    return make_from_toml("[model]\nname = \"gpt-test\"\ncontext = 2\ndim = 4\nheads = 1\nlayers = 2\n", world, seed);
  };
  ModelUnderTest saved = build(5);
  const at::Tensor reference = everything(saved);
  const std::string dir =
      fsdp::checkpoint::save_checkpoint(root, *saved.sharded.state, saved.optimizer.get(), {1, "gpt-test", ""});
  ModelUnderTest loaded = build(6);
  ASSERT_NO_THROW(fsdp::checkpoint::load_checkpoint(dir, *loaded.sharded.state, loaded.optimizer.get()));
  EXPECT_TRUE(torch::equal(everything(loaded), reference)) << "N = " << world->size();
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
  const std::string dir =
      fsdp::checkpoint::save_checkpoint(root, *s.sharded.state, s.optimizer.get(), {1, "llama-test", ""});
  const at::Tensor before = everything(s);

  // Another model: refused, naming a parameter.
  ModelUnderTest other = make("gpt-test", world, 5);
  try {
    fsdp::checkpoint::load_checkpoint(dir, *other.sharded.state, other.optimizer.get());
    FAIL() << "expected a refusal";
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report()) EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
  // A flipped byte in the last rank's file (its last byte: the end of its RNG state, which that rank
  // reads at the same world size): the tensor's checksum fails; nothing is loaded anywhere.
  world->barrier()->wait();
  const std::string last_file = rank_file(dir, world->size() - 1, world->size());
  const int64_t last_byte = static_cast<int64_t>(fs::file_size(last_file)) - 1;
  if (world->rank() == 0) flip_byte(last_file, last_byte);
  world->barrier()->wait();
  ModelUnderTest fresh = make("llama-test", world, 6);
  const at::Tensor fresh_before = everything(fresh);
  try {
    fsdp::checkpoint::load_checkpoint(dir, *fresh.sharded.state, fresh.optimizer.get());
    FAIL() << "expected a checksum failure";
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report()) {
      EXPECT_NE(std::string(e.what()).find("'" + last_file + "': tensor 'rng' fails its checksum"), std::string::npos)
          << e.what();
    }
    // Rank 0 reads its own file only: it did not fail, so it does not report (the last rank does).
    if (world->size() > 1 && world->rank() == 0) EXPECT_FALSE(e.should_report()) << e.what();
  }
  EXPECT_TRUE(torch::equal(everything(fresh), fresh_before)) << "nothing may be loaded half-way";
  // A directory whose save never finished.
  if (world->rank() == 0) fs::create_directories(root + "/step-00000009.partial");
  world->barrier()->wait();
  EXPECT_THROW(fsdp::checkpoint::load_checkpoint(root + "/step-00000009.partial", *fresh.sharded.state, nullptr),
               fsdp::comm::AgreedStop);
  EXPECT_EQ(fsdp::checkpoint::find_latest_checkpoint(root), dir);

  // The refusals left the checkpoint as it was: with the byte restored it loads, and holds exactly
  // the model that saved it (bit for bit: loading copies bytes).
  world->barrier()->wait();
  if (world->rank() == 0) flip_byte(last_file, last_byte);
  world->barrier()->wait();
  fsdp::checkpoint::load_checkpoint(dir, *fresh.sharded.state, fresh.optimizer.get());
  EXPECT_TRUE(torch::equal(everything(fresh), before)) << "the restored checkpoint must hold the saved model";
}

// A manifest edited by hand or damaged (issue 21's review: a missing key was undefined behaviour,
// world_size 0 a division by zero): refused on every rank with the manifest named, nothing loaded.
TEST(Checkpoint, RefusesMalformedManifestsOnEveryRank) {
  auto world = fsdp::comm::init_world();
  const std::string root = test_dir(world, "manifest");
  fresh_dir(world, root);
  ModelUnderTest s = make("llama-test", world, 5);
  const std::string dir =
      fsdp::checkpoint::save_checkpoint(root, *s.sharded.state, s.optimizer.get(), {1, "llama-test", ""});
  const std::string manifest_path = dir + "/manifest.json";
  nlohmann::json original;
  std::ifstream(manifest_path) >> original;
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> damages = {
      {"entries", [](nlohmann::json& m) { m["flat_params"][0].erase("entries"); }},
      {"world_size",
       [](nlohmann::json& m) {
         m["world_size"] = 0;
         m["files"] = nlohmann::json::array();
       }},
      {"flat_params", [](nlohmann::json& m) { m["flat_params"] = "none"; }},
      {"step", [](nlohmann::json& m) { m.erase("step"); }},
      {"stored_per_file", [](nlohmann::json& m) { m["flat_params"][0].erase("stored_per_file"); }},
      {"numel",  // smaller than its entries: the slices would leave the rest of the unit unread
       [](nlohmann::json& m) { m["flat_params"][0]["numel"] = m["flat_params"][0]["numel"].get<int64_t>() - 1; }},
      {"world_size", [](nlohmann::json& m) { m["world_size"] = int64_t{1} << 32; }},
      {"stored_per_file",  // files that cannot hold the unit
       [](nlohmann::json& m) {
         m["flat_params"][0]["stored_per_file"] =
             (m["flat_params"][0]["numel"].get<int64_t>() - 1) / m["world_size"].get<int64_t>();
       }},
  };
  ModelUnderTest fresh = make("llama-test", world, 6);
  const at::Tensor fresh_before = everything(fresh);
  for (const auto& [key, damage] : damages) {
    world->barrier()->wait();
    if (world->rank() == 0) {
      nlohmann::json damaged = original;
      damage(damaged);
      std::ofstream(manifest_path) << damaged.dump();
    }
    world->barrier()->wait();
    try {
      fsdp::checkpoint::load_checkpoint(dir, *fresh.sharded.state, fresh.optimizer.get());
      ADD_FAILURE() << "a manifest without a valid '" << key << "' was accepted";
    } catch (const fsdp::comm::AgreedStop& e) {
      if (e.should_report()) {
        EXPECT_NE(std::string(e.what()).find("manifest"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(torch::equal(everything(fresh), fresh_before)) << key << ": nothing may be loaded";
  }
  world->barrier()->wait();
  if (world->rank() == 0) std::ofstream(manifest_path) << original.dump();
  world->barrier()->wait();
}

// Each rank checks only the tensors it reads, each against its own crc32: a corrupt byte in a
// tensor a load uses is refused naming the file and the tensor; one in a tensor no rank of the
// load reads (optimizer state when loading weights only; the RNG state at another world size)
// does not stop it.
TEST(Checkpoint, ChecksEachTensorItReadsAndOnlyThose) {
  auto world = fsdp::comm::init_world();
  const int n = world->size(), rank = world->rank();
  const std::string root = test_dir(world, "tensor_crc");
  fresh_dir(world, root);
  ModelUnderTest s = make("llama-test", world, 5);
  train_steps(s, world, 1);
  const std::string dir =
      fsdp::checkpoint::save_checkpoint(root, *s.sharded.state, s.optimizer.get(), {1, "llama-test", ""});
  const at::Tensor saved_parameters = all_parameters(*s.sharded.state);

  // A byte of rank 0's slice of the first unit's first moment.
  const std::string file0 = rank_file(dir, 0, n);
  if (rank == 0) flip_byte(file0, first_byte_of(file0, "p0.exp_avg") + 5);
  world->barrier()->wait();
  ModelUnderTest weights_only = make("llama-test", world, 6);
  fsdp::checkpoint::load_checkpoint(dir, *weights_only.sharded.state, nullptr);  // never reads p0.exp_avg
  EXPECT_TRUE(torch::equal(all_parameters(*weights_only.sharded.state), saved_parameters));

  ModelUnderTest with_optimizer = make("llama-test", world, 6);
  const at::Tensor untouched = everything(with_optimizer);
  const std::string refusal = refusal_of(
      [&] { fsdp::checkpoint::load_checkpoint(dir, *with_optimizer.sharded.state, with_optimizer.optimizer.get()); });
  if (rank == 0) {  // rank 0 reads that slice at every world size
    EXPECT_NE(refusal.find("'" + file0 + "': tensor 'p0.exp_avg' fails its checksum"), std::string::npos) << refusal;
  }
  EXPECT_TRUE(torch::equal(everything(with_optimizer), untouched)) << "nothing may be loaded half-way";
  world->barrier()->wait();
  if (rank == 0) flip_byte(file0, first_byte_of(file0, "p0.exp_avg") + 5);  // restored

  // The RNG state is read only at the world size that saved it.
  if (n == 1) return;
  const std::string last_file = rank_file(dir, n - 1, n);
  if (rank == 0) flip_byte(last_file, first_byte_of(last_file, "rng"));
  world->barrier()->wait();
  auto smaller = world->split(rank == 0 ? 0 : 1, rank);  // N - 1 ranks, and rank 0 alone
  ModelUnderTest at_other_size = make("llama-test", smaller, 6);
  fsdp::checkpoint::load_checkpoint(dir, *at_other_size.sharded.state, at_other_size.optimizer.get());
  ModelUnderTest at_same_size = make("llama-test", world, 6);
  const std::string rng_refusal = refusal_of(
      [&] { fsdp::checkpoint::load_checkpoint(dir, *at_same_size.sharded.state, at_same_size.optimizer.get()); });
  if (rank == n - 1) EXPECT_NE(rng_refusal.find("tensor 'rng' fails its checksum"), std::string::npos) << rng_refusal;
}

// Module buffers (BatchNorm's running statistics) are saved once and restored on every rank, bit
// for bit, at every world size up to the job's.
TEST(Checkpoint, RestoresModuleBuffersAtAnyWorldSize) {
  auto world = fsdp::comm::init_world();
  const int n = world->size(), rank = world->rank();
  const std::string root = test_dir(world, "buffers");
  fresh_dir(world, root);
  ConvNetUnderTest source = make_conv_net(world, 3);
  train_conv_net(source, 3);
  const std::map<std::string, at::Tensor> saved_buffers = buffers_of(source.model.state().root_module());
  ASSERT_EQ(saved_buffers.size(), 6u) << "two BatchNorms: running_mean, running_var, num_batches_tracked each";
  ASSERT_EQ(saved_buffers.at("blocks.0.norm.num_batches_tracked").item<int64_t>(), 3);
  const std::string dir =
      fsdp::checkpoint::save_checkpoint(root, source.model.state(), source.optimizer.get(), {3, "conv", ""});
  const at::Tensor saved_parameters = all_parameters(source.model.state());
  if (rank == 0) {
    fsdp::checkpoint::SafetensorsFile file0(rank_file(dir, 0, n));
    const std::string counter = "buffer.blocks.1.norm.num_batches_tracked";
    EXPECT_TRUE(file0.contains(counter) && file0.info(counter).dtype == at::kLong)
        << counter << " in rank 0's file, int64";
    if (n > 1)
      EXPECT_FALSE(
          fsdp::checkpoint::SafetensorsFile(rank_file(dir, 1, n)).contains("buffer.blocks.1.norm.running_mean"));
  }
  for (int loaded = 1; loaded <= n; ++loaded) {
    auto load_group = world->split(rank < loaded ? 0 : 1, rank);
    ConvNetUnderTest target = make_conv_net(load_group, 77);  // buffers at their initial values: 0, 1, 0
    fsdp::checkpoint::load_checkpoint(dir, target.model.state(), target.optimizer.get());
    const std::map<std::string, at::Tensor> restored = buffers_of(target.model.state().root_module());
    ASSERT_EQ(restored.size(), saved_buffers.size());
    for (const auto& [name, value] : saved_buffers) {
      EXPECT_TRUE(torch::equal(restored.at(name), value)) << name << ", loaded at " << load_group->size() << " ranks";
    }
    EXPECT_TRUE(torch::equal(all_parameters(target.model.state()), saved_parameters))
        << "loaded at " << load_group->size();
  }
}

// A checkpoint whose buffers are not the model's (BatchNorm with and without running statistics:
// the same parameters) is refused on every rank, naming the buffer; nothing is loaded.
TEST(Checkpoint, RefusesCheckpointsWhoseBuffersDifferFromTheModels) {
  auto world = fsdp::comm::init_world();
  const std::string root = test_dir(world, "buffer_mismatch");
  fresh_dir(world, root);
  ConvNetUnderTest tracking = make_conv_net(world, 3, true);
  ConvNetUnderTest stateless = make_conv_net(world, 3, false);
  const std::string with_buffers = fsdp::checkpoint::save_checkpoint(root + "/tracking", tracking.model.state(),
                                                                     tracking.optimizer.get(), {1, "conv", ""});
  const std::string without_buffers = fsdp::checkpoint::save_checkpoint(root + "/stateless", stateless.model.state(),
                                                                        stateless.optimizer.get(), {1, "conv", ""});

  ConvNetUnderTest target = make_conv_net(world, 8, true);
  const at::Tensor parameters = all_parameters(target.model.state());
  const std::string missing = refusal_of(
      [&] { fsdp::checkpoint::load_checkpoint(without_buffers, target.model.state(), target.optimizer.get()); });
  if (!missing.empty())
    EXPECT_NE(missing.find("holds no buffer 'blocks.0.norm.running_mean' [4] F32"), std::string::npos) << missing;
  EXPECT_TRUE(torch::equal(all_parameters(target.model.state()), parameters)) << "nothing may be loaded half-way";

  ConvNetUnderTest stateless_target = make_conv_net(world, 8, false);
  const std::string extra = refusal_of([&] {
    fsdp::checkpoint::load_checkpoint(with_buffers, stateless_target.model.state(), stateless_target.optimizer.get());
  });
  if (!extra.empty()) EXPECT_NE(extra.find("that this model does not have"), std::string::npos) << extra;
}

// Version 1 checkpoints (one crc32 per file, no per-tensor checksums, no buffers) still load, each
// file a rank opens checked whole.
// Rewrites a checkpoint this build saved as versions 1 and 2 wrote it: every unit's slices
// ceil(numel / N) elements per file (version 3's are its shards' own k, rounded up to 8), the rank
// files written again, and a manifest without what those versions lacked (stored_per_file; version
// 1 also the buffers and each tensor's crc32). Returns how many units' slices moved. Rank 0 only.
int rewrite_as_version(const std::string& dir, int version) {
  nlohmann::json manifest;
  std::ifstream(dir + "/manifest.json") >> manifest;
  const int n = manifest["world_size"].get<int>();
  // Each rank file's tensors in order; each unit's tensors ("p<i>.param", "p<i>.exp_avg", ...) whole.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> files(n);
  std::map<std::string, std::vector<at::Tensor>> pieces;
  auto unit_of = [](const std::string& name) {
    return name.size() > 1 && name[0] == 'p' && std::isdigit(static_cast<unsigned char>(name[1]))
               ? std::stoi(name.substr(1))
               : -1;
  };
  for (int r = 0; r < n; ++r) {
    fsdp::checkpoint::SafetensorsFile file(rank_file(dir, r, n));
    for (const auto& info : file.tensors()) {
      files[r].emplace_back(info.name, file.read(info.name));
      if (unit_of(info.name) >= 0) pieces[info.name].push_back(files[r].back().second.reshape(-1));
    }
  }
  int moved = 0;
  for (auto& unit : manifest["flat_params"]) {
    const int64_t numel = unit["numel"].get<int64_t>();
    moved += unit["stored_per_file"].get<int64_t>() != (numel + n - 1) / n ? 1 : 0;
    unit.erase("stored_per_file");
  }
  for (int r = 0; r < n; ++r) {
    for (auto& [name, tensor] : files[r]) {
      const int unit = unit_of(name);
      if (unit < 0) continue;
      const int64_t numel = manifest["flat_params"][unit]["numel"].get<int64_t>(), k = (numel + n - 1) / n;
      const int64_t begin = std::min<int64_t>(r * k, numel), end = std::min<int64_t>(begin + k, numel);
      tensor = at::cat(pieces[name]).narrow(0, begin, end - begin).clone();
    }
    fsdp::checkpoint::SafetensorsWriter writer(rank_file(dir, r, n), fsdp::checkpoint::layout_tensors(files[r]));
    for (const auto& [name, tensor] : files[r]) writer.write(name, tensor);
    writer.finish();
    auto& entry = manifest["files"][r];
    entry["bytes"] = writer.bytes_written();
    entry["crc32"] = writer.crc32();
    if (version == 1) {
      entry.erase("tensors");
    } else {
      entry["tensors"] = writer.tensor_crc32s();
    }
  }
  manifest["version"] = version;
  if (version == 1) manifest.erase("buffers");
  std::ofstream(dir + "/manifest.json") << manifest.dump(1);
  return moved;
}

// Checkpoints of versions 1 and 2, whose files hold ceil(numel / N) of each unit, load bit for bit
// at the N they were saved at (this build's shards start elsewhere: a model whose units' sizes are
// not multiples of 8 N, so that they do at N > 1). A version 1 file is checked whole when opened.
TEST(Checkpoint, LoadsVersionOneAndTwoCheckpoints) {
  auto world = fsdp::comm::init_world();
  const int n = world->size(), rank = world->rank();
  auto build = [&](uint64_t seed) {
    return make_from_toml("[model]\nname = \"gpt-test\"\ncontext = 8\ndim = 12\nheads = 2\nlayers = 2\n", world, seed);
  };
  for (int version : {1, 2}) {
    const std::string root = test_dir(world, "version" + std::to_string(version));
    fresh_dir(world, root);
    ModelUnderTest s = build(5);
    train_steps(s, world, 1);
    const std::string dir =
        fsdp::checkpoint::save_checkpoint(root, *s.sharded.state, s.optimizer.get(), {1, "gpt-test", ""});
    const at::Tensor saved = everything(s);
    if (rank == 0) {
      const int moved = rewrite_as_version(dir, version);
      if (n > 1) EXPECT_GT(moved, 0) << "no unit's slices moved at N = " << n << ": the test would see nothing";
    }
    world->barrier()->wait();
    ModelUnderTest loaded = build(6);
    fsdp::checkpoint::load_checkpoint(dir, *loaded.sharded.state, loaded.optimizer.get());
    EXPECT_TRUE(torch::equal(everything(loaded), saved)) << "version " << version << " at N = " << n;
    if (version == 2) continue;

    // A flipped byte in a tensor a weights-only load does not use still fails that file's check.
    const std::string file0 = rank_file(dir, 0, n);
    if (rank == 0) flip_byte(file0, first_byte_of(file0, "p0.exp_avg"));
    world->barrier()->wait();
    ModelUnderTest weights_only = build(6);
    const std::string refusal =
        refusal_of([&] { fsdp::checkpoint::load_checkpoint(dir, *weights_only.sharded.state, nullptr); });
    if (rank == 0) EXPECT_NE(refusal.find("'" + file0 + "' fails its checksum"), std::string::npos) << refusal;
  }
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
        const at::Tensor want =
            path == file + ".bf16" ? expected[name].to(at::kBFloat16).to(at::kFloat) : expected[name];
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

// import_weights writes each weight's values into the shards as it reads them, so it holds one
// weight's temporaries beside the shards, not a second copy of them all (kept, until 2026-12-06,
// until every rank had read its own). Inputs: a Llama whose embedding and head are 65,536 x 512
// (128 MiB each in fp32, units of their own) and one small block, exported, then imported into a
// fresh build. At N ranks a rank's shards are 2 tables / N; a second copy is that much more. Each
// range read is mapped and unmapped on its own (SafetensorsFile::read_range), whatever earlier
// tests left in the heap: until 2026-12-06 glibc served 32 MiB reads from free heap chunks where
// earlier tests had left 90 MiB or more, and two reads stayed resident (2.03 tables / N on one or
// two of the 4 ranks, 3 of 6 runs in a fresh clone; 0 of 8 since). Bound: the import's peak resident growth stays
// under one table / N, the largest range it reads (64 MiB at most: read 16 M values at a time),
// plus half a table / N (2026-12-06: 1.03-1.06 tables / N; with 48 MiB tables 1.08-1.13 alone,
// 2.1 after the other tests on rank 0, when a range could land in the heap; with the copy, 3.2;
// once above a quarter's margin at N = 4 among the other tests). The values are the export's,
// compared after.
TEST(HfWeights, ImportHoldsOneWeightAtATimeNotASecondCopyOfTheShards) {
  auto world = fsdp::comm::init_world();
  const std::string root = test_dir(world, "hf-import-memory");
  fresh_dir(world, root);
  auto build = [&](uint64_t seed) {
    auto config = fsdp::train::parse_train_config(
        "[model]\nname = \"llama-test\"\nvocab = 65536\ncontext = 64\ndim = 512\nheads = 4\nkv_heads = 4\n"
        "layers = 1\nffn_hidden = 256\n",
        "import memory test");
    config.seed = seed;
    return fsdp::train::build_sharded_model(config, 65536, world);
  };
  const std::string file = root + "/llama.safetensors";
  std::map<std::string, at::Tensor> expected;
  {
    fsdp::train::ShardedModel source = build(5);
    for (auto& [name, tensor] : source.state->full_parameters()) expected[name] = tensor;
    fsdp::checkpoint::export_weights(*source.state, source.config, file);
  }
  world->barrier()->wait();
  fsdp::train::ShardedModel target = build(6);
  const int64_t table_bytes = 65536LL * 512 * 4;
  const int64_t largest_read = std::min<int64_t>(table_bytes / world->size(), int64_t{4} << 24);
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
  const int64_t baseline = fsdp::testing::status_bytes("VmRSS:");
  fsdp::checkpoint::import_weights(*target.state, target.config, file);
  const int64_t growth = fsdp::testing::status_bytes("VmHWM:") - baseline;
  const int n = world->size();
  std::printf("importing: peak resident growth %.1f MiB; a table / N %.1f MiB\n", growth / 1048576.0,
              table_bytes / n / 1048576.0);
  EXPECT_LT(growth, largest_read + table_bytes / n / 2);
  for (auto& [name, tensor] : target.state->full_parameters()) {
    EXPECT_TRUE(torch::equal(tensor, expected.at(name))) << name;
  }
}

// A weight transformers saved 4-bit otherwise than the NF4 base stores it (here without double
// quantization, bitsandbytes' default; the base keeps it) is refused before any value is read:
// nothing of the model changes, though the embedding, read first, holds other values in the file.
TEST(HfWeights, AFourBitWeightQuantizedOtherwiseIsRefusedBeforeAnyValueIsRead) {
  auto world = fsdp::comm::init_world();
  const std::string root = test_dir(world, "hf-nf4-refused");
  fresh_dir(world, root);
  // The weights' source: the same Llama without adapters (its export is the base's files).
  auto build = [&](uint64_t seed, bool qlora) {
    auto config = fsdp::train::parse_train_config(
        std::string("[model]\nname = \"llama-test\"\n") +
            (qlora ? "[lora]\nrank = 4\ntargets = \"all-linear\"\nbase_dtype = \"nf4\"\n" : ""),
        "nf4 refusal test");
    config.seed = seed;
    return fsdp::train::build_sharded_model(config, 256, world);
  };
  const std::string file = root + "/other.safetensors", four_bit = root + "/four-bit.safetensors";
  {
    fsdp::train::ShardedModel source = build(11, false);
    fsdp::checkpoint::export_weights(*source.state, source.config, file);
  }
  world->barrier()->wait();
  if (world->rank() == 0) {
    fsdp::checkpoint::SafetensorsFile plain(file);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    const std::string name = "model.layers.0.self_attn.q_proj.weight";
    for (const auto& info : plain.tensors()) {
      if (info.name != name) tensors.emplace_back(info.name, plain.read(info.name));
    }
    const at::Tensor weight = plain.read(name);
    const fsdp::shard::Nf4Weight q = fsdp::shard::quantize_nf4(weight.to(at::kBFloat16), 64, /*double_quant=*/false);
    const std::string state =
        nlohmann::json(
            {{"quant_type", "nf4"}, {"blocksize", 64}, {"dtype", "bfloat16"}, {"shape", weight.sizes().vec()}})
            .dump();
    at::Tensor state_bytes = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
    std::memcpy(state_bytes.data_ptr<uint8_t>(), state.data(), state.size());
    tensors.emplace_back(name, q.packed.reshape({-1, 1}));
    tensors.emplace_back(name + ".absmax", q.absmax);
    tensors.emplace_back(name + ".quant_map", at::tensor(std::vector<float>(fsdp::shard::nf4_code().begin(),
                                                                            fsdp::shard::nf4_code().end())));
    tensors.emplace_back(name + ".quant_state.bitsandbytes__nf4", state_bytes);
    fsdp::checkpoint::write_safetensors(four_bit, tensors);
  }
  world->barrier()->wait();
  fsdp::train::ShardedModel target = build(12, true);
  std::map<std::string, at::Tensor> before;
  for (auto& [name, tensor] : target.state->full_parameters()) before[name] = tensor;
  try {
    fsdp::checkpoint::import_weights(*target.state, target.config, four_bit);
    ADD_FAILURE() << "expected a refusal";
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report())
      EXPECT_NE(std::string(e.what()).find("no double quantization"), std::string::npos) << e.what();
  }
  for (auto& [name, tensor] : target.state->full_parameters())
    EXPECT_TRUE(torch::equal(tensor, before.at(name))) << name;
}

}  // namespace checkpoint_test
