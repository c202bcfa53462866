#include "fsdp/plan/memory_plan.h"

#include "fsdp/compat.h"
#include "fsdp/models/model_family.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace fsdp::plan {

namespace {

using runtime::ShardingStrategy;

// Bytes of a compute or reduction dtype (one of fsdp/runtime/dtype_names.h's).
int64_t dtype_bytes(at::ScalarType dtype, const char* field) {
  if (dtype == at::kFloat) return 4;
  if (dtype == at::kBFloat16 || dtype == at::kHalf) return 2;
  throw std::invalid_argument(std::string(field) + " " + c10::toString(dtype) + " (expected " +
                              enum_names_listed<at::ScalarType>() + ")");
}

}  // namespace

int64_t MemoryBreakdown::device_total() const {
  const int64_t states = parameters + gradients + optimizer;
  return (host_total > 0 ? 0 : states) + gathered + reduced + activations + overhead;
}

namespace {

// Everything wrong with the input that can be told before anything is computed; throws
// std::invalid_argument naming the field.
void check_plan_input(const PlanInput& in) {
  if (const std::string why = models::family_of(in.model).plan_refusal(in.model); !why.empty())
    throw std::invalid_argument(why);
  models::validate(in.model);
  if (in.ranks < 1) throw std::invalid_argument("ranks must be at least 1, got " + std::to_string(in.ranks));
  if (in.ranks_per_node < 1) throw std::invalid_argument("ranks per node must be at least 1");
  if (in.micro_batch < 1 || in.micro_batches < 1) throw std::invalid_argument("micro-batch sizes must be at least 1");
  if (in.seq_len < 1) throw std::invalid_argument("sequence length must be at least 1");
  if (in.max_inflight < 0) throw std::invalid_argument("max_inflight must be 0 or more");
  if (in.activation_checkpointing_every < 1)
    throw std::invalid_argument("activation_checkpointing_every must be 1 or more");
  if (in.shard_group_size < 0) throw std::invalid_argument("shard_group_size must be 0 or more");
  const int64_t c = dtype_bytes(in.param_dtype, "param_dtype"), r = dtype_bytes(in.reduce_dtype, "reduce_dtype");
  const ShardingStrategy s = in.strategy;
  if (s == ShardingStrategy::NoShard && (c != 4 || r != 4))
    throw std::invalid_argument("no_shard keeps float32 (as the runtime does)");
  if (in.activation_checkpointing_every < 1) {
    throw std::invalid_argument("activation checkpointing every " + std::to_string(in.activation_checkpointing_every) +
                                " blocks: it must be 1 or more");
  }
  if (in.shard_group_size != 0 && s != ShardingStrategy::HybridShard) {
    throw std::invalid_argument(std::string("a shard group size applies to hybrid_shard only (strategy is ") +
                                enum_name(s) + ")");
  }
}

// What every part of the plan reads: the dtypes, the sharding and the units' sizes (parameters).
struct PlanShape {
  const PlanInput* in = nullptr;
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int64_t c = 4, r = 4;  // bytes per compute and per reduce element
  int n = 1, shard = 1;  // N ranks; S, the ranks a unit is sharded over
  int64_t p = 0, layers = 0;
  int64_t block = 0;      // the largest block (models::PlanUnits)
  int64_t embedding = 0;  // the token embedding's unit, 0 without embedding units
  int64_t head = 0;       // the output head's unit, 0 when tied or without embedding units
  bool tied = false;
  int64_t other = 0;  // the other units' parameters together (models::PlanUnits), 0 without embedding units
  int64_t root = 0, largest_unit = 0, k = 0;
  int64_t shard_numel = 0, largest_unit_shard = 0;  // per rank: every parameter's shard, the largest unit's
};

// S and R, and the units (models::embedding_and_head_paths): recorded in the plan and returned.
PlanShape shape_of(const PlanInput& in, Plan& plan) {
  PlanShape x;
  x.in = &in;
  x.strategy = in.strategy;
  const ShardingStrategy s = x.strategy;
  x.c = dtype_bytes(in.param_dtype, "param_dtype");
  x.r = dtype_bytes(in.reduce_dtype, "reduce_dtype");
  x.n = in.ranks;
  x.shard = x.n;
  if (s == ShardingStrategy::NoShard) x.shard = 1;
  if (s == ShardingStrategy::HybridShard) {
    x.shard = in.shard_group_size > 0 ? in.shard_group_size : std::min(in.ranks_per_node, x.n);
    if (x.n % x.shard != 0) {
      throw std::invalid_argument(std::to_string(x.n) + " ranks are not divisible by the shard group size " +
                                  std::to_string(x.shard) + " (hybrid_shard needs N = R x S)");
    }
  }
  plan.shard_ranks = x.shard;
  plan.replicas = s == ShardingStrategy::NoShard ? x.n : x.n / x.shard;

  x.p = models::parameter_count(in.model);
  const models::PlanUnits units = models::family_of(in.model).plan_units(in.model);
  x.layers = units.layers;
  x.block = units.largest_block;
  plan.parameters = x.p;
  plan.layers = x.layers;
  // The token embedding and the output head, when units of their own (models::embedding_and_head_paths).
  if (in.embedding_units) {
    x.embedding = units.embedding;
    x.head = units.head;
    x.tied = units.tied;
    x.other = units.other_params;
    plan.other_units = units.other_units;
  }
  plan.embedding_params = x.embedding;
  plan.head_params = x.head;
  plan.tied_embedding = x.tied;
  plan.other_unit_params = x.other;
  // The other units together bound the largest of them (an image-text model's tower embeddings).
  x.largest_unit = std::max({x.block, x.embedding, x.head, x.other});
  plan.largest_unit_params = x.largest_unit;
  plan.root_params = x.p - units.all_blocks - x.embedding - x.head - x.other;
  x.root = plan.root_params;
  x.k = in.prefetch_depth();
  // ceil(p / S): each unit's shard is rounded up further to 8 elements (shard/shard_extent.h),
  // under 32 bytes a unit, not counted.
  x.shard_numel = (x.p + x.shard - 1) / x.shard;
  x.largest_unit_shard = (std::max(x.largest_unit, x.root) + x.shard - 1) / x.shard;
  return x;
}

// train.sync_each_micro_batch = false with micro-batches: gradients kept unsharded between them.
bool accumulates_unsharded(const PlanShape& x) { return x.in->micro_batches > 1 && !x.in->sync_each_micro_batch; }

// Whether a unit's reduction writes the gradient shard itself, with no reduce-scatter output of its
// own (shard::FlatParam::reduce_grad_async): alone (N = 1), and a step's first fp32 reduce-scatter,
// on the device (the only one when the micro-batches do not each reduce).
bool reduction_writes_gradient_shard(const PlanShape& x) {
  const PlanInput& in = *x.in;
  return !in.cpu_offload && (x.n == 1 || (x.r == 4 && (in.micro_batches == 1 || !in.sync_each_micro_batch)));
}

// Bytes an element of the reduction input a unit's gradients are packed into: the reduce dtype's;
// alone on the device none (the gradient shard itself), alone and offloaded an fp32 buffer.
int64_t packed_input_bytes(const PlanShape& x) { return x.n == 1 ? (x.in->cpu_offload ? 4 : 0) : x.r; }

// The peak of the runtime's gathered memory (its memory_stats, sampled in Unit::post_backward and
// measured by bench/plan_vs_measured.py). The unit computing in backward holds its parameters and
// autograd's gradients, and for a moment also the reduction's input they are packed into (r bytes
// an element, as FSDP2's reduce-scatter input; alone on the device, N = 1, they are packed into the
// gradient shard itself; alone and offloaded into an fp32 buffer). Of the K = max_inflight buffers in
// flight (PrefetchScheduler), with prefetch one is the next unit's gather and the others pending
// reductions, each holding its packed input; without prefetch all K are reductions. NO_SHARD reduces
// in place in the gradient shard; later micro-batches through a compute-dtype buffer each.
// SHARD_GRAD_OP keeps every unit gathered until its backward; a unit's pending reduction outlives
// its parameters.
int64_t gathered_peak_bytes(const PlanShape& x) {
  const PlanInput& in = *x.in;
  const ShardingStrategy s = x.strategy;
  const int64_t c = x.c, root = x.root, block = x.block, largest = x.largest_unit;
  const int64_t k = in.max_inflight, prefetched = x.k;  // reductions may use all K; gathers x.k (0: no prefetch)
  const int64_t pending = prefetched > 0 ? k - 1 : k;   // reductions in flight beside the computing unit
  const int64_t packed = packed_input_bytes(x);
  if (s == ShardingStrategy::NoShard) {
    // Autograd's gradients; accumulating at N > 1 also the packed buffer and K pending ones.
    return c * largest * (in.micro_batches > 1 && in.sync_each_micro_batch && x.n > 1 ? k + 2 : 1);
  }
  if (s == ShardingStrategy::ShardGradOp) {
    return c * x.p + (c + packed) * largest +
           std::max<int64_t>(0, pending) * std::max<int64_t>(0, packed - c) * largest;
  }
  auto in_flight = [&](int64_t unit) {
    return (prefetched > 0 ? c * unit : 0) + std::max<int64_t>(0, pending) * packed * unit;
  };
  int64_t backward = 0;
  if (x.tied) {
    // The tied unit (T = E, used first and last) gathered with its gradient through backward.
    backward = c * (2 * root + 2 * x.embedding + 2 * block) + packed * largest + in_flight(block);
  } else if (x.embedding > 0) {
    backward = c * (2 * root + 2 * largest) + packed * largest + in_flight(std::max(block, x.head));
  } else {
    backward = c * (2 * root + 2 * block) + packed * block + in_flight(block);
  }
  // Forward: the root and the unit computing with its prefetched units beside it, above backward's
  // peak only where no reduction buffers are held (alone, 3 and more prefetched).
  return std::max(backward, c * (root + (prefetched + 1) * largest));
}

// train.sync_each_micro_batch = false: the last micro-batch's backward begins with every unit's
// autograd gradients held (the trainable parameters, compute dtype), beside the first unit to reduce
// (its parameters and packed input), the root's and the tied unit's parameters and the next unit's
// prefetched gather; each later unit's reduction lets its own gradients go.
int64_t unsynced_peak_bytes(const PlanShape& x, int64_t trainable) {
  const int64_t c = x.c;
  if (x.strategy == ShardingStrategy::NoShard) return c * trainable;  // reduced in place in the gradient shard
  const int64_t parameters =
      x.strategy == ShardingStrategy::ShardGradOp
          ? c * x.p
          : c * (x.root + (x.tied ? x.embedding : 0) + x.largest_unit + (x.k > 0 ? std::max(x.block, x.head) : 0));
  return c * trainable + parameters + packed_input_bytes(x) * x.largest_unit;
}

// Model states per rank (parameters, gradients, optimizer state; on the host with CPU offload) and
// the gathered and reduced buffers the runtime holds at its peak. Returns the trainable parameters.
int64_t add_model_states(const PlanShape& x, Plan& plan) {
  const PlanInput& in = *x.in;
  const ShardingStrategy s = x.strategy;
  const int64_t r = x.r;
  MemoryBreakdown& mem = plan.memory;
  mem.parameters = 4 * x.shard_numel;
  // Only the parameters that train get gradients and optimizer state (a frozen tower's do not).
  // AdamW: two moments, and one fp32 scratch as large as the largest unit's shard (its denominator).
  const int64_t trainable = models::family_of(in.model).plan_trainable_params(in.model);
  const int64_t trainable_shard = (trainable + x.shard - 1) / x.shard;
  mem.gradients = 4 * trainable_shard;
  mem.optimizer = in.optimizer == optim::OptimizerKind::AdamW ? 8 * trainable_shard + 4 * x.largest_unit_shard
                                                              : 4 * trainable_shard;
  if (in.cpu_offload) mem.host_total = mem.parameters + mem.gradients + mem.optimizer;
  mem.gathered = accumulates_unsharded(x) ? std::max(gathered_peak_bytes(x), unsynced_peak_bytes(x, trainable))
                                          : gathered_peak_bytes(x);
  // Each pending reduction (up to K, prefetching or not) holds its output shard until it is added
  // into the gradient shard, except where it writes the gradient shard itself; alone and offloaded
  // the packed fp32 buffer is the output (counted in gathered).
  if (s != ShardingStrategy::NoShard && x.n > 1 && !reduction_writes_gradient_shard(x))
    mem.reduced = in.max_inflight * r * x.largest_unit_shard;
  return trainable;
}

// QLoRA: the blocks' linear weights stored, gathered and sent as NF4 with double quantization
// (shard/nf4_storage.h: 4 bits, an 8-bit absmax code per 64 weights, an fp32 per 256 x 64).
constexpr double kNf4BytesPerWeight = 0.5 + 1.0 / 64 + 4.0 / (64 * 256);

// LoRA: a frozen base (bf16, fp32, or NF4 linear weights) and trainable adapters replace the model
// states above. Returns the linear weights stored as NF4 (0 without QLoRA).
int64_t add_lora_states(const PlanShape& x, Plan& plan) {
  const PlanInput& in = *x.in;
  const models::LoraSpec* lora = models::lora_spec(in.model);
  if (lora == nullptr || !lora->enabled()) return 0;
  const ShardingStrategy s = x.strategy;
  const int64_t c = x.c, r = x.r, p = x.p, k = x.k, root = x.root, shard = x.shard, layers = x.layers;
  MemoryBreakdown& mem = plan.memory;
  if (in.lora_base_dtype == models::LoraBaseDtype::Auto) {
    throw std::invalid_argument("lora base dtype 'auto': resolve it (train::resolved_lora_base_dtype) before planning");
  }
  const int64_t adapters = models::family_of(in.model).plan_adapter_params(in.model);
  plan.adapter_params = adapters;
  // The frozen base per rank: bf16 or fp32 values; or (nf4) the blocks' linear weights in NF4
  // and the rest in bf16.
  const int64_t linear = in.lora_base_dtype == models::LoraBaseDtype::Nf4 ? models::linear_weight_count(in.model) : 0;
  const int64_t base_total = in.lora_base_dtype == models::LoraBaseDtype::Float32
                                 ? 4 * p
                                 : static_cast<int64_t>(std::ceil(kNf4BytesPerWeight * linear)) + 2 * (p - linear);
  const int64_t adapter_shard = (adapters + shard - 1) / shard;
  const int64_t per_layer_adapters = layers > 0 ? (adapters + layers - 1) / layers : adapters;
  mem.parameters = (base_total + shard - 1) / shard + 4 * adapter_shard;
  mem.gradients = 4 * adapter_shard;
  mem.optimizer = in.optimizer == optim::OptimizerKind::AdamW
                      ? 8 * adapter_shard + 4 * ((per_layer_adapters + shard - 1) / shard)
                      : 4 * adapter_shard;
  if (in.cpu_offload) mem.host_total = mem.parameters + mem.gradients + mem.optimizer;
  // The frozen base gathers no gradient buffer: one copy of the root and of the computing unit.
  if (runtime::regathers(s)) mem.gathered = c * (root + (k + 1) * x.largest_unit) + 2 * c * per_layer_adapters;
  // NF4: a block in flight holds its gathered bytes alone; its values are decoded (allocated) when
  // it runs, so only the computing block holds them (shard::FlatParam::unshard_async), beside its
  // own bytes while they are decoded. The embedding and the head are not NF4: one of them may be
  // in flight whole while a block computes, or compute while K blocks are in flight.
  if (linear > 0 && s != ShardingStrategy::NoShard) {
    const int64_t nf4_unit_bytes =
        static_cast<int64_t>(std::ceil(kNf4BytesPerWeight * linear / std::max<int64_t>(layers, 1)));
    if (runtime::regathers(s)) {
      const int64_t outer = std::max(x.embedding, x.head);
      mem.gathered = c * (root + std::max(x.block + (k > 0 ? outer : 0), outer)) + 2 * c * per_layer_adapters;
    }
    mem.gathered += (k + 1) * nf4_unit_bytes;
  }
  // The adapters' reductions, as the full model's (add_model_states); their packed inputs, small
  // beside a unit, are not counted in gathered.
  if (s != ShardingStrategy::NoShard && x.n > 1 && !reduction_writes_gradient_shard(x))
    mem.reduced = in.max_inflight * r * ((per_layer_adapters + shard - 1) / shard);
  return linear;
}

// checkpoint.async: what the rank writes, copied: its parameter shard and its optimizer moments
// (not AdamW's scratch).
void add_checkpoint_staging(const PlanShape& x, Plan& plan) {
  const PlanInput& in = *x.in;
  if (!in.async_checkpoint) return;
  MemoryBreakdown& mem = plan.memory;
  const int64_t trained = plan.adapter_params > 0 ? (plan.adapter_params + x.shard - 1) / x.shard : x.shard_numel;
  mem.checkpoint_staging = (plan.adapter_params > 0 ? mem.parameters : 4 * x.shard_numel) +
                           (in.optimizer == optim::OptimizerKind::AdamW ? 8 : 4) * trained;
}

// Blocks recomputed in backward: every k-th of them with activation checkpointing (layers / k).
int64_t recomputed_blocks(const PlanShape& x) {
  return x.in->activation_checkpointing ? x.layers / x.in->activation_checkpointing_every : 0;
}

// The activations a micro-batch keeps for backward at its peak (the family's terms).
int64_t activation_bytes(const PlanShape& x) {
  const PlanInput& in = *x.in;
  models::ActivationSettings settings;
  settings.seq_len = in.seq_len;
  settings.compute_bytes = x.c;
  settings.micro_batch = in.micro_batch;
  settings.ranks = x.n;
  settings.fused_attention = in.fused_attention;
  settings.fused_ops = in.fused_ops;
  settings.attention_fp32 = in.attention_fp32;
  settings.grouped_kv_repeated = in.cpu && !compat::cpu_fused_attention_takes_grouped_heads();
  settings.checkpointing = in.activation_checkpointing;
  settings.checkpointing_every = in.activation_checkpointing_every;
  settings.loss_chunk_tokens = in.loss_chunk_tokens;
  // Assumes a CUDA build with its kernels and native bf16 products; without either, the host's
  // fp32 chunk buffer runs and this term is low by 4 bytes a chunk's logit.
  settings.loss_rows_in_compute_dtype = !in.cpu && in.fused_ops;
  return models::family_of(in.model).plan_activation_bytes(in.model, settings);
}

// Bytes each rank sends per optimizer step; every micro-batch gathers and reduces.
void add_communication(const PlanShape& x, Plan& plan, int64_t linear, int64_t trainable) {
  const PlanInput& in = *x.in;
  const ShardingStrategy s = x.strategy;
  const int64_t c = x.c, r = x.r, p = x.p, root = x.root;
  const int n = x.n, shard = x.shard;
  const double in_group = shard > 1 ? static_cast<double>(shard - 1) / shard : 0.0;
  CommVolume& comm = plan.comm;
  const int64_t m = in.micro_batches;
  if (runtime::regathers(s)) {
    // Blocks twice (forward, backward), the root once. A lookup's backward reads no weights, nor
    // does the chunked loss's (fsdp::nn::backward_reads_no_parameters): the embedding unit is
    // gathered once, the head once when chunked and twice for whole logits, a tied unit once more
    // than its head (the lookup).
    const int64_t head_gathers = in.loss_chunk_tokens > 0 ? 1 : 2;
    const int64_t embedding_and_head = x.tied ? (head_gathers + 1) * x.embedding : x.embedding + head_gathers * x.head;
    comm.all_gather =
        static_cast<int64_t>(m * c * (2 * (p - root - x.embedding - x.head) + embedding_and_head + root) * in_group);
  } else if (s == ShardingStrategy::ShardGradOp) {
    comm.all_gather = static_cast<int64_t>(m * c * p * in_group);
  }
  if (linear > 0 &&
      s != ShardingStrategy::NoShard) {  // NF4 bytes instead of compute-dtype values, for each gather of a block
    const int gathers = s == ShardingStrategy::ShardGradOp ? 1 : 2;
    comm.all_gather -= static_cast<int64_t>(m * gathers * (c - kNf4BytesPerWeight) * linear * in_group);
  }
  const int64_t reduced_params = plan.adapter_params > 0 ? plan.adapter_params : trainable;  // LoRA: the adapters alone
  if (s == ShardingStrategy::NoShard) {
    comm.all_reduce = static_cast<int64_t>(m * 2.0 * r * reduced_params * (n - 1) / n);
  } else {
    comm.reduce_scatter = static_cast<int64_t>(m * r * reduced_params * in_group);
    if (plan.replicas > 1) {
      comm.all_reduce = static_cast<int64_t>(m * 2.0 * r * x.shard_numel * (plan.replicas - 1) / plan.replicas);
    }
  }
  // Which collectives cross nodes: a group wider than a node, or hybrid's replica all-reduce.
  const bool nodes_differ = n > in.ranks_per_node;
  if (nodes_differ) {
    if (s == ShardingStrategy::HybridShard) {
      comm.across_nodes = comm.all_reduce + (shard > in.ranks_per_node ? comm.all_gather + comm.reduce_scatter : 0);
    } else {
      comm.across_nodes = comm.total();
    }
  }
}

// Time: compute at the given rate (+1/3 for the recomputed forward), communication at the
// bandwidths (the slower one for bytes that cross nodes).
void add_step_time(const PlanShape& x, Plan& plan) {
  const PlanInput& in = *x.in;
  const int64_t layers = x.layers, recomputed = recomputed_blocks(x);
  const int64_t samples = in.micro_batch * in.micro_batches;
  const bool language = models::is_language_model(in.model);
  const double flops = models::flops_per_sample(in.model, in.seq_len) * samples * (language ? in.seq_len : 1) *
                       (1.0 + (layers > 0 ? static_cast<double>(recomputed) / layers : 0.0) / 3.0);
  if (in.compute_flops > 0) plan.compute_seconds = flops / in.compute_flops;
  if (in.bandwidth_bytes > 0) {
    const double inter = in.inter_node_bandwidth_bytes > 0 ? in.inter_node_bandwidth_bytes : in.bandwidth_bytes;
    plan.comm_seconds = static_cast<double>(plan.comm.total() - plan.comm.across_nodes) / in.bandwidth_bytes +
                        static_cast<double>(plan.comm.across_nodes) / inter;
  }
  plan.step_seconds_overlapped = std::max(plan.compute_seconds, plan.comm_seconds);
  plan.step_seconds_serial = plan.compute_seconds + plan.comm_seconds;
  if (plan.step_seconds_overlapped > 0) {
    plan.tokens_per_second = static_cast<double>(samples * (language ? in.seq_len : 1)) / plan.step_seconds_overlapped;
  }
}

}  // namespace

// A plan, part by part: the input checked, its shape (sharding, units), model states (or LoRA's),
// async save staging, activations, the peak, communication and step time.
Plan make_plan(const PlanInput& in) {
  check_plan_input(in);
  Plan plan;
  plan.input = in;
  const PlanShape x = shape_of(in, plan);
  const int64_t trainable = add_model_states(x, plan);
  const int64_t linear = add_lora_states(x, plan);
  plan.trainable_params = plan.adapter_params > 0 ? plan.adapter_params : trainable;  // as the reductions count
  add_checkpoint_staging(x, plan);
  MemoryBreakdown& mem = plan.memory;
  mem.activations = activation_bytes(x);
  mem.overhead = in.overhead_bytes;
  mem.data = in.data_bytes;
  const int64_t device = mem.device_total();
  plan.peak_bytes = in.cpu ? device + mem.host_total + mem.data + mem.checkpoint_staging : device;
  if (in.device_memory_bytes > 0) {
    plan.headroom_bytes = in.device_memory_bytes - device;
    plan.fits = plan.headroom_bytes >= 0;
  }
  add_communication(x, plan, linear, trainable);
  add_step_time(x, plan);
  return plan;
}

std::vector<DeepSpeedEstimate> deepspeed_zero3_estimate(int64_t total_params, int64_t largest_layer_params,
                                                        int gpus_per_node, int nodes) {
  // estimate_zero3_model_states_mem_needs with zero_init=True and additional_buffer_factor=1.5.
  const double total_gpus = static_cast<double>(gpus_per_node) * nodes, gpus_factor = 1.0 / nodes, buffer = 1.5;
  const double largest_layer_memory = 4.0 * static_cast<double>(largest_layer_params);
  const double p = static_cast<double>(total_params);
  std::vector<DeepSpeedEstimate> out;
  out.push_back({"none", static_cast<int64_t>(largest_layer_memory + 18.0 * p / total_gpus),
                 static_cast<int64_t>(static_cast<double>(largest_layer_params) * 4 * gpus_per_node * buffer)});
  out.push_back({"optimizer", static_cast<int64_t>(largest_layer_memory + 2.0 * p / total_gpus),
                 static_cast<int64_t>(p * 16 * gpus_factor * buffer)});
  out.push_back({"optimizer+params", static_cast<int64_t>(largest_layer_memory),
                 static_cast<int64_t>(p * 18 * gpus_factor * buffer)});
  return out;
}

int64_t largest_module_params(const models::ModelConfig& model) {
  return models::family_of(model).largest_module_params(model);
}

int64_t parse_bytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  size_t j = i;
  while (j < text.size() && text[j] == ' ') ++j;
  const std::string unit = text.substr(j);
  static const std::vector<std::pair<std::string, double>> units = {
      {"B", 1.0},   {"kB", 1e3},     {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  double scale = 0;
  for (const auto& [name, factor] : units) {
    if (unit == name) scale = factor;
  }
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1) {
    throw std::invalid_argument("memory '" + text + "': expected a number and a unit, e.g. 80GB or 5GiB");
  }
  if (scale == 0) {
    throw std::invalid_argument("memory '" + text +
                                "': " + (unit.empty() ? std::string("give a unit") : "unknown unit '" + unit + "'") +
                                " (B, kB, MB, GB, TB, or KiB, MiB, GiB, TiB; e.g. 80GB, 5GiB)");
  }
  const double bytes = std::stod(number) * scale;
  if (bytes > 9.0e18) throw std::invalid_argument("memory '" + text + "' is out of range");
  return static_cast<int64_t>(bytes);
}

}  // namespace fsdp::plan
