// fsdp/runtime/fully_shard.h: turn a torch::nn::Module into a fully sharded model.
//
//   auto model = fsdp::runtime::fully_shard(std::make_shared<Gpt>(cfg), world, options);
//   auto logits = model.forward(tokens);            // gathers, computes, frees unit by unit
//   loss.backward();                                 // gathers again, reduce-scatters gradients
//   optimizer.step();                                // steps on this rank's shards only
//
// Units. The wrap policy picks modules (every transformer block, say); each becomes a unit whose
// parameters are flattened into one FlatParam (two when it mixes trainable and frozen ones), and
// each rank keeps 1/N of it. Parameters in no unit form the root unit. Units do not nest: the
// outermost selected module wins.
//
// What a model must do (see fsdp/nn/hooks.h): call each module that may become a unit through
// fsdp::nn::call(block, x), not block->forward(x). A module selected as a unit but called
// directly would run on freed parameters. A unit that did not run in a forward is reported once
// on stderr (it may simply be unused, which is allowed).
// A parameter belongs to one unit; tied parameters (embedding and head) belong in the root.
// Every rank must use the same units in a step (as in PyTorch FSDP: the collectives must match).
//
// A unit's life in one training step (FULL_SHARD):
//   pre-forward   all-gather the shards into the unsharded buffer; parameters are views of it
//   post-forward  free that buffer (autograd's saved views stay, holding no memory); hook outputs
//   pre-backward  (hook on the unit's outputs) gather again; .grad become views of a flat buffer
//   post-backward (all its gradients accumulated) reduce-scatter, average, add into shard_grad
//   end of backward  finish pending reductions, run those of unused units, free what remains
// SHARD_GRAD_OP keeps parameters gathered from forward through backward. NO_SHARD keeps
// everything on every rank and all-reduces gradients. The root stays gathered from its forward
// until its backward.
//
// Overlap. Collectives run on the group's communication thread while this thread computes.
//   forward prefetch   a unit's pre-forward also issues the gathers of the K units that follow it
//                      in the order recorded on the previous forward (re-recorded when it changes)
//   backward prefetch  a unit's pre-backward issues the gather of the unit that follows it in the
//                      previous backward's order (the first backward guesses reverse forward order)
//   async reductions   a reduce-scatter is waited for only when the budget below is full, or at
//                      the end of backward (so every gradient is in shard_grad before the optimizer)
// Budget K = max_inflight: besides the unit computing (and the root, gathered all step), at most K
// unit buffers are alive: prefetched gathers plus reductions in flight. Gathered memory is
// therefore at most root + (K + 1) units in forward, and root (params and gradient) + (K + 2)
// units in backward, where the computing unit holds its parameters and its gradient.
// Prefetching changes no value: the same collectives on the same data, issued earlier.
//
// Mixed precision: gathers and compute in param_dtype (parameters become tensors of that dtype),
// gradients reduced in reduce_dtype, fp32 shards and optimizer state (see shard/flat_param.h).
// Activation checkpointing: each unit but the root recomputes its forward in backward
// (nn/checkpoint.h); its pre-backward gathers the parameters for the recomputation.
#pragma once

#include <torch/nn/module.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/nn/hooks.h"
#include "fsdp/shard/flat_param.h"

namespace fsdp::runtime {

// FullShard: parameters gathered for each use and freed after it (ZeRO-3).
// ShardGradOp: gathered in forward and kept until the end of backward (ZeRO-2).
// NoShard: replicated, gradients all-reduced (DDP).
// HybridShard: FullShard inside groups of shard_group_size ranks, replicated across the groups:
// gathers and reduce-scatters stay inside a group (one node's fast links), and each reduced
// gradient shard is then all-reduced across the replicas (HSDP).
enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard };
const char* to_string(ShardingStrategy strategy);
ShardingStrategy sharding_strategy_from_string(const std::string& name);  // "full_shard", ...

struct WrapPolicy {
  // Modules whose type name (torch::nn::Module::name(), e.g. "Block" for BlockImpl) is listed.
  std::vector<std::string> module_types;
  // Modules holding at least this many parameters (0: off).
  int64_t min_params = 0;
  // Modules at these paths, e.g. "blocks.0" (only with a model that is already built).
  std::vector<std::string> module_paths;

  bool empty() const { return module_types.empty() && min_params <= 0 && module_paths.empty(); }
  // Does the policy select `module` (at `path`, "" when not yet known)?
  bool selects(const torch::nn::Module& module, const std::string& path) const;
};

struct MixedPrecision {
  at::ScalarType param_dtype = at::kFloat;   // gather and compute: float32 or bfloat16
  at::ScalarType reduce_dtype = at::kFloat;  // gradient reduction: float32 or bfloat16
};

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  WrapPolicy wrap_policy;
  // Overwrite every rank's initial parameters with rank 0's. Off: verify they agree (checksum).
  bool sync_module_states = false;
  MixedPrecision mixed_precision;
  bool forward_prefetch = true;
  bool backward_prefetch = true;
  // K: unit buffers alive besides the computing unit's (prefetched gathers, reductions in flight).
  // 0: no prefetch, and every reduction is waited for at once.
  int max_inflight = 2;
  bool activation_checkpointing = false;  // every unit except the root
  // Keep freed unsharded buffers for reuse (shard/storage.h), up to the budget's peak:
  // 2 x root + (K + 2) x largest unit, in fp32 bytes. Off: every free returns memory to the OS.
  bool cache_buffers = true;
  // HybridShard only: S, the ranks of one shard group; S divides the world size N and there are
  // R = N / S replica groups. 0: the ranks of one node (the launcher's local world size).
  int shard_group_size = 0;
  // Where shards and gathered buffers live. Parameters built elsewhere (a model is built on the
  // CPU, block by block) move here as their unit is sharded, so the whole model never sits on the
  // device unsharded. A CUDA device needs a NCCL process group (comm/nccl_process_group.h).
  at::Device device = at::kCPU;
  // Sharded parameters, gradients and optimizer state in host memory, the optimizer step on the CPU
  // (shard/flat_param.h, set_cpu_offload). For a GPU device; on the CPU it only adds copies.
  bool cpu_offload = false;
};

// The process groups a model is sharded over. Shard group: ranks holding one copy of the model
// between them (gathers, reduce-scatters). Replicate group: the ranks holding the same shard in
// the other copies (HybridShard's gradient all-reduce); null when there is one copy.
// Ranks [k S, (k + 1) S) form shard group k, so a node's ranks share one when S divides its count.
struct ShardingGroups {
  comm::ProcessGroupPtr world;
  comm::ProcessGroupPtr shard;
  comm::ProcessGroupPtr replicate;
  int replica_index() const { return shard ? world->rank() / shard->size() : 0; }
};
// Collective over `world` (splits it for HybridShard). Throws if S does not divide N.
ShardingGroups make_sharding_groups(const comm::ProcessGroupPtr& world, const FsdpOptions& options);

// Per-rank memory, in bytes, as the runtime accounts it.
struct MemoryStats {
  int64_t sharded_param_bytes = 0;      // fp32 shards (the whole model under NO_SHARD)
  int64_t sharded_grad_bytes = 0;       // fp32 gradient shards
  int64_t gathered_bytes = 0;           // unsharded parameter and gradient buffers alive now
  int64_t peak_gathered_bytes = 0;      // their peak since the last reset_peak_memory()
  int64_t largest_unit_bytes = 0;       // largest non-root unit's gathered parameters (compute dtype)
  int64_t root_unit_bytes = 0;          // the root unit's gathered parameters (compute dtype)
  int64_t unsharded_param_bytes = 0;    // all parameters unsharded, without padding (for comparison)
};

// Where the runtime's collectives spent time, cumulative since construction.
struct CommStats {
  double exposed_seconds = 0;      // this thread blocked waiting for a gather or a reduction
  int64_t gathers = 0;             // all-gathers of units issued
  int64_t prefetched_gathers = 0;  // of which issued ahead of the unit's use
  int64_t reductions = 0;          // gradient reductions issued
};

class Unit;  // one FSDP unit; defined in src/runtime

// The runtime state behind a sharded model. Not a template: the typed wrapper below only forwards.
class FsdpState {
 public:
  FsdpState(std::shared_ptr<torch::nn::Module> root, comm::ProcessGroupPtr group, FsdpOptions options,
            std::vector<std::shared_ptr<Unit>> prebuilt_units);
  ~FsdpState();
  FsdpState(const FsdpState&) = delete;
  FsdpState& operator=(const FsdpState&) = delete;

  // Every rank of the job (the group fully_shard was given).
  const comm::ProcessGroupPtr& group() const { return group_; }
  // The ranks that hold one copy of the model between them (the world unless HybridShard).
  const comm::ProcessGroupPtr& shard_group() const { return groups_.shard; }
  // HybridShard: the ranks holding this rank's shard in the other replica groups; else null.
  const comm::ProcessGroupPtr& replicate_group() const { return groups_.replicate; }
  int replica_index() const { return groups_.replica_index(); }
  // Busy seconds of the collectives on every group above (world, shard, replicate), cumulative.
  double communication_seconds() const;
  const FsdpOptions& options() const { return options_; }
  torch::nn::Module& root_module() { return *root_; }

  // Every FlatParam (each unit's trainable and frozen ones), in unit order: the optimizer's view.
  std::vector<shard::FlatParam*> flat_params();
  std::vector<std::string> unit_names() const;

  // Gradient accumulation without synchronisation: while false, backward keeps the unsharded
  // gradients (a full model's worth at most) and reduces nothing; the next backward with true
  // reduces their sum once. The default (true) reduces each micro-batch into shard_grad.
  void set_requires_gradient_sync(bool sync) { gradient_sync_ = sync; }
  bool requires_gradient_sync() const { return gradient_sync_; }

  void zero_grad();  // zeroes shard_grad (and drops unsharded gradients kept without sync)
  // name -> full parameter, gathered from every rank. Collective: every rank must call it.
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();

  MemoryStats memory_stats() const;
  void reset_peak_memory();
  CommStats comm_stats() const { return comm_stats_; }
  // Unit names in the order the last forward (backward) ran them, as recorded for prefetching.
  std::vector<std::string> forward_order() const;
  std::vector<std::string> backward_order() const;

  // Step protocol, called by FullyShardedModule::forward around the root's forward.
  void pre_root_forward();
  void post_root_forward(const std::vector<at::Tensor>& outputs);

  // Internal: the units call these.
  void on_memory_changed();
  void on_pre_backward();
  void wait(const comm::WorkPtr& work);  // counts the blocked time as exposed communication
  void count_gather(bool prefetch);
  void record_forward(Unit* unit);
  void record_backward(Unit* unit);
  void prefetch_forward_after(Unit* unit);  // nullptr: from the start (the root's pre-forward)
  void prefetch_backward_after(Unit* unit);
  void on_reduce_issued(Unit* unit);

 private:
  void end_of_backward();
  void reshard_after_eval();
  int inflight() const;           // prefetched units not yet used + reductions in flight
  void finish_oldest_reduce();
  void prefetch_from(const std::vector<Unit*>& order, Unit* after, int depth);

  std::shared_ptr<torch::nn::Module> root_;
  comm::ProcessGroupPtr group_;
  ShardingGroups groups_;
  FsdpOptions options_;
  std::vector<std::shared_ptr<Unit>> units_;  // children in model order, then the root unit last
  bool gradient_sync_ = true;
  bool backward_callback_queued_ = false;
  std::vector<Unit*> forward_order_, backward_order_;        // recorded on the previous step
  std::vector<Unit*> forward_running_, backward_running_;    // being recorded in this step
  std::deque<Unit*> pending_reduces_;                        // reductions in flight, oldest first
  CommStats comm_stats_;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;
  int64_t unsharded_param_bytes_ = 0;
};

template <class ModuleT>
class FullyShardedModule {
 public:
  FullyShardedModule(std::shared_ptr<ModuleT> module, std::shared_ptr<FsdpState> state)
      : module_(std::move(module)), state_(std::move(state)) {}

  // Runs the root module's forward with the root unit's hooks.
  template <class... Args>
  auto forward(Args&&... args) {
    return fsdp::nn::call(module_, std::forward<Args>(args)...);
  }

  const std::shared_ptr<ModuleT>& module() const { return module_; }
  ModuleT* operator->() const { return module_.get(); }
  FsdpState& state() const { return *state_; }
  const std::shared_ptr<FsdpState>& state_ptr() const { return state_; }

 private:
  std::shared_ptr<ModuleT> module_;
  std::shared_ptr<FsdpState> state_;
};

// Wraps an already built model. Every rank must pass a model with the same structure; parameter
// values are checked (or broadcast, with sync_module_states). Throws if the model is wrapped.
std::shared_ptr<FsdpState> make_fsdp_state(std::shared_ptr<torch::nn::Module> root, comm::ProcessGroupPtr group,
                                           FsdpOptions options, std::vector<std::shared_ptr<Unit>> prebuilt = {});

template <class ModuleT>
FullyShardedModule<ModuleT> fully_shard(std::shared_ptr<ModuleT> model, comm::ProcessGroupPtr group,
                                        FsdpOptions options = {}) {
  auto state = make_fsdp_state(model, std::move(group), std::move(options));
  return FullyShardedModule<ModuleT>(std::move(model), std::move(state));
}

// Shards while building: `build()` constructs the model; each block it adds with
// fsdp::nn::push_block that the policy selects becomes a unit at once, so its full parameters
// are freed before the next block is built. Peak memory: about one block plus this rank's shards
// (plus the root's parameters, sharded last). Initial values equal an unsharded build's.
class BuildListener {
 public:
  BuildListener(const comm::ProcessGroupPtr& group, const FsdpOptions& options);
  std::vector<std::shared_ptr<Unit>> take_units();
  ~BuildListener();

 private:
  std::vector<std::shared_ptr<Unit>> units_;
  ShardingGroups groups_;
  std::unique_ptr<fsdp::nn::ScopedBlockBuiltListener> scope_;
};

template <class ModuleT, class Build>
FullyShardedModule<ModuleT> build_fully_sharded(comm::ProcessGroupPtr group, FsdpOptions options, Build&& build) {
  BuildListener listener(group, options);
  std::shared_ptr<ModuleT> model = build();
  auto state = make_fsdp_state(model, std::move(group), std::move(options), listener.take_units());
  return FullyShardedModule<ModuleT>(std::move(model), std::move(state));
}

}  // namespace fsdp::runtime
