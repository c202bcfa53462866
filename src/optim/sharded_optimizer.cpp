#include "fsdp/optim/sharded_optimizer.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "fsdp/compat.h"
#include "fsdp/shard/storage.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace fsdp::optim {

bool decay_matrices_only(const std::string&, const std::vector<int64_t>& shape) { return shape.size() >= 2; }

ShardedOptimizer::ShardedOptimizer(runtime::FsdpState& state, double lr, const DecayFilter& decay)
    : state_(state), lr_(lr) {
  for (shard::FlatParam* flat : state.flat_params()) {
    if (!flat->trainable()) continue;  // frozen parameters have neither gradients nor optimizer state
    Slot slot{flat, {}};
    for (const shard::ShardSegment& segment : flat->layout().segments_of_shard(flat->shard_index())) {
      const shard::FlatEntry& entry = flat->layout().entries[segment.entry];
      if (!decay(entry.name, entry.shape)) continue;
      auto& ranges = slot.decay_ranges;
      if (!ranges.empty() && ranges.back().first + ranges.back().second == segment.shard_offset) {
        ranges.back().second += segment.length;
      } else {
        ranges.emplace_back(segment.shard_offset, segment.length);
      }
    }
    slots_.push_back(std::move(slot));
  }
}

void ShardedOptimizer::step_unless(const at::Tensor& skip) {
  if (skip.item<float>() == 1.0f) {
    count_step(/*by_step_unless=*/true);  // counted as step() would: the caller uncounts what it learns was skipped
    return;
  }
  step();
}

void ShardedOptimizer::uncount_step() {
  if (!uncountable_) {
    throw std::logic_error("ShardedOptimizer::uncount_step: no step_unless to take back (at step count " +
                           std::to_string(step_count_) + ": called twice, after step(), or before any step)");
  }
  --step_count_;
  uncountable_ = false;
}

ShardedAdamW::ShardedAdamW(runtime::FsdpState& state, AdamWOptions options)
    : ShardedOptimizer(state, options.lr, options.decay), options_(std::move(options)) {
  for (const Slot& slot : slots_) {
    // FSDP buffers (shard/storage.h): on the CPU, mapped outside the heap.
    const at::Tensor& shard = slot.flat->shard();
    exp_avg_.push_back(shard::empty_buffer(shard.numel(), at::kFloat, shard.device()).zero_());
    exp_avg_sq_.push_back(shard::empty_buffer(shard.numel(), at::kFloat, shard.device()).zero_());
  }
}

namespace {
runtime::FsdpState& refuse_module_parameters(const std::vector<at::Tensor>& parameters) {
  throw std::invalid_argument(
      "ShardedAdamW: built from " + std::to_string(parameters.size()) +
      " module parameters, but after fully_shard a module's parameters are views of freed buffers; build the "
      "optimizer from the sharded model's state: ShardedAdamW(model.state(), options)");
}
}  // namespace

ShardedAdamW::ShardedAdamW(const std::vector<at::Tensor>& module_parameters, AdamWOptions options)
    : ShardedAdamW(refuse_module_parameters(module_parameters), std::move(options)) {}

namespace {
// One fused call's tensor lists: views of shards and their gradients, moments and step counts.
struct FusedAdamWLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
};
}  // namespace

bool ShardedAdamW::fused() const {
  if (options_.kernel) return *options_.kernel == AdamWKernel::Fused;
  return !slots_.empty() && slots_.front().flat->shard().is_cuda();
}

void ShardedAdamW::step_fused(const at::Tensor& skip) {
  if (fused_steps_.empty()) {
    for (const Slot& slot : slots_) fused_steps_.push_back(at::zeros({1}, slot.flat->shard().options()));
  }
  // The kernel reads the step (for the bias corrections) and does not advance it: set it from the
  // global count every time, so a resumed run (or set_step_count) cannot leave it stale.
  for (at::Tensor& count : fused_steps_) count.fill_(static_cast<double>(step_count_));
  // Each shard cut at its decay ranges: those ranges in one call with the weight decay inside the
  // kernel (as torch.optim.AdamW(fused=True) applies it), the rest in another without, where a
  // decay pass of its own read and wrote every decayed parameter once more.
  FusedAdamWLists decayed, undecayed;
  auto add = [&](FusedAdamWLists& lists, size_t i, int64_t offset, int64_t length) {
    if (length == 0) return;
    lists.params.push_back(slots_[i].flat->shard().narrow(0, offset, length));
    lists.grads.push_back(slots_[i].flat->shard_grad().narrow(0, offset, length));
    lists.exp_avgs.push_back(exp_avg_[i].narrow(0, offset, length));
    lists.exp_avg_sqs.push_back(exp_avg_sq_[i].narrow(0, offset, length));
    lists.steps.push_back(fused_steps_[i]);  // one count per slot, read by each of its views
  };
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].flat->shard_grad().defined()) continue;  // no backward reached it yet
    int64_t done = 0;
    if (options_.weight_decay != 0) {
      for (const auto& [offset, length] : slots_[i].decay_ranges) {
        add(undecayed, i, done, offset - done);
        add(decayed, i, offset, length);
        done = offset + length;
      }
    }
    add(undecayed, i, done, slots_[i].flat->shard().numel() - done);
  }
  for (FusedAdamWLists* lists : {&decayed, &undecayed}) {
    if (lists->params.empty()) continue;
    compat::fused_adamw(lists->params, lists->grads, lists->exp_avgs, lists->exp_avg_sqs, lists->steps, lr_,
                        options_.beta1, options_.beta2, lists == &decayed ? options_.weight_decay : 0.0, options_.eps,
                        skip);
  }
}

void ShardedAdamW::step() { update(at::Tensor()); }

void ShardedAdamW::step_unless(const at::Tensor& skip) {
  if (!fused()) return ShardedOptimizer::step_unless(skip);  // the composed passes read the flag first
  update(skip);
}

void ShardedAdamW::update(const at::Tensor& skip) {
  torch::NoGradGuard no_grad;
  count_step(/*by_step_unless=*/skip.defined());
  for (const Slot& slot : slots_) slot.flat->wait_for_shard_grad();
  if (fused()) {
    step_fused(skip);
  } else {
    step_composed();
  }
}

// Same operations, in the same order, as torch::optim::AdamW (libtorch 1.13) on each element.
void ShardedAdamW::step_composed() {
  const double bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(step_count_));
  const double bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(step_count_));
  const double step_size = lr_ / bias_correction1;
  if (!denominator_scratch_.defined() && !slots_.empty()) {
    int64_t largest = 0;
    for (const at::Tensor& v : exp_avg_sq_) largest = std::max(largest, v.numel());
    denominator_scratch_ = shard::empty_buffer(largest, at::kFloat, exp_avg_sq_.front().device());
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    at::Tensor& p = slots_[i].flat->shard();
    const at::Tensor& grad = slots_[i].flat->shard_grad();
    if (!grad.defined()) continue;  // no backward reached it yet: skipped, as libtorch skips grad-less params
    if (options_.weight_decay != 0) {
      for (const auto& [offset, length] : slots_[i].decay_ranges) {
        p.narrow(0, offset, length).mul_(1 - lr_ * options_.weight_decay);
      }
    }
    exp_avg_[i].mul_(options_.beta1).add_(grad, 1 - options_.beta1);
    exp_avg_sq_[i].mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);
    // Into the optimizer's scratch, in place: no per-step temporary (same values as the composed
    // (sqrt(v) / sqrt(bc2)) + eps). The scratch is as large as the largest shard.
    at::Tensor denom = denominator_scratch_.narrow(0, 0, exp_avg_sq_[i].numel());
    at::sqrt_out(denom, exp_avg_sq_[i]);
    denom.div_(std::sqrt(bias_correction2)).add_(options_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i) bytes += (exp_avg_[i].numel() + exp_avg_sq_[i].numel()) * 4;
  return bytes;
}

ShardedSgd::ShardedSgd(runtime::FsdpState& state, SgdOptions options)
    : ShardedOptimizer(state, options.lr, options.decay), options_(std::move(options)) {
  momentum_.resize(slots_.size());
}

// Same operations as torch::optim::SGD (libtorch 1.13, no dampening, no Nesterov).
void ShardedSgd::step() {
  torch::NoGradGuard no_grad;
  count_step(/*by_step_unless=*/false);
  for (const Slot& slot : slots_) slot.flat->wait_for_shard_grad();
  for (size_t i = 0; i < slots_.size(); ++i) {
    at::Tensor& p = slots_[i].flat->shard();
    at::Tensor d_p = slots_[i].flat->shard_grad();
    if (!d_p.defined()) continue;
    if (options_.weight_decay != 0) {
      d_p = d_p.clone();
      for (const auto& [offset, length] : slots_[i].decay_ranges) {
        d_p.narrow(0, offset, length).add_(p.narrow(0, offset, length), options_.weight_decay);
      }
    }
    if (options_.momentum != 0) {
      if (!momentum_[i].defined()) {
        momentum_[i] = shard::empty_buffer(d_p.numel(), at::kFloat, d_p.device()).copy_(d_p);
      } else {
        momentum_[i].mul_(options_.momentum).add_(d_p, 1.0);
      }
      d_p = momentum_[i];
    }
    p.add_(d_p, -lr_);
  }
}

std::vector<std::string> ShardedSgd::state_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum"};
}

at::Tensor& ShardedSgd::state_tensor(size_t slot, size_t /*which*/) {
  // Zero momentum steps exactly as none: momentum * 0 + d_p == d_p.
  if (!momentum_[slot].defined()) {
    const at::Tensor& shard = slots_[slot].flat->shard();
    momentum_[slot] = shard::empty_buffer(shard.numel(), at::kFloat, shard.device()).zero_();
  }
  return momentum_[slot];
}

int64_t ShardedSgd::state_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor& m : momentum_) bytes += m.defined() ? m.numel() * 4 : 0;
  return bytes;
}

at::Tensor grad_norm_tensor(runtime::FsdpState& state) {
  // [sum of squares over sharded gradients, over replicated ones]: one all-reduce for both.
  at::Device device(at::kCPU);
  for (shard::FlatParam* flat : state.flat_params()) device = flat->shard().device();
  at::Tensor sums = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (shard::FlatParam* flat : state.flat_params()) {
    if (!flat->trainable() || !flat->shard_grad().defined()) continue;
    flat->wait_for_shard_grad();
    const at::Tensor& grad = flat->shard_grad();
    at::Tensor sum = sums[flat->replicated() ? 1 : 0];  // a view: accumulated on the gradient's device, no host sync
    if (grad.is_cuda()) {
      // One reduction kernel, no fp64 copy of the shard: a GPU's tree reduction keeps fp32 accurate
      // to about 1e-7 relative; thousands of chunk launches per step would cost more.
      sum.add_(at::linalg_vector_norm(grad, 2).to(at::kDouble).square());
      continue;
    }
    // On the host, in fp64, a chunk at a time: a whole shard in fp64 (and its square) would be two
    // transients of 2x the gradient shard's bytes, the step's peak memory for a large unit.
    constexpr int64_t kChunk = 1 << 20;  // elements: 8 MiB in fp64
    for (int64_t offset = 0; offset < grad.numel(); offset += kChunk) {
      const at::Tensor chunk = grad.narrow(0, offset, std::min(kChunk, grad.numel() - offset)).to(at::kDouble);
      sum.add_(chunk.dot(chunk));
    }
  }
  // Over the shard group: its ranks hold one whole gradient between them (under hybrid_shard
  // every replica group holds the same one, so every group computes the same norm).
  const comm::ProcessGroupPtr& group = state.shard_group();
  // This thread blocks for it on the host (exposed communication, booked as such); on a GPU the
  // stream waits. A rank alone has the sums.
  if (group->size() > 1) state.wait(group->all_reduce(sums, comm::ReduceOp::Sum));
  // Replicated gradients are identical on every rank: count them once. The same fp64 operations
  // as on host doubles, the same bits: a true division by a tensor (CUDA divides by a host scalar
  // as a product with its reciprocal).
  const at::Tensor ranks = at::full({}, static_cast<double>(group->size()), sums.options());
  return (sums[0] + sums[1] / ranks).sqrt();
}

double grad_norm(runtime::FsdpState& state) { return grad_norm_tensor(state).item<double>(); }

at::Tensor clip_grad_norm_tensor(runtime::FsdpState& state, double max_norm) {
  const at::Tensor norm = grad_norm_tensor(state);
  // min(1, max / (norm + 1e-6)) in fp64; NaN or inf: 1, nothing to scale (min(1, max / NaN) would
  // be 1, max / inf 0, which turns an inf into NaN and zeroes the rest); the caller skips the step.
  const at::Tensor coefficient =
      at::where(norm.isfinite(), at::full_like(norm, max_norm).div_(norm + 1e-6).clamp_max_(1.0), at::ones_like(norm));
  std::vector<at::Tensor> grads;
  for (shard::FlatParam* flat : state.flat_params()) {
    if (flat->trainable() && flat->shard_grad().defined()) grads.push_back(flat->shard_grad());
  }
  if (grads.empty()) return norm;
  if (!coefficient.is_cuda()) {
    // Gradients in host memory (a CPU run, CPU offload): reading the coefficient waits for nothing,
    // and a step within the bound skips a pass over every shard (gigabytes for an offloaded model).
    RECORD_USER_SCOPE("fsdp::clip_coefficient_in_host_memory");  // tests/dist/step_edge_test.cpp
    if (coefficient.item<double>() == 1.0) return norm;
  }
  // One foreach launch on a GPU (a loop of mul_ on the host), issued whatever the coefficient: the
  // host does not wait to learn it. The coefficient rounded to fp32 first, as a double scalar times
  // an fp32 tensor is: the same bits as scaling by the scalar.
  at::_foreach_mul_(grads, coefficient.to(at::kFloat));
  return norm;
}

double clip_grad_norm(runtime::FsdpState& state, double max_norm) {
  return clip_grad_norm_tensor(state, max_norm).item<double>();
}

at::Tensor nonfinite_flag(const at::Tensor& norm) { return norm.isfinite().logical_not().to(at::kFloat).reshape({1}); }

}  // namespace fsdp::optim
