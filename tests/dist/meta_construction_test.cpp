// fsdp-train --check constructs a config's model on the meta device (train/construction_check.h):
// what it builds must be what a run builds, unit for unit and shard for shard, or the check would
// vouch for a model no run makes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/compat.h"
#include "fsdp/models/registry.h"
#include "fsdp/shard/flat_param.h"
#include "fsdp/train/config.h"
#include "fsdp/train/construction_check.h"
#include "fsdp/train/sharded_model.h"
#include "process_memory.h"

namespace {

struct Case {
  const char* what;
  std::string toml;
};

// Models of three families, each under settings that shape the units: LoRA over an NF4 base with
// every second block recomputed, hybrid sharding (at an even rank count), shard_grad_op with a
// bf16 compute dtype.
std::vector<Case> cases(int ranks) {
  const std::string hybrid = ranks % 2 == 0 && ranks > 2 ? "strategy = \"hybrid_shard\"\nshard_group_size = 2\n" : "";
  return {
      {"llama-test, LoRA r4 over an NF4 base, every 2nd block recomputed",
       "[model]\nname = \"llama-test\"\nlayers = 4\n[fsdp]\nparam_dtype = \"bfloat16\"\nactivation_checkpointing = "
       "true\nactivation_checkpointing_every = 2\n[lora]\nrank = 4\ntargets = \"all-linear\"\nbase_dtype = \"nf4\"\n"},
      {"gpt-test, hybrid sharding where the ranks pair", "[model]\nname = \"gpt-test\"\n[fsdp]\n" + hybrid},
      {"vit-test, shard_grad_op in bf16",
       "[model]\nname = \"vit-test\"\n[fsdp]\nstrategy = \"shard_grad_op\"\nparam_dtype = \"bfloat16\"\n"},
  };
}

int64_t vocab_of(const fsdp::train::TrainConfig& config) {
  return fsdp::models::is_language_model(config.model) ? fsdp::models::vocab_size(config.model) : 0;
}

}  // namespace

// Under the guard every tensor made is meta, factories and torch::nn's parameters included (the
// dispatcher internals compat::MetaDeviceConstruction relies on); after it, tensors are the CPU's.
TEST(MetaConstruction, TheGuardMakesEveryTensorMetaWhileItLives) {
  {
    fsdp::compat::MetaDeviceConstruction on_meta;
    torch::nn::Linear linear(4096, 14336);
    EXPECT_TRUE(linear->weight.is_meta());
    EXPECT_TRUE(linear->bias.is_meta());
    EXPECT_TRUE(torch::ones({3}).is_meta());
    EXPECT_TRUE(torch::arange(8, torch::kFloat).cos().is_meta());
    EXPECT_TRUE(torch::empty({2}, at::TensorOptions().dtype(at::kBFloat16).pinned_memory(true)).is_meta());
    EXPECT_EQ(torch::zeros({2, 5}, at::kBFloat16).scalar_type(), at::kBFloat16);
  }
  // Nothing of it stays behind on the thread: CPU tensors compute (a guard that restored the key
  // sets by subtraction left Meta's backend bit, and every later op ran its meta kernel).
  EXPECT_TRUE(torch::ones({3}).device().is_cpu());
  EXPECT_TRUE(torch::nn::Linear(2, 2)->weight.device().is_cpu());
  EXPECT_EQ(at::tensor({5, 7}, at::kLong)[1].item<int64_t>(), 7);
  EXPECT_EQ((torch::ones({4}) * 3).sum().item<float>(), 12.0f);
}

// The same units, in the same order, with the same recomputed blocks; every FlatParam laid out
// alike (entries, padding, this rank's shard: numel and dtype, NF4 bytes included); the runtime's
// memory accounting equal. The meta build's shards hold no storage.
TEST(MetaConstruction, BuildsTheUnitsAndShardsARunBuilds) {
  auto world = fsdp::comm::init_world();
  for (const Case& c : cases(world->size())) {
    SCOPED_TRACE(c.what);
    const auto config = fsdp::train::parse_train_config(c.toml, "meta construction test");
    const auto real = fsdp::train::build_sharded_model(config, vocab_of(config), world);
    const auto meta = fsdp::train::construct_on_meta_device(config, vocab_of(config), world);
    EXPECT_EQ(meta.state->unit_names(), real.state->unit_names());
    EXPECT_EQ(meta.state->recomputed_unit_names(), real.state->recomputed_unit_names());
    const auto meta_flats = meta.state->flat_params(), real_flats = real.state->flat_params();
    ASSERT_EQ(meta_flats.size(), real_flats.size());
    for (size_t i = 0; i < real_flats.size(); ++i) {
      const auto &m = meta_flats[i]->layout(), &r = real_flats[i]->layout();
      ASSERT_EQ(m.entries.size(), r.entries.size()) << "flat " << i;
      for (size_t e = 0; e < r.entries.size(); ++e) {
        EXPECT_EQ(m.entries[e].name, r.entries[e].name);
        EXPECT_EQ(m.entries[e].shape, r.entries[e].shape) << r.entries[e].name;
      }
      EXPECT_EQ(m.padded_numel, r.padded_numel) << r.entries.front().name;
      EXPECT_EQ(m.shard_numel, r.shard_numel) << r.entries.front().name;
      EXPECT_EQ(meta_flats[i]->trainable(), real_flats[i]->trainable());
      EXPECT_EQ(meta_flats[i]->shard().numel(), real_flats[i]->shard().numel()) << r.entries.front().name;
      EXPECT_EQ(meta_flats[i]->shard().scalar_type(), real_flats[i]->shard().scalar_type()) << r.entries.front().name;
      EXPECT_TRUE(meta_flats[i]->shard().is_meta()) << r.entries.front().name;
    }
    const auto m = meta.state->memory_stats(), r = real.state->memory_stats();
    EXPECT_EQ(m.sharded_param_bytes, r.sharded_param_bytes);
    EXPECT_EQ(m.sharded_grad_bytes, r.sharded_grad_bytes);
    EXPECT_EQ(m.largest_unit_bytes, r.largest_unit_bytes);
    EXPECT_EQ(m.root_unit_bytes, r.root_unit_bytes);
    EXPECT_EQ(m.unsharded_param_bytes, r.unsharded_param_bytes);
    for (const auto& item : meta.model.module->named_parameters()) EXPECT_TRUE(item.value().is_meta()) << item.key();
  }
}

// At a real size the meta build holds nothing: Llama 3 8B (8.0 B parameters, 32 GB in fp32) with
// QLoRA's settings grows this process by under 64 MiB, and the check counts what the plan counts.
TEST(MetaConstruction, AnEightBillionParameterLlamaIsCheckedInNoMemory) {
  auto world = fsdp::comm::init_world();
  const auto config = fsdp::train::parse_train_config(
      "[model]\nname = \"llama3-8b\"\n[data]\nsource = \"token_files\"\ntrain_tokens = \"/nonexistent/train\"\n"
      "validation_tokens = \"/nonexistent/validation\"\n"
      "[train]\nglobal_batch = 12\nseq_len = 512\n[fsdp]\nparam_dtype = \"bfloat16\"\nactivation_checkpointing = "
      "true\n[lora]\nrank = 16\ntargets = \"all-linear\"\nbase_dtype = \"nf4\"\n",
      "meta construction test");
  const int64_t before = fsdp::testing::status_bytes("VmRSS:");
  const fsdp::train::ConstructionCheck check = fsdp::train::check_construction(config, world);
  const int64_t growth = fsdp::testing::status_bytes("VmRSS:") - before;
  EXPECT_GT(check.parameters, int64_t{8'000'000'000});
  EXPECT_TRUE(check.planned) << check.planned_why;
  EXPECT_TRUE(check.agrees()) << (check.disagreements.empty() ? "" : check.disagreements.front());
  ASSERT_FALSE(check.notes.empty());
  EXPECT_NE(check.notes.back().find("'/nonexistent/train' is not on this machine"), std::string::npos)
      << check.notes.back();
  EXPECT_LT(growth, int64_t{64} << 20) << "resident growth " << growth / 1048576.0 << " MiB";
}

// The comparison names what the plan counts otherwise (a formula that drifted from the model).
TEST(MetaConstruction, ACountThePlanGetsWrongIsNamed) {
  auto world = fsdp::comm::init_world();
  const auto config = fsdp::train::parse_train_config(
      "[model]\nname = \"llama-test\"\n[train]\nglobal_batch = 12\n[lora]\nrank = 4\ntargets = \"all-linear\"\n",
      "meta construction test");
  const fsdp::train::ConstructionCheck check = fsdp::train::check_construction(config, world);
  ASSERT_TRUE(check.agrees()) << check.disagreements.front();
  fsdp::plan::Plan off = check.plan;
  off.parameters += 1;
  off.layers += 1;
  const auto disagreements = fsdp::train::compare_with_plan(check, off);
  ASSERT_EQ(disagreements.size(), 2u);
  EXPECT_EQ(disagreements[0].rfind("parameters: built ", 0), 0u) << disagreements[0];
  EXPECT_EQ(disagreements[1].rfind("units (blocks", 0), 0u) << disagreements[1];
}
