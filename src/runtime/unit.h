// src/runtime/unit.h (private): one FSDP unit, the parameters of one wrapped module as one or two
// FlatParams (trainable, frozen), and its state across a training step.
//
// A unit's life in one step (FULL_SHARD):
//   pre-forward   all-gather the shards into the unsharded buffer; parameters are views of it
//   post-forward  free that buffer (autograd's saved views stay, holding no memory); hook outputs
//   pre-backward  (hook on the unit's outputs) gather again; .grad become views of a flat buffer
//   post-backward (every trainable gradient accumulated) reduce-scatter, average, add into shard_grad
//   inputs' post-backward (the module's backward for every call is over) free the frozen parameters
//   end of backward  finish pending reductions, run those of unused units, free what remains
// A unit may run several times in one forward (a block called twice, a tied embedding used as
// the head): it is gathered for each call, and its backward is over only after every call's.
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "fsdp/runtime/fully_shard.h"

namespace fsdp::runtime {

class Unit {
 public:
  // Flattens the parameters of `module` (but those in `excluded`) into this rank's shards.
  Unit(std::shared_ptr<torch::nn::Module> module, std::string name, bool is_root,
       const std::unordered_set<const void*>& excluded, const ShardingGroups& groups, const FsdpOptions& options);

  const std::string& name() const { return name_; }
  std::string trace_name() const;  // in profiler traces: the name, or "<root>"
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  const ShardingGroups& groups() const { return groups_; }
  bool is_root() const { return is_root_; }
  bool ran_forward() const { return forward_calls_ > 0; }
  bool ran_pre_backward() const { return pre_backward_ran_; }
  bool is_prefetched() const { return prefetched_; }
  // Whether this step's backward needs the parameters gathered: false when every call made with
  // grad mode on said its backward reads none (fsdp::nn::backward_reads_no_parameters: an
  // embedding lookup, the chunked loss head), and the unit then is not gathered again for backward.
  bool gathers_for_backward() const { return backward_reads_params_; }
  std::vector<shard::FlatParam*> flat_params() const;
  int64_t gathered_bytes() const;
  int64_t unsharded_param_bytes() const;

  // Gives the unit its final name and a back-pointer to its state, and installs the forward hooks.
  void adopt(FsdpState* state, const std::string& path);
  // A block that activation_checkpointing could recompute (not the root, not an embedding or head).
  bool checkpointable() const { return checkpointable_; }
  // Whether its backward recomputes its forward (FsdpOptions::activation_checkpointing_every picks).
  void set_activation_checkpointing(bool on);
  bool activation_checkpointing() const { return checkpointed_; }
  void release_hooks();

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);
  // At the end of forward: frees a unit no call's backward reads (SHARD_GRAD_OP kept it gathered
  // through forward, for a tied unit's second call).
  void release_if_backward_reads_none();
  // Returns whether any output will receive a gradient.
  bool register_pre_backward_hooks(const std::vector<at::Tensor>& outputs);
  void pre_backward();
  // Every trainable gradient is accumulated (or the backward ended): reduce them.
  void post_backward();

  // Reductions: issued by post_backward (HybridShard: the reduce-scatter and, right behind it,
  // the replica all-reduce); finish_reduce waits and adds into shard_grad.
  bool reduce_pending() const { return pending_reduce_ != nullptr; }
  void finish_reduce();

  void drop_grads();  // zero_grad: the parameters' unreduced gradients are forgotten
  void release_params();
  // Starts gathering this unit's parameters ahead of its use (no-op if gathered or in flight).
  void prefetch();
  void reset_step();
  void on_grad_ready();

 private:
  struct GradReadyHook;

  bool issue_gather(bool prefetch);
  void wait_gather();
  void release(shard::FlatParam& flat);
  void on_inputs_backward_done();
  void release_frozen_if_done();

  std::shared_ptr<torch::nn::Module> module_;
  std::string name_;
  bool is_root_;
  ShardingStrategy strategy_;
  bool checkpointable_ = false;  // a block (fsdp::nn::push_block), not the root
  bool checkpointed_ = false;    // activation checkpointing: each call's backward recomputes it
  void install_hooks();
  ShardingGroups groups_;
  FsdpState* state_ = nullptr;
  std::unique_ptr<shard::FlatParam> trainable_;
  std::unique_ptr<shard::FlatParam> frozen_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<comm::WorkPtr> pending_gathers_;  // gathers issued and not yet waited for
  bool prefetched_ = false;                     // gathered ahead of use, not used yet
  int forward_calls_ = 0;                       // calls in this step's forward
  int checkpointed_calls_ = 0;                  // of which recompute in backward (grad mode on)
  int hooked_input_calls_ = 0;                  // of which have their inputs' post-backward hooked
  int inputs_backward_done_ = 0;                // those post-backwards that ran
  bool pre_backward_ran_ = false;
  bool backward_reads_params_ = false;  // a grad-mode call this step whose backward reads them
  bool post_backward_done_ = false;
  size_t grads_ready_ = 0;
  comm::WorkPtr pending_reduce_;  // the reduce-scatter (or NO_SHARD all-reduce) in flight
  comm::WorkPtr replica_reduce_;  // HybridShard: the all-reduce across replicas, after pending_reduce_
};

}  // namespace fsdp::runtime
