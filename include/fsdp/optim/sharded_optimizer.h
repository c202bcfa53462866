// fsdp/optim/sharded_optimizer.h: optimizers that step on this rank's shards only.
//
// Each FlatParam's shard [shard_numel] fp32 is updated from its shard_grad with elementwise math,
// so a shard behaves exactly like the matching slice of the unsharded parameters would under
// libtorch's torch::optim optimizers (the parity tests compare against them). Per-parameter options
// (weight decay on or off) apply to the ranges of the shard that each parameter occupies.
// Optimizer state (AdamW's two moments, SGD's momentum) is [shard_numel] fp32 per FlatParam.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/optim/adamw_kernel.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::optim {

// Which parameters get weight decay. Default: tensors of 2 or more dimensions (weights of linear
// layers and embeddings); biases and norm weights (1-D) get none, as in GPT-2 and Llama recipes.
using DecayFilter = std::function<bool(const std::string& name, const std::vector<int64_t>& shape)>;
bool decay_matrices_only(const std::string& name, const std::vector<int64_t>& shape);

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  DecayFilter decay = decay_matrices_only;
  // Fused: libtorch's kernel over every shard (at::_fused_adamw_, two calls: the ranges that take
  // weight decay, decayed inside the kernel, and the rest) instead of six element-wise passes per
  // shard; on the host that is libtorch's CPU kernel. Composed: torch::optim::AdamW bit for bit.
  // Empty (auto): fused where the shards are on a GPU, composed where they are in host memory (CPU
  // runs and CPU offload), so that a CPU run reproduces torch::optim::AdamW.
  std::optional<AdamWKernel> kernel = std::nullopt;
};

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double weight_decay = 0.0;
  DecayFilter decay = decay_matrices_only;
};

class ShardedOptimizer {
 public:
  virtual ~ShardedOptimizer() = default;
  virtual void step() = 0;
  // The step unless `skip` ([1] float32 on the shards' device) holds 1: the gradient norm's verdict,
  // computed on the device. The fused AdamW kernel reads the flag itself, so the host issues the
  // step without waiting for backward and the norm's all-reduce; the other updates read it here (a
  // host read: free on the CPU, a wait on a GPU). The step is counted either way: a caller that
  // learns afterwards that it was skipped calls uncount_step() before the next one.
  virtual void step_unless(const at::Tensor& skip);
  // Takes back the count of the last step_unless, which the caller learned was skipped: once, before
  // the next step or a save. Throws std::logic_error where no step_unless is there to take back
  // (called twice, after step(), or before any step): a caller's bug, not a state to guess.
  void uncount_step();
  void zero_grad() { state_.zero_grad(); }
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  // Bytes of optimizer state on this rank.
  virtual int64_t state_bytes() const = 0;

  // For checkpoints. Slot i is the i-th trainable FlatParam; each of its state tensors is
  // [shard_numel] fp32, named by state_names() (AdamW: exp_avg, exp_avg_sq; SGD: momentum).
  virtual const char* name() const = 0;
  virtual std::vector<std::string> state_names() const = 0;
  // Materialises state not created yet (zeros, which steps exactly as "none yet" does).
  virtual at::Tensor& state_tensor(size_t slot, size_t which) = 0;
  size_t slot_count() const { return slots_.size(); }
  shard::FlatParam* flat_of_slot(size_t slot) const { return slots_[slot].flat; }
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t steps) {
    step_count_ = steps;
    uncountable_ = false;
  }

 protected:
  explicit ShardedOptimizer(runtime::FsdpState& state, double lr, const DecayFilter& decay);
  // One trainable FlatParam with the ranges of its shard that take weight decay.
  struct Slot {
    shard::FlatParam* flat;
    std::vector<std::pair<int64_t, int64_t>> decay_ranges;  // (shard offset, length), merged
  };
  runtime::FsdpState& state_;
  std::vector<Slot> slots_;
  double lr_;
  int64_t step_count_ = 0;  // steps taken (AdamW's bias correction counts them)
  // Counts a step; `by_step_unless`: one uncount_step may take it back.
  void count_step(bool by_step_unless) {
    ++step_count_;
    uncountable_ = by_step_unless;
  }

 private:
  bool uncountable_ = false;  // the last count was a step_unless's, not taken back yet
};

class ShardedAdamW final : public ShardedOptimizer {
 public:
  ShardedAdamW(runtime::FsdpState& state, AdamWOptions options);
  // Building the optimizer from module parameters is a mistake once they are sharded: this says so.
  ShardedAdamW(const std::vector<at::Tensor>& module_parameters, AdamWOptions options);
  void step() override;
  void step_unless(const at::Tensor& skip) override;
  int64_t state_bytes() const override;
  const char* name() const override { return "adamw"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  at::Tensor& state_tensor(size_t slot, size_t which) override {
    return which == 0 ? exp_avg_[slot] : exp_avg_sq_[slot];
  }
  // Moments of slot i ([shard_numel] fp32 each), for checkpoints and tests.
  const at::Tensor& exp_avg(size_t i) const { return exp_avg_[i]; }
  const at::Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_[i]; }

 private:
  bool fused() const;  // whether options_.kernel, or auto for these shards' device, says fused
  // The fused update, skipped by the kernel itself where `skip` (may be undefined) holds 1.
  // step() (skip undefined) and the fused step_unless: counted, the shard gradients waited for, then
  // the fused kernel (which skips where skip holds 1) or the composed passes.
  void update(const at::Tensor& skip);
  void step_fused(const at::Tensor& skip);
  void step_composed();
  AdamWOptions options_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<at::Tensor> fused_steps_;  // [1] float32 beside each slot's shard: the fused kernel's step counts
  // [largest shard numel] fp32 beside the shards: the composed step's sqrt(v) term. Made at the
  // first composed step, so the fused (CUDA) path never holds it.
  at::Tensor denominator_scratch_;
};

class ShardedSgd final : public ShardedOptimizer {
 public:
  ShardedSgd(runtime::FsdpState& state, SgdOptions options);
  void step() override;
  int64_t state_bytes() const override;
  const char* name() const override { return "sgd"; }
  std::vector<std::string> state_names() const override;
  at::Tensor& state_tensor(size_t slot, size_t which) override;

 private:
  SgdOptions options_;
  std::vector<at::Tensor> momentum_;
};

// Scales every gradient shard so that the global L2 norm (over all ranks' shards) is at most
// max_norm, as torch::nn::utils::clip_grad_norm_ does on unsharded gradients. Collective.
// Returns the norm before clipping. A norm that is not finite (NaN or inf: some gradient is)
// leaves every gradient untouched, and the caller must skip the optimizer step (see
// nonfinite_guard.h): the norm comes from an all-reduce, so every rank sees the same value and
// takes the same decision.
double clip_grad_norm(runtime::FsdpState& state, double max_norm);
// The same without reading the norm: a 0-d fp64 tensor on the shards' device, and the scaling by
// min(1, max_norm / (norm + 1e-6)) (1 for a norm that is not finite) done there, as PyTorch's
// clip_grad_norm_ does, so the host does not wait for backward. Every gradient shard is multiplied,
// by exactly 1 when the norm is within max_norm (the same bits as not multiplying).
at::Tensor clip_grad_norm_tensor(runtime::FsdpState& state, double max_norm);

// The global L2 norm of the gradients, without clipping. Collective; the time this thread waits
// for the all-reduce counts as exposed communication (FsdpState::comm_stats).
double grad_norm(runtime::FsdpState& state);
// The same, unread: a 0-d fp64 tensor on the shards' device (on a GPU the all-reduce is queued
// on the stream, and nothing waits for it on the host).
at::Tensor grad_norm_tensor(runtime::FsdpState& state);

// The skip flag for ShardedOptimizer::step_unless: [1] float32 on the norm's device, 1 where the
// norm (a grad_norm_tensor) is NaN or inf.
at::Tensor nonfinite_flag(const at::Tensor& norm);

}  // namespace fsdp::optim
