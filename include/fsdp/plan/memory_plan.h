// fsdp/plan/memory_plan.h: "will it fit?" before renting the GPUs. Per-rank memory, bytes
// communicated and a step-time estimate for one training configuration, from the model's shapes
// and the runtime's own rules (what a unit gathers, when it frees, what the optimizer keeps).
//
// Memory per rank, in bytes (P parameters, S ranks sharing one copy, c and r the compute and
// reduce dtypes' sizes, K = max_inflight, B = the largest unit, root = parameters in no unit).
// With LoRA (A adapter parameters, base dtype b bytes): parameters b P / S + 4 A / S; gradients
// 4 A / S; optimizer 8 A / S; gathered as below without the frozen base's gradient buffers (one
// copy of the computing unit and of the root, not two); reductions of the adapters only.
//   parameters   4 P / S                 fp32 master shards (NO_SHARD: S = 1)
//   gradients    4 P / S                 fp32 gradient shards
//   optimizer    8 P / S (AdamW), 4 P / S (SGD with momentum)
//   gathered     FULL_SHARD, HYBRID_SHARD: c (2 root + 3 B) + r B + (K - 1) r B: the computing unit's
//                parameters, autograd's gradients and the reduction's input they are packed into (r
//                bytes an element, in every dtype, as FSDP2's reduce-scatter input), and of the K
//                buffers in flight one prefetched gather and K - 1 pending reductions (without
//                prefetch, K reductions: c (2 root + 2 B) + r B + K r B). Alone (N = 1, on the device)
//                nothing is packed beside the gradient and reductions hold nothing: c (2 root + 3 B)
//                (K = 0: 2 B), or c (root + (K + 1) B) in forward where larger; alone and offloaded,
//                an fp32 packed buffer (r = 4). With the token embedding (E parameters) and the
//                output head (H) as units of their own (embedding_units, the trainer's default), root
//                shrinks by E + H and the computing unit is the largest (L), the buffers in flight
//                max(B, H); tied (one unit T = E, used first and last, gathered with its gradient
//                through all of backward), 2 c T more. SHARD_GRAD_OP: c P + (c + r) B (every unit
//                stays gathered until its backward), plus (K - 1) (r - c) B where r > c (pending
//                reductions outlive their units' parameters). NO_SHARD: c B, autograd's gradients of
//                the unit computing (the first micro-batch reduces in place in the gradient shard;
//                later ones at N > 1 through a compute-dtype buffer each: (K + 2) c B). Micro-batches
//                that do not each reduce (train.sync_each_micro_batch = false) keep every unit's
//                autograd gradients until the last: its backward begins with c T (T the trainable
//                parameters) beside the root, the first unit (parameters and packed input) and the
//                next one prefetched, c (T + root + 2 B) + r B (SHARD_GRAD_OP c (T + P) + r B,
//                NO_SHARD c T), where that is above the peak above
//   reduced      K r B / S: reduce-scatter outputs (a unit's reduced gradient shard), up to K of them
//                in flight before each is added into the gradient shard; none where the reduction
//                writes the gradient shard itself (a step's first fp32 reduce-scatter on the device),
//                at N = 1 and for NO_SHARD; on the device even with CPU offload
//   activations  saved tensors of every block for one micro-batch and one block's gradients in
//                backward, or with activation checkpointing the block inputs plus one block
//                recomputed; the logits and loss: the family's terms (models::ModelFamily::
//                plan_activation_bytes; composed attention keeps the softmax output, a fused kernel
//                its log-sum-exp; a chunked loss one chunk's logits at a time)
//   overhead     the process itself (libtorch, communication library; a CUDA context on a GPU):
//                kGpuProcessOverheadBytes, or on the CPU kCpuProcessOverheadBytes plus the heap's
//                cache, kCpuHeapCacheBytes (both measured)
//   data         the training and validation data the rank holds in memory (host memory; token
//                files are memory-mapped and count 0). Evaluation runs a micro-batch at a time
//                without saved activations: below the training's activations, never a peak of its own
// With CPU offload the first three live in host memory and the device holds the rest.
// A run on the CPU (train.device = cpu) holds all of it in one process: its peak is the device
// total plus the host's (offloaded shards, data, async save staging), Plan::peak_bytes.
// checkpoint.async adds host memory while a save is in flight (checkpoint_staging): a copy of what
// the rank writes, its parameter shard (4 P / S, or with LoRA b P / S + 4 A / S) and its optimizer
// moments (8 or 4 bytes per trained parameter / S); pinned on a GPU, beside the training's own on a CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/models/lora_base_dtype.h"
#include "fsdp/models/registry.h"
#include "fsdp/optim/optimizer_kind.h"
#include "fsdp/runtime/dtype_names.h"
#include "fsdp/plan/workload_settings.h"
#include "fsdp/runtime/sharding_settings.h"

namespace fsdp::plan {

// The process's own memory: libtorch, the communication library and their heap, before any model
// or data. On a GPU, a CUDA context and NCCL's buffers (a round figure; --calibrate measures). On
// the CPU, a rank of fsdp-train under Open MPI as measured on the 2-core Debian VM with the pinned
// libtorch 2.11 (2026-12-05: 122-128 MiB at 2 ranks, resident before the data and the model).
constexpr int64_t kGpuProcessOverheadBytes = 512LL << 20;
constexpr int64_t kCpuProcessOverheadBytes = 128LL << 20;
// On the CPU the heap also keeps blocks training freed, for the next step (tcmalloc's thread and
// central caches and free pages, shard/host_heap.h): in three traced runs of the seven configs of
// configs/ at 2 ranks (2026-12-06), the resident peak stood 15-38 MiB (median 26) above the
// launch's resident memory plus the live bytes' growth. Part of a CPU run's overhead.
constexpr int64_t kCpuHeapCacheBytes = 24LL << 20;

// One configuration: the sharding settings (runtime/sharding_settings.h, as the runtime takes
// them; shard_group_size 0 is ranks_per_node here), the workload (plan/workload_settings.h: the
// optimizer, the batch and sequence, ...), the model and the machine.
struct PlanInput : runtime::ShardingSettings, WorkloadSettings {
  models::ModelConfig model;
  std::string model_name;
  int ranks = 1;           // N
  int ranks_per_node = 8;  // hybrid_shard's default S, and which all-reduce crosses nodes
  // The gathers prefetched as planned: without prefetch, 0. (The runtime then prefetches no gather
  // but still lets up to max_inflight reductions finish in the background: gathered and reduced
  // count their buffers.)
  int64_t prefetch_depth() const { return prefetch ? max_inflight : 0; }
  // Attention in fp32 for a lower-precision compute dtype (models::AttentionPath::FusedFp32):
  // its q, k, v and output are kept in fp32.
  bool attention_fp32 = false;
  // train.fused_ops: Llama's SwiGLU keeps its two inputs, not SiLU(gate) as well (models/fused_ops.h).
  bool fused_ops = true;
  int64_t device_memory_bytes = 0;                    // per rank; 0: not checked
  int64_t overhead_bytes = kGpuProcessOverheadBytes;  // the process's own memory
  bool cpu = false;                                   // train.device = cpu: one process holds device and host memory
  int64_t data_bytes = 0;                             // training and validation data held in memory, per rank
  double compute_flops = 0;                           // per rank, per second (0: no time estimate)
  double bandwidth_bytes = 0;                         // per rank inside a shard group, bytes/s (algorithm bandwidth)
  double inter_node_bandwidth_bytes = 0;              // per rank across nodes (0: same as bandwidth_bytes)
};

struct MemoryBreakdown {
  int64_t parameters = 0, gradients = 0, optimizer = 0, gathered = 0, reduced = 0, activations = 0, overhead = 0;
  int64_t data = 0;                // host memory: the data sets held (PlanInput::data_bytes)
  int64_t device_total() const;    // what the device holds (offloaded shards excluded)
  int64_t host_total = 0;          // offloaded shards (host memory), 0 without offload
  int64_t checkpoint_staging = 0;  // checkpoint.async: host memory while a save is in flight, 0 without
};

struct CommVolume {  // bytes sent per rank per optimizer step
  int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0, across_nodes = 0;
  int64_t total() const { return all_gather + reduce_scatter + all_reduce; }
};

struct Plan {
  PlanInput input;
  int64_t parameters = 0, largest_unit_params = 0, root_params = 0, layers = 0;
  int64_t adapter_params = 0;                      // LoRA: trainable adapters (the rest is the frozen base)
  int64_t trainable_params = 0;                    // what gets gradients and optimizer state (LoRA: the adapters)
  int64_t embedding_params = 0, head_params = 0;   // their own units (head 0 when tied); 0 when in the root
  int64_t other_units = 0, other_unit_params = 0;  // models::PlanUnits' others (a tower's embeddings)
  bool tied_embedding = false;
  int shard_ranks = 1, replicas = 1;  // S and R
  MemoryBreakdown memory;
  bool fits = true;
  int64_t headroom_bytes = 0;  // device memory - device total (negative: short by that much)
  CommVolume comm;
  double compute_seconds = 0, comm_seconds = 0;
  double step_seconds_overlapped = 0;  // max(compute, communication): prefetch hides all of it
  double step_seconds_serial = 0;      // compute + communication: nothing hidden
  double tokens_per_second = 0;        // per rank, at the overlapped estimate
  // What a rank's peak should be, as fsdp-train's report measures it: on a GPU the device total
  // (the caching allocator's peak reservation); on the CPU the process's resident peak, device
  // total + offloaded shards + data + async save staging.
  int64_t peak_bytes = 0;
};

// Throws std::invalid_argument naming the bad field (strategy, dtype, S not dividing N, ...).
Plan make_plan(const PlanInput& input);

// DeepSpeed's estimate_zero3_model_states_mem_needs (deepspeed/runtime/zero/stage3.py), the
// "all live" variant's inner formula: per-GPU and per-node CPU bytes of model states for ZeRO-3
// with fp16/bf16 training and Adam, given the total parameters and the largest layer's.
struct DeepSpeedEstimate {
  std::string offload;  // "none", "optimizer", "optimizer+params"
  int64_t gpu_bytes_per_rank = 0, cpu_bytes_per_node = 0;
};
std::vector<DeepSpeedEstimate> deepspeed_zero3_estimate(int64_t total_params, int64_t largest_layer_params,
                                                        int gpus_per_node, int nodes);
// DeepSpeed's "largest layer": the largest single module (embedding or linear), not a block.
int64_t largest_module_params(const models::ModelConfig& model);

// "80GB", "80 GiB", "512MiB", "1.5TB", "4096B": bytes. A unit is required (decimal kB..TB,
// binary KiB..TiB, B); anything else throws std::invalid_argument saying what was wrong.
int64_t parse_bytes(const std::string& text);

}  // namespace fsdp::plan
