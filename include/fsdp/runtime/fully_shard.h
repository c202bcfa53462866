// fsdp/runtime/fully_shard.h: turn a torch::nn::Module into a fully sharded model.
//
//   auto model = fsdp::runtime::fully_shard(std::make_shared<Gpt>(cfg), world, options);
//   auto logits = model.forward(tokens);            // gathers, computes, frees unit by unit
//   loss.backward();                                 // gathers again, reduce-scatters gradients
//   optimizer.step();                                // steps on this rank's shards only
//
// Units. The wrap policy (wrap_policy.h) picks modules (every transformer block, say; the token
// embedding and the output head); each becomes a unit whose parameters are flattened into one
// FlatParam (two when it mixes trainable and frozen ones), and each rank keeps 1/N of it.
// Parameters in no unit form the root unit. Units do not nest: the outermost selected module wins.
//
// What a model must do (see fsdp/nn/hooks.h): call each module that may become a unit through
// fsdp::nn::call(block, x), not block->forward(x). A module selected as a unit but called
// directly would run on freed parameters. A unit that did not run in a forward is reported once
// on stderr (it may simply be unused, which is allowed). A unit may be called several times in
// one forward. A parameter belongs to one unit: a parameter shared by two units, or by a unit and
// the root, is refused with both paths named (tie it inside one module that is called for both
// uses, as models::TokenEmbedding does for a tied embedding and head).
// Every rank must use the same units in a step (as in PyTorch FSDP: the collectives must match).
//
// The life of a unit in a step is in src/runtime/unit.h; prefetching and the memory budget in
// src/runtime/prefetch_scheduler.h. SHARD_GRAD_OP keeps parameters gathered from forward through
// backward. NO_SHARD keeps everything on every rank and all-reduces gradients. The root stays
// gathered from its forward until its backward.
// Prefetching changes no value: the same collectives on the same data, issued earlier.
//
// Module buffers (BatchNorm's running statistics, say) are replicated: moved to the device, made
// equal at construction (broadcast with sync_module_states, else verified), and after each
// training forward (grad mode on) rank 0's values are broadcast (as PyTorch DDP's
// broadcast_buffers does), so every rank holds the same buffers and checkpoints save one copy.
//
// Mixed precision: gathers and compute in param_dtype (parameters become tensors of that dtype),
// gradients reduced in reduce_dtype, fp32 shards and optimizer state (see shard/flat_param.h).
// Activation checkpointing: each block unit (added with push_block) recomputes its forward in backward
// (nn/checkpoint.h); its pre-backward gathers the parameters for the recomputation.
#pragma once

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <unordered_set>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/nn/hooks.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/sharding_groups.h"
#include "fsdp/runtime/wrap_policy.h"
#include "fsdp/shard/flat_param.h"
#include "fsdp/shard/host_heap.h"
#include "fsdp/shard/storage.h"

namespace fsdp::runtime {

// Per-rank memory, in bytes, as the runtime accounts it.
struct MemoryStats {
  int64_t sharded_param_bytes = 0;    // fp32 shards (the whole model under NO_SHARD)
  int64_t sharded_grad_bytes = 0;     // fp32 gradient shards
  int64_t gathered_bytes = 0;         // unsharded parameter and gradient buffers alive now
  int64_t peak_gathered_bytes = 0;    // their peak since the last reset_peak_memory()
  int64_t largest_unit_bytes = 0;     // largest non-root unit's gathered parameters (compute dtype)
  int64_t root_unit_bytes = 0;        // the root unit's gathered parameters (compute dtype)
  int64_t unsharded_param_bytes = 0;  // all parameters unsharded, without padding (for comparison)
};

// Where the runtime's collectives spent time, cumulative since construction.
struct CommStats {
  double exposed_seconds = 0;      // this thread blocked waiting for a gather or a reduction (host time)
  int64_t gathers = 0;             // all-gathers of units issued
  int64_t prefetched_gathers = 0;  // of which issued ahead of the unit's use
  int64_t gathered_bytes = 0;      // bytes the gathers delivered to this rank (padded buffers, wire dtype)
  int64_t reductions = 0;          // gradient reductions issued
  // HybridShard: all-reduces of reduced gradient shards across replicas (each issued with its
  // reduce-scatter, while backward computes on).
  int64_t replica_reductions = 0;
};

class Unit;               // one FSDP unit (src/runtime/unit.h)
class PrefetchScheduler;  // gathers and reductions under the budget (src/runtime/prefetch_scheduler.h)

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
  // Exposed communication, cumulative: the seconds this thread blocked in wait()
  // (CommStats::exposed_seconds) and the seconds the device streams stood still in the waits it
  // queued there (ProcessGroup::stream_wait_seconds, every group above). On the host the first is
  // all of it; on a GPU with NCCL a wait blocks nothing and the second is.
  double exposed_seconds() const;
  const FsdpOptions& options() const { return options_; }
  torch::nn::Module& root_module() { return *root_; }

  // Every FlatParam (each unit's trainable and frozen ones), in unit order: the optimizer's view.
  std::vector<shard::FlatParam*> flat_params();
  std::vector<std::string> unit_names() const;
  // The units whose backward recomputes their forward (activation checkpointing), in model order,
  // and how many units are blocks that could be.
  std::vector<std::string> recomputed_unit_names() const;
  int checkpointable_units() const;

  // Gradient accumulation without synchronisation: while false, backward keeps the unsharded
  // gradients (a full model's worth at most) and reduces nothing; the next backward with true
  // reduces their sum once. The default (true) reduces each micro-batch into shard_grad.
  void set_requires_gradient_sync(bool sync) { gradient_sync_ = sync; }
  bool requires_gradient_sync() const { return gradient_sync_; }

  void zero_grad();  // zeroes shard_grad (and drops the parameters' gradients kept without sync)
  // name -> full parameter, gathered from every rank. Collective: every rank must call it.
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();

  MemoryStats memory_stats() const;
  void reset_peak_memory();
  CommStats comm_stats() const { return comm_stats_; }
  // Unit names in the order the last forward (backward) ran them, as recorded for prefetching.
  std::vector<std::string> forward_order() const;
  std::vector<std::string> backward_order() const;

  // Throws std::logic_error naming the unit when `what` (an error from the model's forward) says a
  // tensor's data was not allocated: a unit run outside fsdp::nn::call, on freed parameters.
  void explain_forward_failure(const std::string& what) const;

  // Step protocol, called by FullyShardedModule::forward around the root's forward.
  void pre_root_forward();
  void post_root_forward(const std::vector<at::Tensor>& outputs);

  // Internal: the units call these.
  void on_memory_changed();
  void on_unit_released();  // a unit freed its gathered parameters (FsdpOptions::host_heap_trim_allowance)
  void on_pre_backward();
  // Waits, counting the exposed time: blocked here, or a device stream's stand-still (NCCL).
  void wait(const comm::WorkPtr& work);
  void count_gather(bool prefetch, int64_t bytes);
  void count_reduction() { ++comm_stats_.reductions; }
  void count_replica_reduction() { ++comm_stats_.replica_reductions; }
  PrefetchScheduler& scheduler() { return *scheduler_; }

 private:
  // Construction, in order: the options' own checks; the units build_fully_sharded made while the
  // model was built; the outermost modules the wrap policy selects among the rest (refusing a
  // policy that names what the model lacks, or selects nothing); their units, in model order, then
  // the root's; the buffer cache sized for them.
  void check_options() const;
  std::unordered_map<const torch::nn::Module*, std::string> module_paths() const;  // every module's path
  void adopt_prebuilt_units(std::vector<std::shared_ptr<Unit>> prebuilt);
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> select_modules(bool any_prebuilt) const;
  void make_units(const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& selected);
  void size_buffer_cache();
  void check_parameter_ties();
  void end_of_backward();
  void reshard_after_eval();
  // Buffers: moved to the device and made equal at construction; rank 0's broadcast after each
  // training forward.
  void prepare_buffers();
  void sync_buffers();
  // A per-group figure summed over world, shard and replicate, each group once.
  double sum_over_groups(double (comm::ProcessGroup::*figure)() const) const;

  std::shared_ptr<torch::nn::Module> root_;
  comm::ProcessGroupPtr group_;
  ShardingGroups groups_;
  FsdpOptions options_;
  std::vector<std::shared_ptr<Unit>> units_;  // children in model order, then the root unit last
  std::unique_ptr<PrefetchScheduler> scheduler_;
  bool gradient_sync_ = true;
  bool backward_callback_queued_ = false;
  std::vector<at::Tensor> buffers_;  // the root's buffers (BatchNorm statistics, ...)
  CommStats comm_stats_;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;
  int64_t unsharded_param_bytes_ = 0;
  std::optional<shard::HeapGrowthGuard> heap_guard_;  // on the CPU, with a trim allowance
};

template <class ModuleT>
class FullyShardedModule {
 public:
  FullyShardedModule(std::shared_ptr<ModuleT> module, std::shared_ptr<FsdpState> state)
      : module_(std::move(module)), state_(std::move(state)) {}

  // Runs the root module's forward with the root unit's hooks. A unit the model called directly
  // (not through fsdp::nn::call) computes on freed parameters, which libtorch refuses ("data is
  // not allocated"): that error is rethrown naming the unit.
  template <class... Args>
  auto forward(Args&&... args) {
    try {
      return fsdp::nn::call(module_, std::forward<Args>(args)...);
    } catch (const c10::Error& e) {
      state_->explain_forward_failure(e.what());  // throws the clearer error, or returns
      throw;
    }
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
  std::unordered_set<const void*> owned_;  // parameters (TensorImpl) the units above hold
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
