// fsdp-plan's arithmetic: the shares of model state, the strategies' communication, DeepSpeed's
// published estimate reproduced, and bad input named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "fsdp/models/registry.h"
#include "fsdp/plan/memory_plan.h"
#include "fsdp/plan/plan_fit.h"
#include "fsdp/train/config.h"
#include "fsdp/train/planning.h"
#include "fsdp/train/sharded_model.h"

namespace plan_tests {

using fsdp::plan::make_plan;
using fsdp::plan::parse_bytes;
using fsdp::plan::PlanInput;

PlanInput llama70b(int ranks, const std::string& strategy) {
  PlanInput in;
  in.model = fsdp::models::model_config("llama3-70b");
  in.model_name = "llama3-70b";
  in.ranks = ranks;
  in.strategy = fsdp::enum_from_name<fsdp::runtime::ShardingStrategy>(strategy);
  in.seq_len = 4096;
  return in;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}
std::string error_of(const PlanInput& in) {
  return error_of([&] { make_plan(in); });
}

TEST(Plan, EmbeddingAndHeadAsUnitsOfTheirOwn) {
  PlanInput in = llama70b(8, "full_shard");
  const auto units = make_plan(in);
  in.embedding_units = false;
  const auto in_root = make_plan(in);
  const int64_t vocab_dim = 128256LL * 8192;  // Llama 3 70B: untied embedding and head
  EXPECT_EQ(units.embedding_params, vocab_dim);
  EXPECT_EQ(units.head_params, vocab_dim);
  EXPECT_FALSE(units.tied_embedding);
  EXPECT_EQ(in_root.root_params, units.root_params + 2 * vocab_dim);
  EXPECT_EQ(units.largest_unit_params, vocab_dim);  // 1.05 B: more than a block (0.86 B)
  const int64_t block = in_root.largest_unit_params;
  // fp32, K = 2: 2 x root + 2 x the largest unit (computing: parameters and gradient) + K x
  // max(block, head) in flight + the computing unit's gradient packed for its reduction, against
  // 2 x root + (K + 3) x block with both in the root.
  EXPECT_EQ(units.memory.gathered,
            4 * (2 * units.root_params + 2 * vocab_dim + 2 * std::max(block, vocab_dim) + vocab_dim));
  EXPECT_LT(units.memory.gathered, in_root.memory.gathered);
  // All-gathers: every block twice (forward and backward), the root once, the embedding once (a
  // lookup's backward reads no weights), the head twice for whole logits and once through the
  // chunked loss (whose backward reads none either).
  const double p = static_cast<double>(units.parameters), root = static_cast<double>(units.root_params);
  const double v = static_cast<double>(vocab_dim);
  ASSERT_EQ(in.loss_chunk_tokens, 0);
  EXPECT_NEAR(units.comm.all_gather, 4 * (2 * (p - root - 2 * v) + v + 2 * v + root) * 7 / 8, 1e3);
  in.embedding_units = true;
  in.loss_chunk_tokens = 1024;
  EXPECT_NEAR(make_plan(in).comm.all_gather, 4 * (2 * (p - root - 2 * v) + v + v + root) * 7 / 8, 1e3);
}

// The gathered peak per case, as the runtime reaches it (the sample in Unit::post_backward: the
// computing unit's parameters, autograd's gradients and their packed reduction input, beside the
// K = 2 buffers in flight of PrefetchScheduler). Each case was wrong before 2026-12-07 (measured by
// bench/plan_vs_measured.py: alone +34%, no_shard +200%, shard_grad_op -7%, bf16 -13.5%).
TEST(Plan, GatheredFollowsTheRuntimeInEachCase) {
  PlanInput in = llama70b(8, "full_shard");
  in.embedding_units = false;  // one block is the largest unit; the root holds the embedding and head
  const auto fp32 = make_plan(in);
  const int64_t root = fp32.root_params, b = fp32.largest_unit_params, p = fp32.parameters;
  // bf16 compute, fp32 reduction: one prefetched gather (2 B) and one pending reduction (4 B).
  PlanInput bf16 = in;
  bf16.param_dtype = at::kBFloat16;
  EXPECT_EQ(make_plan(bf16).memory.gathered, 2 * (2 * root + 3 * b) + 4 * b + 4 * b);
  EXPECT_EQ(make_plan(bf16).memory.reduced, 0) << "the first fp32 reduce-scatter writes the gradient shard";
  // Without prefetch both buffers in flight are pending reductions (the runtime still overlaps them).
  PlanInput serial = in;
  serial.prefetch = false;
  EXPECT_EQ(make_plan(serial).memory.gathered, 4 * (2 * root + 2 * b) + 4 * b + 2 * 4 * b);
  serial.micro_batches = 2;
  EXPECT_EQ(make_plan(serial).memory.reduced, 2 * 4 * ((std::max(root, b) + 7) / 8))
      << "accumulating: outputs of their own, each up to the largest shard (here the root's)";
  // Alone: packed into the gradient shard itself, reductions hold nothing; one prefetched gather.
  PlanInput alone = llama70b(1, "full_shard");
  alone.embedding_units = false;
  EXPECT_EQ(make_plan(alone).memory.gathered, 4 * (2 * root + 3 * b));
  EXPECT_EQ(make_plan(alone).memory.reduced, 0);
  // SHARD_GRAD_OP, bf16 over fp32: every unit gathered, the computing one's gradients and packed
  // input, and the pending reduction's fp32 input outliving its unit's bf16 parameters.
  PlanInput sgo = llama70b(8, "shard_grad_op");
  sgo.embedding_units = false;
  sgo.param_dtype = at::kBFloat16;
  EXPECT_EQ(make_plan(sgo).memory.gathered, 2 * p + (2 + 4) * b + (4 - 2) * b);
  // NO_SHARD: autograd's gradients of the unit computing (reduced in place in the gradient shard);
  // accumulating, its packed buffer and K pending ones too.
  PlanInput replicated = llama70b(8, "no_shard");
  replicated.embedding_units = false;
  EXPECT_EQ(make_plan(replicated).memory.gathered, 4 * b);
  replicated.micro_batches = 2;
  EXPECT_EQ(make_plan(replicated).memory.gathered, (2 + 2) * 4 * b);
  // Micro-batches that do not each reduce: every unit's gradients kept unsharded until the last,
  // whose reductions are the step's first (fp32: into the gradient shards, no outputs of their own).
  replicated.sync_each_micro_batch = false;
  EXPECT_EQ(make_plan(replicated).memory.gathered, 4 * p);
  PlanInput unsynced = in;
  unsynced.micro_batches = 2;
  unsynced.sync_each_micro_batch = false;
  // The last micro-batch's backward begins with every gradient held, the root and the first block
  // gathered, its packed input and the next block prefetched (bench/plan_vs_measured.py's no-sync run).
  EXPECT_EQ(make_plan(unsynced).memory.gathered, 4 * (p + root + b + b + b));
  EXPECT_EQ(make_plan(unsynced).memory.reduced, 0);
}

TEST(Plan, ModelStatesShareAsTheRuntimeShards) {
  PlanInput in = llama70b(8, "full_shard");
  in.embedding_units = false;  // the formulas below with embedding and head in the root
  const auto plan = make_plan(in);
  const int64_t p = fsdp::models::parameter_count(in.model);
  EXPECT_EQ(plan.parameters, p);
  EXPECT_EQ(plan.layers, 80);
  EXPECT_EQ(plan.root_params + 80 * plan.largest_unit_params, p);
  const int64_t shard = (p + 7) / 8;
  EXPECT_EQ(plan.memory.parameters, 4 * shard);
  EXPECT_EQ(plan.memory.gradients, 4 * shard);
  // Two moments, and AdamW's denominator scratch: the largest unit's shard (here the root, with
  // the embeddings and the head).
  const int64_t scratch = 4 * ((std::max(plan.root_params, plan.largest_unit_params) + 7) / 8);
  EXPECT_EQ(plan.memory.optimizer, 8 * shard + scratch);
  // fp32 gathers: 2 x root + (K + 2) x block, K = 2, and the computing block's gradient packed
  // for its reduction (in fp32 too: autograd's tensors are kept beside it).
  EXPECT_EQ(plan.memory.gathered, 4 * (2 * plan.root_params + 5 * plan.largest_unit_params));
  // The step's first fp32 reduce-scatter writes the gradient shard itself: no output of its own.
  // Accumulating micro-batches, K = 2 reduce-scatter outputs in flight, each the largest unit's
  // fp32 shard; none for NO_SHARD.
  EXPECT_EQ(plan.memory.reduced, 0);
  PlanInput accumulating = in;
  accumulating.micro_batches = 2;
  EXPECT_EQ(make_plan(accumulating).memory.reduced, scratch * 2);
  EXPECT_EQ(make_plan(llama70b(8, "no_shard")).memory.reduced, 0);
  // 70B at 16 bytes a parameter over 8 ranks: 141 GB of states each, more than 80 GB.
  PlanInput sized = in;
  sized.device_memory_bytes = parse_bytes("80GB");
  EXPECT_FALSE(make_plan(sized).fits);
  sized.cpu_offload = true;
  sized.param_dtype = at::kBFloat16;
  sized.activation_checkpointing = true;
  const auto offloaded = make_plan(sized);
  EXPECT_EQ(offloaded.memory.host_total, 16 * shard + scratch);
  EXPECT_LT(offloaded.memory.device_total(), offloaded.memory.host_total);
}

// Selective checkpointing, every k-th block of 80: activations fall between none and all, by the
// blocks recomputed (80 / k keep only their input), and the recomputed forward adds compute in
// proportion (a third of a block's for each).
TEST(Plan, ActivationCheckpointingEveryKthBlock) {
  PlanInput in = llama70b(8, "full_shard");
  in.compute_flops = 1e15;
  const auto none = make_plan(in);
  in.activation_checkpointing = true;
  const auto all = make_plan(in);
  in.activation_checkpointing_every = 2;
  const auto half = make_plan(in);
  in.activation_checkpointing_every = 80;
  const auto one = make_plan(in);
  EXPECT_LT(all.memory.activations, half.memory.activations);
  EXPECT_LT(half.memory.activations, none.memory.activations);
  // Every 80th: the last block only, which backward recomputes first, beside every other block's
  // saved activations: the peak is no lower than with none.
  EXPECT_NEAR(static_cast<double>(one.memory.activations), static_cast<double>(none.memory.activations),
              0.01 * static_cast<double>(none.memory.activations));
  // Every other block: half the way from all recomputed to none (the working blocks differ by one).
  const double all_bytes = static_cast<double>(all.memory.activations),
               none_bytes = static_cast<double>(none.memory.activations);
  EXPECT_NEAR(static_cast<double>(half.memory.activations), (all_bytes + none_bytes) / 2, 0.02 * none_bytes);
  EXPECT_NEAR(half.compute_seconds, none.compute_seconds * (1.0 + 0.5 / 3.0), 1e-9);
  EXPECT_NEAR(all.compute_seconds, none.compute_seconds * 4.0 / 3.0, 1e-9);
  in.activation_checkpointing_every = 0;
  EXPECT_THROW(make_plan(in), std::invalid_argument);
}

// checkpoint.async: a copy of what the rank writes, in host memory: the fp32 parameter shard and
// AdamW's two moments (12 bytes per parameter / S), SGD's one (8); nothing on the device.
TEST(Plan, AsyncCheckpointStagingIsTheRanksShardAndMoments) {
  PlanInput in = llama70b(8, "full_shard");
  const auto sync = make_plan(in);
  in.async_checkpoint = true;
  const auto async = make_plan(in);
  const int64_t shard = (async.parameters + 7) / 8;
  EXPECT_EQ(sync.memory.checkpoint_staging, 0);
  EXPECT_NEAR(static_cast<double>(async.memory.checkpoint_staging), 12.0 * static_cast<double>(shard), 12.0 * 8);
  EXPECT_EQ(async.memory.device_total(), sync.memory.device_total());
  in.optimizer = fsdp::optim::OptimizerKind::Sgd;
  EXPECT_NEAR(static_cast<double>(make_plan(in).memory.checkpoint_staging), 8.0 * static_cast<double>(shard), 8.0 * 8);
}

// A CPU run's process holds the device total and the host's share (data held, offloaded shards,
// async staging): its peak is their sum. On a GPU the peak is the device's, the data on the host.
TEST(Plan, ACpuRunsPeakIsTheWholeProcess) {
  PlanInput in = llama70b(8, "full_shard");
  in.data_bytes = 55LL << 20;
  const auto gpu = make_plan(in);
  EXPECT_EQ(gpu.memory.data, 55LL << 20);
  EXPECT_EQ(gpu.peak_bytes, gpu.memory.device_total());
  in.cpu = true;
  in.cpu_offload = true;
  in.async_checkpoint = true;
  const auto cpu = make_plan(in);
  EXPECT_GT(cpu.memory.host_total, 0);
  EXPECT_EQ(cpu.peak_bytes,
            cpu.memory.device_total() + cpu.memory.host_total + (55LL << 20) + cpu.memory.checkpoint_staging);
}

// fsdp-train's config keys decide the overhead: the measured CPU process and its heap's cache, or a GPU's
// round figure.
TEST(Plan, ProcessOverheadFollowsTheDevice) {
  fsdp::train::TrainConfig config = fsdp::train::parse_train_config("[model]\nname = \"gpt-tiny\"\n", "test.toml");
  EXPECT_EQ(fsdp::train::plan_input(config, 2).overhead_bytes,
            fsdp::plan::kCpuProcessOverheadBytes + fsdp::plan::kCpuHeapCacheBytes);
  EXPECT_TRUE(fsdp::train::plan_input(config, 2).cpu);
  config.device = c10::DeviceType::CUDA;
  EXPECT_EQ(fsdp::train::plan_input(config, 2).overhead_bytes, fsdp::plan::kGpuProcessOverheadBytes);
  EXPECT_FALSE(fsdp::train::plan_input(config, 2).cpu);
}

TEST(Plan, CommunicationPerStrategy) {
  PlanInput in = llama70b(16, "full_shard");
  in.embedding_units = false;
  in.ranks_per_node = 8;
  const auto full = make_plan(in);
  const double p = static_cast<double>(full.parameters), root = static_cast<double>(full.root_params);
  EXPECT_NEAR(full.comm.all_gather, 4 * (2 * (p - root) + root) * 15 / 16, 1e3);
  EXPECT_NEAR(full.comm.reduce_scatter, 4 * p * 15 / 16, 1e3);
  EXPECT_EQ(full.comm.all_reduce, 0);
  EXPECT_EQ(full.comm.across_nodes, full.comm.total());  // one group over two nodes

  in.strategy = fsdp::runtime::ShardingStrategy::HybridShard;  // S = 8 (a node), R = 2
  const auto hybrid = make_plan(in);
  EXPECT_EQ(hybrid.shard_ranks, 8);
  EXPECT_EQ(hybrid.replicas, 2);
  EXPECT_NEAR(hybrid.comm.reduce_scatter, 4 * p * 7 / 8, 1e3);
  EXPECT_NEAR(hybrid.comm.all_reduce, 2.0 * 4 * ((full.parameters + 7) / 8) / 2, 1e3);
  EXPECT_EQ(hybrid.comm.across_nodes, hybrid.comm.all_reduce);  // only the replica all-reduce crosses
  EXPECT_EQ(hybrid.memory.parameters, 4 * ((full.parameters + 7) / 8));

  in.strategy = fsdp::runtime::ShardingStrategy::NoShard;
  const auto ddp = make_plan(in);
  EXPECT_NEAR(ddp.comm.all_reduce, 2.0 * 4 * p * 15 / 16, 1e3);
  EXPECT_EQ(ddp.memory.parameters, 4 * full.parameters);

  // bf16 halves the gathers; checkpointing adds a third to compute.
  in.strategy = fsdp::runtime::ShardingStrategy::FullShard;
  in.compute_flops = 1e15;
  in.bandwidth_bytes = 1e11;
  const auto fp32 = make_plan(in);
  in.param_dtype = at::kBFloat16;
  in.activation_checkpointing = true;
  const auto bf16 = make_plan(in);
  EXPECT_EQ(bf16.comm.all_gather * 2, fp32.comm.all_gather);
  EXPECT_NEAR(bf16.compute_seconds, fp32.compute_seconds * 4.0 / 3.0, 1e-9);
  EXPECT_LT(bf16.memory.activations, fp32.memory.activations / 4);
  // float16 moves and keeps the same bytes as bfloat16 (loss scaling adds no buffer: it rescales in place).
  in.param_dtype = in.reduce_dtype = at::kHalf;
  const auto fp16 = make_plan(in);
  in.reduce_dtype = at::kBFloat16;
  in.param_dtype = at::kBFloat16;
  const auto bf16_both = make_plan(in);
  EXPECT_EQ(fp16.comm.all_gather, bf16_both.comm.all_gather);
  EXPECT_EQ(fp16.comm.reduce_scatter, bf16_both.comm.reduce_scatter);
  EXPECT_EQ(fp16.memory.device_total(), bf16_both.memory.device_total());
}

// DeepSpeed's documentation (memory.html, "ZeRO-3"): t5-3b, 2851M parameters, 32M largest layer,
// 1 node of 8 GPUs: per GPU 6.10 / 0.79 / 0.12 GB and per CPU 1.47 / 63.74 / 71.71 GB (its GB are
// GiB) for no offload / optimizer offload / optimizer and parameter offload.
TEST(Plan, DeepSpeedZero3EstimateMatchesItsDocumentation) {
  const auto estimates = fsdp::plan::deepspeed_zero3_estimate(2851000000LL, 32000000LL, 8, 1);
  ASSERT_EQ(estimates.size(), 3u);
  const double gib = 1 << 30;
  EXPECT_NEAR(estimates[0].gpu_bytes_per_rank / gib, 6.10, 0.02);
  EXPECT_NEAR(estimates[1].gpu_bytes_per_rank / gib, 0.79, 0.02);
  EXPECT_NEAR(estimates[2].gpu_bytes_per_rank / gib, 0.12, 0.02);
  EXPECT_NEAR(estimates[0].cpu_bytes_per_node / gib, 1.47, 0.05);
  EXPECT_NEAR(estimates[1].cpu_bytes_per_node / gib, 63.74, 0.05);
  EXPECT_NEAR(estimates[2].cpu_bytes_per_node / gib, 71.71, 0.05);
}

TEST(Plan, BadInputIsNamed) {
  PlanInput in = llama70b(12, "hybrid_shard");
  in.shard_group_size = 8;
  EXPECT_NE(error_of(in).find("12 ranks are not divisible by the shard group size 8"), std::string::npos);
  // Names are read where they are given (a config key, a flag): one declaration of each enum's.
  EXPECT_NE(error_of([] {
              fsdp::enum_from_name<fsdp::runtime::ShardingStrategy>("zero3");
            }).find("'zero3' (expected full_shard, shard_grad_op, no_shard or hybrid_shard)"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              fsdp::enum_from_name<at::ScalarType>("fp16");
            }).find("'fp16' (expected float32, bfloat16 or float16)"),
            std::string::npos);
  in = llama70b(8, "full_shard");
  in.param_dtype = at::kInt;  // a dtype the planner has no bytes for
  EXPECT_NE(error_of(in).find("param_dtype Int (expected float32, bfloat16 or float16)"), std::string::npos);
  in = llama70b(8, "full_shard");
  in.shard_group_size = 4;
  EXPECT_NE(error_of(in).find("hybrid_shard only"), std::string::npos);
  EXPECT_THROW(fsdp::models::model_config("llama-99b"), std::invalid_argument);

  EXPECT_EQ(parse_bytes("80GB"), 80000000000LL);
  EXPECT_EQ(parse_bytes("5GiB"), 5LL << 30);
  EXPECT_EQ(parse_bytes("512 MiB"), 512LL << 20);
  EXPECT_EQ(parse_bytes("1.5TB"), 1500000000000LL);
  for (const char* bad : {"80", "80G", "80gb", "GB", "8..0GB", "-5GB", "80 GBs"}) {
    EXPECT_THROW(parse_bytes(bad), std::invalid_argument) << bad;
  }
  try {
    parse_bytes("80");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("give a unit"), std::string::npos) << e.what();
  }
}

// QLoRA (--lora-base-dtype nf4): the blocks' linear weights are stored, gathered and sent as NF4
// with double quantization (4 bits, an 8-bit absmax code per 64 weights, an fp32 per 256 blocks:
// 0.5 + 1/64 + 4/16384 bytes a weight), everything else stays bf16. Llama 3 70B's blocks' linear
// weights are 68.5 B of its 70.6 B; the rest (embedding, head, norms) stays bf16.
TEST(Plan, QloraStoresTheBlocksLinearWeightsInNf4) {
  PlanInput in = llama70b(8, "full_shard");
  in.param_dtype = at::kBFloat16;
  in.seq_len = 2048;
  in.activation_checkpointing = true;
  fsdp::models::LoraSpec spec;
  spec.rank = 16;
  spec.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  std::get<fsdp::models::LlamaConfig>(in.model).lora = spec;
  const auto bf16 = make_plan(in);
  in.lora_base_dtype = fsdp::models::LoraBaseDtype::Nf4;
  const auto nf4 = make_plan(in);
  const auto& llama = std::get<fsdp::models::LlamaConfig>(in.model);
  const int64_t linear = fsdp::models::linear_weight_count(in.model);
  // q, k, v, o: 8192 x (8192 + 2 x 1024 + 8192); gate, up, down: 3 x 8192 x 28672; 80 layers.
  EXPECT_EQ(linear, 80LL * (8192LL * (8192 + 2 * 1024 + 8192) + 3LL * 8192 * 28672));
  EXPECT_EQ(llama.linear_weight_count(), linear);
  const double per_weight = 0.5 + 1.0 / 64 + 4.0 / (64 * 256);
  const int64_t p = bf16.parameters;
  // The base's shard: NF4 bytes for the linear weights, bf16 for the rest; the adapters unchanged.
  const double base_bf16 = 2.0 * p / 8, base_nf4 = (per_weight * linear + 2.0 * (p - linear)) / 8;
  EXPECT_NEAR(static_cast<double>(bf16.memory.parameters - nf4.memory.parameters), base_bf16 - base_nf4, 2.0);
  EXPECT_EQ(nf4.memory.gradients, bf16.memory.gradients);
  EXPECT_EQ(nf4.memory.optimizer, bf16.memory.optimizer);
  EXPECT_EQ(nf4.adapter_params, bf16.adapter_params);
  // The all-gather carries 0.516 bytes instead of 2 for every linear weight, twice a step
  // (forward and backward), 7/8 of it from the other ranks.
  EXPECT_NEAR(bf16.comm.all_gather - nf4.comm.all_gather, 2 * (2 - per_weight) * linear * 7 / 8, 1e6);
  // The seeds' question: 8 x 24 GB. A bf16 base does not fit, an NF4 base does.
  in.device_memory_bytes = fsdp::plan::parse_bytes("24GB");
  EXPECT_TRUE(make_plan(in).fits);
  in.lora_base_dtype = fsdp::models::LoraBaseDtype::BFloat16;
  EXPECT_FALSE(make_plan(in).fits);
  in.lora_base_dtype = fsdp::models::LoraBaseDtype::Auto;  // a run's config resolves it first
  EXPECT_NE(error_of(in).find("lora base dtype 'auto': resolve it"), std::string::npos);
}

// fsdp-plan follows the attention path the trainer takes (train.attention, "auto" resolved as the
// trainer resolves it): bf16 compute on the CPU attends in fp32 and keeps fp32 q, k, v and output
// per block; the composed path keeps the probabilities [heads, t, t] as well.
TEST(Plan, TheActivationsFollowTheAttentionPath) {
  const std::string vit = std::string(FSDP_SOURCE_DIR) + "/configs/vit-fashion-mnist.toml";
  auto activations = [&](const std::vector<std::string>& overrides) {
    const auto config = fsdp::train::load_train_config(vit, overrides);
    return make_plan(fsdp::train::plan_input(config, 2)).memory.activations;
  };
  const auto config = fsdp::train::load_train_config(vit);
  ASSERT_EQ(config.fsdp.param_dtype, at::kBFloat16);
  EXPECT_EQ(fsdp::train::attention_path_for(config), fsdp::models::AttentionPath::FusedFp32);
  EXPECT_EQ(fsdp::train::attention_path_for(fsdp::train::load_train_config(vit, {"fsdp.param_dtype=\"float32\""})),
            fsdp::models::AttentionPath::Fused);
  const int64_t automatic = activations({}), fused = activations({"train.attention=\"fused\""}),
                math = activations({"train.attention=\"math\""});
  // ViT: 6 blocks, 17 tokens, width 128, 64 images per rank: fp32 q, k, v and output of [64, 17, 128]
  // per block where the bf16 q, k and v are no longer kept, 16 - 3 x 2 bytes a channel (seven
  // blocks held at the peak: every block's and the last one's gradients).
  EXPECT_EQ(automatic - fused, 7 * (16 - 3 * 2) * 64 * 17 * 128);
  EXPECT_GT(math, fused);
}

}  // namespace plan_tests

namespace plan_tests {

// fsdp-plan knows CLIP: both towers' blocks as units (of two sizes), both embeddings as units, the
// rest (norms, projections, logit_scale) in the root; a frozen tower has no gradient or optimizer
// state; the loss's gathered features grow with the global batch; the tower wrap is refused.
TEST(Plan, ClipCountsBothTowersAndTheGatheredFeatures) {
  const std::string clip = std::string(FSDP_SOURCE_DIR) + "/configs/clip-fashion-mnist.toml";
  const auto config = fsdp::train::load_train_config(clip, {"fsdp.param_dtype=\"float32\""});
  const auto plan = make_plan(fsdp::train::plan_input(config, 2));
  const auto& model = std::get<fsdp::models::ClipConfig>(config.model);
  EXPECT_EQ(plan.parameters, model.parameter_count());
  EXPECT_EQ(plan.layers, 10) << "6 image blocks and 4 text blocks";
  torch::manual_seed(1);
  auto built = fsdp::models::build_model(config.model);
  auto named = built.module->named_parameters();
  int64_t root = 0;
  for (const auto& item : named) {
    if (item.key().find(".layers.") == std::string::npos && item.key().find(".embeddings.") == std::string::npos) {
      root += item.value().numel();
    }
  }
  EXPECT_EQ(plan.root_params, root) << "norms, projections and logit_scale";
  EXPECT_EQ(plan.embedding_params, named["text_model.embeddings.token_embedding.weight"].numel() +
                                       named["text_model.embeddings.position_embedding.weight"].numel());
  const int64_t shard = (plan.parameters + 1) / 2;
  EXPECT_EQ(plan.memory.gradients, 4 * shard);
  const auto frozen = make_plan(fsdp::train::plan_input(
      fsdp::train::load_train_config(clip, {"fsdp.param_dtype=\"float32\"", "model.freeze_vision=true"}), 2));
  EXPECT_LT(frozen.memory.gradients, plan.memory.gradients / 2) << "the image tower holds most of clip-fmnist";
  EXPECT_EQ(frozen.memory.parameters, plan.memory.parameters) << "a frozen tower is still stored";
  const auto larger_batch = make_plan(fsdp::train::plan_input(
      fsdp::train::load_train_config(clip, {"fsdp.param_dtype=\"float32\"", "train.global_batch=256"}), 2));
  EXPECT_GT(larger_batch.memory.activations, 2 * plan.memory.activations);
  try {
    fsdp::train::plan_input(fsdp::train::load_train_config(clip, {"fsdp.wrap=\"tower\""}), 2);
    ADD_FAILURE() << "fsdp.wrap = tower should be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is not modelled"), std::string::npos) << e.what();
  }
}

}  // namespace plan_tests

namespace plan_tests {

using fsdp::plan::fit_plans;
using fsdp::plan::FitRequest;
using fsdp::plan::FitSetting;

// Llama 3 70B with LoRA rank 16 on 8 GPUs, bf16 compute, round rates (the fit ranks by time).
FitRequest llama70b_lora_fit(int64_t memory_bytes) {
  FitRequest r;
  r.base = llama70b(8, "full_shard");
  r.base.param_dtype = at::kBFloat16;
  fsdp::models::LoraSpec lora;
  lora.rank = 16;
  lora.targets = fsdp::models::linear_layers(r.base.model);
  *fsdp::models::mutable_lora_spec(r.base.model) = lora;
  r.base.compute_flops = 400e12;
  r.base.bandwidth_bytes = 150e9;
  r.memory_bytes = memory_bytes;
  return r;
}

// --fit: every plan it keeps fits, best first; the one it recommends is a plan make_plan makes of
// those settings; what is fixed stays; offload, whose host copies cost time, only where needed.
TEST(PlanFit, KeepsOnlyPlansThatFitFastestFirst) {
  FitRequest r = llama70b_lora_fit(parse_bytes("24GB"));
  const auto result = fit_plans(r);
  ASSERT_FALSE(result.fitting.empty());
  EXPECT_GT(result.searched, static_cast<int64_t>(result.fitting.size())) << "some plans do not fit 24 GB";
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    EXPECT_LE(result.fitting[i].peak_bytes, r.memory_bytes);
    if (i > 0) EXPECT_LE(result.fitting[i - 1].rank_seconds, result.fitting[i].rank_seconds);
  }
  const auto& best = result.fitting.front();
  EXPECT_EQ(make_plan(best.plan.input).memory.device_total(), best.peak_bytes);
  EXPECT_FALSE(best.plan.input.cpu_offload) << "a plan without offload fits: its copies cost time";
  EXPECT_GT(make_plan(r.base).memory.device_total(), r.memory_bytes) << "the user's own settings do not fit";

  r.fixed = {FitSetting::Strategy, FitSetting::LossChunk};
  r.base.strategy = fsdp::runtime::ShardingStrategy::ShardGradOp;
  for (const auto& c : fit_plans(r).fitting) {
    EXPECT_EQ(c.plan.input.strategy, fsdp::runtime::ShardingStrategy::ShardGradOp);
    EXPECT_EQ(c.plan.input.loss_chunk_tokens, r.base.loss_chunk_tokens);
  }
}

// Where the user's settings fit and nothing is faster, they are the answer (each change costs 1%);
// where nothing fits, the smallest plan says by how much: checkpointing and offload on (with the
// shards on the host, the base's dtype no longer decides the device's share).
TEST(PlanFit, TheUsersSettingsWhenTheyFitTheSmallestWhenNothingDoes) {
  FitRequest r = llama70b_lora_fit(parse_bytes("1TB"));
  r.base.activation_checkpointing = true;
  const auto roomy = fit_plans(r);
  ASSERT_FALSE(roomy.fitting.empty());
  const PlanInput& chosen = roomy.fitting.front().plan.input;
  EXPECT_EQ(chosen.strategy, r.base.strategy);
  EXPECT_FALSE(chosen.activation_checkpointing) << "recomputing costs a third of the forward: off is faster";
  EXPECT_EQ(chosen.lora_base_dtype, r.base.lora_base_dtype);
  EXPECT_EQ(chosen.max_inflight, r.base.max_inflight);

  r.memory_bytes = parse_bytes("4GB");
  const auto tight = fit_plans(r);
  EXPECT_TRUE(tight.fitting.empty());
  EXPECT_GT(tight.smallest.peak_bytes, r.memory_bytes);
  EXPECT_TRUE(tight.smallest.plan.input.activation_checkpointing);
  EXPECT_TRUE(tight.smallest.plan.input.cpu_offload);
}

// The config keys --fit prints give a run that plans as the plan it chose: every fitting plan of a
// small LoRA Llama, its keys passed as --set overrides, read back through plan_input. And a key
// the config gives fixes its setting.
TEST(PlanFit, ItsConfigKeysPlanAsTheChosenPlan) {
  const std::string text =
      "[model]\nname = \"llama-tiny\"\n[train]\nglobal_batch = 8\nseq_len = 64\n[fsdp]\nparam_dtype = \"bfloat16\"\n"
      "[lora]\nrank = 4\ntargets = \"all-linear\"\nbase_dtype = \"bfloat16\"\n";
  const auto config = fsdp::train::parse_train_config(text, "fit.toml");
  FitRequest r;
  r.base = fsdp::train::plan_input(config, 2);
  r.base.compute_flops = 1e11;
  r.base.bandwidth_bytes = 2e9;
  r.memory_bytes = parse_bytes("1GiB");
  r.fixed = fsdp::train::fit_settings_given(config);
  EXPECT_EQ(r.fixed, std::set<FitSetting>{FitSetting::LoraBaseDtype}) << "lora.base_dtype is in the file";
  const auto result = fit_plans(r);
  ASSERT_GT(result.fitting.size(), 20u);
  for (const auto& c : result.fitting) {
    std::vector<std::string> overrides;
    for (const auto& [key, value] : fsdp::train::fit_config_values(c.plan.input, r.fixed)) {
      overrides.push_back(key + "=" + value);
    }
    const auto again = fsdp::train::plan_input(fsdp::train::parse_train_config(text, "fit.toml", overrides), 2);
    const PlanInput& want = c.plan.input;
    EXPECT_EQ(again.strategy, want.strategy);
    EXPECT_EQ(again.activation_checkpointing, want.activation_checkpointing);
    if (want.activation_checkpointing)
      EXPECT_EQ(again.activation_checkpointing_every, want.activation_checkpointing_every);
    EXPECT_EQ(again.micro_batches, want.micro_batches);
    EXPECT_EQ(again.micro_batch, want.micro_batch);
    EXPECT_EQ(again.max_inflight, want.max_inflight);
    EXPECT_EQ(again.loss_chunk_tokens, want.loss_chunk_tokens);
    EXPECT_EQ(again.lora_base_dtype, want.lora_base_dtype);
    EXPECT_EQ(make_plan(again).memory.device_total(), make_plan(want).memory.device_total());
  }
}

}  // namespace plan_tests
