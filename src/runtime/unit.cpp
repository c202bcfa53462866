#include "unit.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "prefetch_scheduler.h"

namespace fsdp::runtime {

struct Unit::GradReadyHook final : torch::autograd::FunctionPostHook {
  explicit GradReadyHook(Unit* unit) : unit_(unit) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    unit_->on_grad_ready();
    return outputs;
  }
  Unit* unit_;
};

Unit::Unit(std::shared_ptr<torch::nn::Module> module, std::string name, bool is_root,
           const std::unordered_set<const void*>& excluded, const ShardingGroups& groups, const FsdpOptions& options)
    : module_(std::move(module)),
      name_(std::move(name)),
      is_root_(is_root),
      strategy_(options.strategy),
      // Blocks only (as torchtitan): recomputing an embedding lookup saves nothing, and recomputing
      // the output head would repeat the step's largest matmul.
      checkpointable_(!is_root && fsdp::nn::is_pushed_block(module_.get())),
      checkpointed_(options.activation_checkpointing && checkpointable_),
      groups_(groups) {
  // Parameters in first-seen order, tied ones once (their other names become aliases).
  std::vector<std::string> names[2];
  std::vector<at::Tensor> params[2];
  std::vector<std::vector<std::string>> aliases[2];
  std::unordered_map<const void*, std::pair<int, size_t>> position;
  for (const auto& item : module_->named_parameters(true)) {
    const at::Tensor& p = item.value();
    const void* id = p.unsafeGetTensorImpl();
    if (excluded.count(id)) continue;
    auto found = position.find(id);
    if (found != position.end()) {
      aliases[found->second.first][found->second.second].push_back(item.key());
      continue;
    }
    const int kind = p.requires_grad() ? 0 : 1;
    if (p.device() != options.device) {
      torch::NoGradGuard no_grad;
      at::Tensor moved = p;  // same TensorImpl: the module keeps its parameter, now on the device
      moved.set_data(p.to(options.device));
    }
    position[id] = {kind, params[kind].size()};
    names[kind].push_back(item.key());
    params[kind].push_back(p);
    aliases[kind].emplace_back();
  }
  const bool replicate = strategy_ == ShardingStrategy::NoShard;
  for (int kind = 0; kind < 2; ++kind) {
    if (params[kind].empty()) continue;
    auto flat = std::make_unique<shard::FlatParam>(name_.empty() ? "<root>" : name_, names[kind], params[kind],
                                                   aliases[kind], groups.shard, replicate, kind == 0);
    if (groups.replicate) flat->set_replica_group(groups.replicate);
    // Meta tensors (a construction check) have no values to compare or broadcast.
    if (!options.device.is_meta()) flat->verify_same_across_ranks(options.sync_module_states);
    bool nf4 = false;
    if (kind == 1 && options.frozen_nf4) {  // QLoRA: encoded while the values are whole
      std::vector<bool> selected;
      for (size_t i = 0; i < params[kind].size(); ++i)
        selected.push_back(options.frozen_nf4(names[kind][i], params[kind][i]));
      nf4 = std::find(selected.begin(), selected.end(), true) != selected.end();
      if (nf4) {
        flat->set_nf4_storage(selected, options.nf4_double_quant, options.frozen_dtype,
                              !options.nf4_values_loaded_later);
      }
    }
    flat->reshard();
    // Before the grad accumulators exist: a dtype change would drop them.
    flat->set_precision(options.param_dtype, options.reduce_dtype);
    if (kind == 1 && !nf4) flat->set_storage_dtype(options.frozen_dtype);
    if (options.cpu_offload) {
      if (replicate) throw std::invalid_argument("fully_shard: cpu_offload needs a sharding strategy (not no_shard)");
      flat->set_cpu_offload(true);
    }
    (kind == 0 ? trainable_ : frozen_) = std::move(flat);
  }
  if (trainable_) {
    for (const at::Tensor& p : trainable_->params()) {
      auto accumulator = torch::autograd::impl::grad_accumulator(p);
      accumulator->add_post_hook(std::make_unique<GradReadyHook>(this));
      // The parameter holds its accumulator weakly: keep it, or the hook vanishes.
      accumulators_.push_back(std::move(accumulator));
    }
  }
}

std::vector<shard::FlatParam*> Unit::flat_params() const {
  std::vector<shard::FlatParam*> out;
  if (trainable_) out.push_back(trainable_.get());
  if (frozen_) out.push_back(frozen_.get());
  return out;
}

int64_t Unit::gathered_bytes() const {
  int64_t bytes = 0;
  for (shard::FlatParam* flat : flat_params()) bytes += flat->gathered_bytes();
  return bytes;
}

int64_t Unit::unsharded_param_bytes() const {
  int64_t bytes = 0;
  for (shard::FlatParam* flat : flat_params()) bytes += flat->unsharded_bytes();
  return bytes;
}

void Unit::adopt(FsdpState* state, const std::string& path) {
  state_ = state;
  if (!is_root_) {
    // Parameter names were taken relative to the unit's module; now its path is known.
    name_ = path;
    for (shard::FlatParam* flat : flat_params()) flat->prefix_names(path);
  }
  install_hooks();
}

void Unit::set_activation_checkpointing(bool on) {
  if (on && !checkpointable_) throw std::logic_error("unit '" + name_ + "' is not a block: it cannot be checkpointed");
  checkpointed_ = on;
  if (state_ != nullptr) install_hooks();  // the hooks carry the choice
}

void Unit::install_hooks() {
  FsdpState* state = state_;
  fsdp::nn::ForwardHooks hooks;
  if (is_root_) {
    hooks.pre_forward = [state] { state->pre_root_forward(); };
    hooks.post_forward = [state](const std::vector<at::Tensor>& outputs) { state->post_root_forward(outputs); };
  } else {
    hooks.pre_forward = [this] { pre_forward(); };
    hooks.post_forward = [this](const std::vector<at::Tensor>& outputs) { post_forward(outputs); };
    hooks.backward_reads_parameters = [this](bool reads) {
      if (reads && torch::GradMode::is_enabled()) backward_reads_params_ = true;
    };
    hooks.checkpoint_activations = checkpointed_;
    if (frozen_) {
      // Frozen parameters have no gradient accumulator to say when the last node using them ran:
      // the backward of the unit's inputs does (every node computed from them has run by then).
      hooks.post_backward_of_inputs = [this]() -> std::function<void()> {
        ++hooked_input_calls_;
        return [this] { on_inputs_backward_done(); };
      };
    }
  }
  fsdp::nn::set_forward_hooks(module_.get(), std::move(hooks));
}

std::string Unit::trace_name() const { return is_root_ ? "<root>" : name_; }

void Unit::release_hooks() { fsdp::nn::clear_forward_hooks(module_.get()); }

void Unit::pre_forward() {
  ++forward_calls_;
  if (checkpointed_ && torch::GradMode::is_enabled()) ++checkpointed_calls_;
  issue_gather(/*prefetch=*/false);
  prefetched_ = false;
  if (is_root_) {
    state_->scheduler().prefetch_forward_from(0);
  } else {
    const size_t position = state_->scheduler().record_forward(this);
    state_->scheduler().prefetch_forward_after(this, position);
  }
  wait_gather();
}

void Unit::post_forward(const std::vector<at::Tensor>& outputs) {
  const bool grad_needed = register_pre_backward_hooks(outputs);
  const bool reshard_after_forward =
      strategy_ == ShardingStrategy::FullShard || strategy_ == ShardingStrategy::HybridShard;
  if (!is_root_ && (reshard_after_forward || !grad_needed)) release_params();
}

void Unit::release_if_backward_reads_none() {
  if (!is_root_ && ran_forward() && !backward_reads_params_) release_params();
}

bool Unit::register_pre_backward_hooks(const std::vector<at::Tensor>& outputs) {
  if (!torch::GradMode::is_enabled()) return false;
  bool any = false;
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    at::Tensor hooked = output;
    hooked.register_hook([this](const at::Tensor&) { pre_backward(); });
    any = true;
  }
  return any;
}

void Unit::pre_backward() {
  state_->on_pre_backward();
  if (pre_backward_ran_) return;
  pre_backward_ran_ = true;
  if (!is_root_) state_->scheduler().record_backward(this);
  // A unit whose backward reads none of its parameters (embedding lookup, chunked loss head) is
  // not gathered again: its gradients come from autograd's tensors alone.
  if (is_root_ || backward_reads_params_) issue_gather(/*prefetch=*/false);
  prefetched_ = false;
  state_->scheduler().prefetch_backward_after(this);
  wait_gather();
}

void Unit::post_backward() {
  if (post_backward_done_) return;
  post_backward_done_ = true;
  if (trainable_ && state_->requires_gradient_sync()) {
    RECORD_USER_SCOPE(
        "fsdp::reduce_grad " +
        trace_name());  // marks the unit in --profile-steps traces (reduce-scatter, or all-reduce unsharded)
    // A unit unused in this step reduces zeros, so every rank joins.
    pending_reduce_ = trainable_->reduce_grad_async();
    // HybridShard: the replica all-reduce goes right behind it, not when this host happens to see
    // the reduce-scatter done: the two groups' collectives then reach NCCL in the same order on
    // every rank (a per-rank order can deadlock NCCL), as FSDP2 issues them.
    replica_reduce_ = trainable_->reduce_across_replicas_after(pending_reduce_);
    if (replica_reduce_) state_->count_replica_reduction();
    state_->on_memory_changed();  // the unit's peak: autograd's gradients beside the packed input
    trainable_->drop_grads();     // packed: autograd's tensors are done with
    state_->on_memory_changed();
  }
  // Trainable parameters are free to go: their accumulators ran after every node that used them.
  if (trainable_ && strategy_ != ShardingStrategy::NoShard) release(*trainable_);
  release_frozen_if_done();
  if (pending_reduce_) {
    state_->count_reduction();
    state_->scheduler().reduction_issued(this);
  }
}

void Unit::on_inputs_backward_done() {
  ++inputs_backward_done_;
  release_frozen_if_done();
}

// Frozen parameters are used by the nodes that compute the gradients of the unit's inputs (all
// run once every call's inputs' post-backward ran) and possibly by nodes computing its trainable
// gradients (all run once post_backward ran). Until both, they stay; without a hooked input they
// stay until the end of backward.
void Unit::release_frozen_if_done() {
  if (!frozen_ || strategy_ == ShardingStrategy::NoShard) return;
  if (hooked_input_calls_ == 0 || inputs_backward_done_ < hooked_input_calls_) return;
  if (trainable_ && !post_backward_done_) return;
  release(*frozen_);
}

void Unit::finish_reduce() {
  if (!pending_reduce_) return;
  RECORD_USER_SCOPE("fsdp::wait_reduce " + trace_name());
  state_->wait(pending_reduce_);
  if (replica_reduce_) state_->wait(replica_reduce_);
  pending_reduce_ = nullptr;
  replica_reduce_ = nullptr;
  trainable_->finish_reduce_grad();
  state_->on_memory_changed();
}

void Unit::drop_grads() {
  if (trainable_ && trainable_->holds_grads()) {
    trainable_->drop_grads();
    state_->on_memory_changed();
  }
}

void Unit::release_params() {
  if (strategy_ == ShardingStrategy::NoShard) return;
  for (shard::FlatParam* flat : flat_params()) release(*flat);
}

void Unit::prefetch() {
  if (issue_gather(/*prefetch=*/true)) prefetched_ = true;
}

void Unit::reset_step() {
  forward_calls_ = 0;
  checkpointed_calls_ = 0;
  hooked_input_calls_ = 0;
  inputs_backward_done_ = 0;
  pre_backward_ran_ = false;
  backward_reads_params_ = false;
  post_backward_done_ = false;
  grads_ready_ = 0;
}

void Unit::on_grad_ready() {
  if (!trainable_) return;
  // Without checkpointing a parameter's accumulator runs once per backward, however many calls
  // used it (autograd sums first). With it, each call's recomputation runs its own nested
  // backward, so the accumulator runs once per call: the unit is done after the last.
  const size_t calls = checkpointed_ ? static_cast<size_t>(std::max(1, checkpointed_calls_)) : 1;
  if (++grads_ready_ == trainable_->params().size() * calls) post_backward();
}

bool Unit::issue_gather(bool prefetch) {
  RECORD_USER_SCOPE(std::string(prefetch ? "fsdp::prefetch " : "fsdp::gather ") + trace_name());
  bool issued = false;
  int64_t bytes = 0;
  for (shard::FlatParam* flat : flat_params()) {
    if (auto work = flat->unshard_async()) {
      pending_gathers_.push_back(std::move(work));
      issued = true;
      bytes += flat->gather_wire_bytes();
    }
  }
  if (issued) {
    state_->count_gather(prefetch, bytes);
    state_->on_memory_changed();
  }
  return issued;
}

void Unit::wait_gather() {
  if (pending_gathers_.empty()) return;
  RECORD_USER_SCOPE("fsdp::wait_gather " + trace_name());
  for (auto& work : pending_gathers_) state_->wait(work);
  pending_gathers_.clear();
  state_->on_memory_changed();  // an NF4 unit's values are allocated and decoded at the wait
}

void Unit::release(shard::FlatParam& flat) {
  if (flat.replicated() || !flat.is_unsharded()) return;
  wait_gather();  // never free a buffer a gather is still writing
  prefetched_ = false;
  flat.reshard();
  state_->on_memory_changed();
  state_->on_unit_released();
}

}  // namespace fsdp::runtime
