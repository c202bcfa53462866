#include "fsdp/runtime/fully_shard.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/comm/launch.h"
#include "fsdp/shard/storage.h"

namespace fsdp::runtime {

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::FullShard: return "full_shard";
    case ShardingStrategy::ShardGradOp: return "shard_grad_op";
    case ShardingStrategy::NoShard: return "no_shard";
    case ShardingStrategy::HybridShard: return "hybrid_shard";
  }
  return "?";
}

ShardingStrategy sharding_strategy_from_string(const std::string& name) {
  if (name == "full_shard") return ShardingStrategy::FullShard;
  if (name == "shard_grad_op") return ShardingStrategy::ShardGradOp;
  if (name == "no_shard") return ShardingStrategy::NoShard;
  if (name == "hybrid_shard") return ShardingStrategy::HybridShard;
  throw std::invalid_argument("unknown sharding strategy '" + name +
                              "' (expected full_shard, shard_grad_op, no_shard or hybrid_shard)");
}

ShardingGroups make_sharding_groups(const comm::ProcessGroupPtr& world, const FsdpOptions& options) {
  if (!world) throw std::invalid_argument("fully_shard: the process group is null");
  ShardingGroups groups;
  groups.world = world;
  if (options.strategy != ShardingStrategy::HybridShard) {
    groups.shard = world;
    return groups;
  }
  const int n = world->size();
  int s = options.shard_group_size;
  if (s == 0) s = comm::launch_info_from_env().local_world_size;
  if (s < 0) throw std::invalid_argument("fully_shard: shard_group_size must be 0 (one node) or more, got " + std::to_string(s));
  if (s < 1 || n % s != 0) {
    throw std::invalid_argument("fully_shard: hybrid_shard needs the shard group size to divide the " +
                                std::to_string(n) + " ranks, got " + std::to_string(s) +
                                (options.shard_group_size == 0 ? " (the ranks of this node)" : ""));
  }
  const int rank = world->rank();
  // Ranks [k s, (k + 1) s) shard one copy; ranks r, r + s, r + 2 s, ... hold the same shard.
  groups.shard = s == n ? world : world->split(rank / s, rank);
  if (s < n) groups.replicate = world->split(rank % s, rank);
  return groups;
}

namespace {

// "fsdp::models::BlockImpl" -> "Block"
std::string short_type_name(const torch::nn::Module& module) {
  std::string name = module.name();
  auto colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  const std::string suffix = "Impl";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    name.resize(name.size() - suffix.size());
  }
  return name;
}

bool is_container(const torch::nn::Module& module) {
  const std::string type = short_type_name(module);
  return type == "ModuleList" || type == "Sequential" || type == "ModuleDict";
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t total = 0;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.parameters(true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) total += p.numel();
  }
  return total;
}

}  // namespace

bool WrapPolicy::selects(const torch::nn::Module& module, const std::string& path) const {
  const std::string type = short_type_name(module);
  for (const std::string& wanted : module_types) {
    if (wanted == type || wanted == module.name()) return true;
  }
  for (const std::string& wanted : module_paths) {
    if (!path.empty() && wanted == path) return true;
  }
  return min_params > 0 && !is_container(module) && parameter_count(module) >= min_params;
}

// ---------------------------------------------------------------------------------------------
// Unit: the parameters of one wrapped module, as one or two FlatParams, and their step state.

class Unit {
 public:
  Unit(std::shared_ptr<torch::nn::Module> module, std::string name, bool is_root,
       const std::unordered_set<const void*>& excluded, const ShardingGroups& groups, const FsdpOptions& options)
      : module_(std::move(module)), name_(std::move(name)), is_root_(is_root), strategy_(options.strategy),
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
      flat->verify_same_across_ranks(options.sync_module_states);
      flat->reshard();
      // Before the grad accumulators exist: a dtype change would drop them.
      flat->set_precision(options.mixed_precision.param_dtype, options.mixed_precision.reduce_dtype);
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

  const std::string& name() const { return name_; }
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  const ShardingGroups& groups() const { return groups_; }
  bool is_root() const { return is_root_; }
  bool ran_forward() const { return forward_ran_; }
  bool ran_pre_backward() const { return pre_backward_ran_; }
  bool is_prefetched() const { return prefetched_; }

  std::vector<shard::FlatParam*> flat_params() const {
    std::vector<shard::FlatParam*> out;
    if (trainable_) out.push_back(trainable_.get());
    if (frozen_) out.push_back(frozen_.get());
    return out;
  }

  int64_t gathered_bytes() const {
    int64_t bytes = 0;
    for (shard::FlatParam* flat : flat_params()) bytes += flat->gathered_bytes();
    return bytes;
  }

  int64_t unsharded_param_bytes() const {
    int64_t bytes = 0;
    for (shard::FlatParam* flat : flat_params()) bytes += flat->unsharded_bytes();
    return bytes;
  }

  // Gives the unit its final name and a back-pointer to its state, and installs the forward hooks.
  void adopt(FsdpState* state, const std::string& path) {
    state_ = state;
    if (!is_root_) {
      // Parameter names were taken relative to the unit's module; now its path is known.
      name_ = path;
      for (shard::FlatParam* flat : flat_params()) flat->prefix_names(path);
    }
    fsdp::nn::ForwardHooks hooks;
    if (is_root_) {
      hooks.pre_forward = [state] { state->pre_root_forward(); };
      hooks.post_forward = [state](const std::vector<at::Tensor>& outputs) { state->post_root_forward(outputs); };
    } else {
      hooks.pre_forward = [this] { pre_forward(); };
      hooks.post_forward = [this](const std::vector<at::Tensor>& outputs) { post_forward(outputs); };
      hooks.checkpoint_activations = state->options().activation_checkpointing;
    }
    fsdp::nn::set_forward_hooks(module_.get(), std::move(hooks));
  }

  void release_hooks() { fsdp::nn::clear_forward_hooks(module_.get()); }

  void pre_forward() {
    forward_ran_ = true;
    if (!is_root_) state_->record_forward(this);
    issue_gather(/*prefetch=*/false);
    prefetched_ = false;
    state_->prefetch_forward_after(is_root_ ? nullptr : this);
    wait_gather();
  }

  void post_forward(const std::vector<at::Tensor>& outputs) {
    const bool grad_needed = register_pre_backward_hooks(outputs);
    const bool reshard_after_forward =
        strategy_ == ShardingStrategy::FullShard || strategy_ == ShardingStrategy::HybridShard;
    if (!is_root_ && (reshard_after_forward || !grad_needed)) release_params();
  }

  // Returns whether any output will receive a gradient.
  bool register_pre_backward_hooks(const std::vector<at::Tensor>& outputs) {
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

  void pre_backward() {
    state_->on_pre_backward();
    if (pre_backward_ran_) return;
    pre_backward_ran_ = true;
    if (!is_root_) state_->record_backward(this);
    issue_gather(/*prefetch=*/false);
    prefetched_ = false;
    prepare_grads();
    state_->prefetch_backward_after(this);
    wait_gather();
  }

  // All trainable parameters have their gradients (or the backward ended): reduce them.
  void post_backward() {
    if (post_backward_done_) return;
    post_backward_done_ = true;
    if (trainable_ && state_->requires_gradient_sync()) {
      prepare_grads();  // a unit unused in this step reduces zeros, so every rank joins
      pending_reduce_ = trainable_->reduce_grad_async();
      state_->on_memory_changed();
    }
    // Trainable parameters are free to go: their accumulators ran after every node that used them.
    // Frozen ones may still be needed by a later node; they go at the end of backward.
    if (trainable_ && strategy_ != ShardingStrategy::NoShard) release(*trainable_);
    if (pending_reduce_) state_->on_reduce_issued(this);
  }

  bool reduce_pending() const { return pending_reduce_ != nullptr; }

  void finish_reduce() {
    if (!pending_reduce_) return;
    state_->wait(pending_reduce_);
    pending_reduce_ = nullptr;
    trainable_->finish_reduce_grad();
    state_->on_memory_changed();
  }

  void drop_unsharded_grads() {
    if (trainable_ && trainable_->has_unsharded_grad()) {
      trainable_->drop_unsharded_grad();
      state_->on_memory_changed();
    }
  }

  void release_params() {
    if (strategy_ == ShardingStrategy::NoShard) return;
    for (shard::FlatParam* flat : flat_params()) release(*flat);
  }

  // Starts gathering this unit's parameters ahead of its use (no-op if gathered or in flight).
  void prefetch() {
    if (issue_gather(/*prefetch=*/true)) prefetched_ = true;
  }

  void reset_step() {
    forward_ran_ = false;
    pre_backward_ran_ = false;
    post_backward_done_ = false;
    grads_ready_ = 0;
  }

  void on_grad_ready() {
    if (trainable_ && ++grads_ready_ == trainable_->params().size()) post_backward();
  }

 private:
  struct GradReadyHook final : torch::autograd::FunctionPostHook {
    explicit GradReadyHook(Unit* unit) : unit_(unit) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      unit_->on_grad_ready();
      return outputs;
    }
    Unit* unit_;
  };

  // Issues the all-gathers this unit's parameters still need (its buffers are allocated now).
  bool issue_gather(bool prefetch) {
    bool issued = false;
    for (shard::FlatParam* flat : flat_params()) {
      if (auto work = flat->unshard_async()) {
        pending_gathers_.push_back(std::move(work));
        issued = true;
      }
    }
    if (issued) {
      state_->count_gather(prefetch);
      state_->on_memory_changed();
    }
    return issued;
  }

  void wait_gather() {
    for (auto& work : pending_gathers_) state_->wait(work);
    pending_gathers_.clear();
  }

  void prepare_grads() {
    if (trainable_ && !trainable_->has_unsharded_grad()) {
      trainable_->prepare_grad();
      state_->on_memory_changed();
    }
  }

  void release(shard::FlatParam& flat) {
    if (flat.replicated() || !flat.is_unsharded()) return;
    wait_gather();  // never free a buffer a gather is still writing
    prefetched_ = false;
    flat.reshard();
    state_->on_memory_changed();
  }

  std::shared_ptr<torch::nn::Module> module_;
  std::string name_;
  bool is_root_;
  ShardingStrategy strategy_;
  ShardingGroups groups_;
  FsdpState* state_ = nullptr;
  std::unique_ptr<shard::FlatParam> trainable_;
  std::unique_ptr<shard::FlatParam> frozen_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<comm::WorkPtr> pending_gathers_;  // gathers issued and not yet waited for
  bool prefetched_ = false;                     // gathered ahead of use, not used yet
  bool forward_ran_ = false;
  bool pre_backward_ran_ = false;
  bool post_backward_done_ = false;
  size_t grads_ready_ = 0;
  comm::WorkPtr pending_reduce_;

  friend class FsdpState;
};

// ---------------------------------------------------------------------------------------------

namespace {

std::unordered_set<const void*> parameter_ids(const std::vector<std::shared_ptr<Unit>>& units) {
  std::unordered_set<const void*> ids;
  for (const auto& unit : units) {
    for (shard::FlatParam* flat : unit->flat_params()) {
      for (const at::Tensor& p : flat->params()) ids.insert(p.unsafeGetTensorImpl());
    }
  }
  return ids;
}

std::mutex g_wrapped_mutex;
std::set<const torch::nn::Module*> g_wrapped_roots;

}  // namespace

FsdpState::FsdpState(std::shared_ptr<torch::nn::Module> root, comm::ProcessGroupPtr group, FsdpOptions options,
                     std::vector<std::shared_ptr<Unit>> prebuilt)
    : root_(std::move(root)), group_(std::move(group)), options_(std::move(options)) {
  if (!group_) throw std::invalid_argument("fully_shard: the process group is null");
  if (options_.max_inflight < 0) {
    throw std::invalid_argument("fully_shard: max_inflight must be 0 or more, got " + std::to_string(options_.max_inflight));
  }
  // Units built by build_fully_sharded already split the groups: reuse theirs (a split is collective).
  groups_ = prebuilt.empty() ? make_sharding_groups(group_, options_) : prebuilt.front()->groups();
  if (groups_.world != group_) {
    throw std::invalid_argument("build_fully_sharded: the blocks were sharded over another process group");
  }
  // Paths of every module, to name prebuilt units and apply the policy to the rest.
  std::unordered_map<const torch::nn::Module*, std::string> path_of;
  for (const auto& item : root_->named_modules("", /*include_self=*/false)) path_of[item.value().get()] = item.key();

  std::unordered_set<const torch::nn::Module*> prebuilt_modules;
  for (const auto& unit : prebuilt) {
    auto found = path_of.find(unit->module().get());
    if (found == path_of.end()) {
      throw std::invalid_argument("build_fully_sharded: a block given to fsdp::nn::push_block is not part of the "
                                  "built model (was it pushed into a list the model does not register?)");
    }
    unit->adopt(this, found->second);
    prebuilt_modules.insert(unit->module().get());
    units_.push_back(unit);
  }

  // Outermost selected modules, in model order; a selected module's descendants are not visited.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> selected;
  std::vector<std::string> taken_prefixes;
  for (const auto& item : root_->named_modules("", /*include_self=*/false)) {
    const std::string& path = item.key();
    bool inside = false;
    for (const std::string& prefix : taken_prefixes) {
      if (path.compare(0, prefix.size() + 1, prefix + ".") == 0) inside = true;
    }
    if (inside) continue;
    if (prebuilt_modules.count(item.value().get())) {
      taken_prefixes.push_back(path);
      continue;
    }
    if (options_.wrap_policy.selects(*item.value(), path)) {
      selected.emplace_back(path, item.value());
      taken_prefixes.push_back(path);
    }
  }
  if (!options_.wrap_policy.empty() && selected.empty() && prebuilt.empty()) {
    std::set<std::string> types;
    for (const auto& item : root_->named_modules("", false)) types.insert(short_type_name(*item.value()));
    std::string listed;
    for (const auto& t : types) listed += (listed.empty() ? "" : ", ") + t;
    throw std::invalid_argument("fully_shard: the wrap policy selects no module of " + root_->name() +
                                " (module types present: " + listed + ")");
  }
  std::unordered_set<const void*> owned = parameter_ids(units_);
  for (auto& [path, module] : selected) {
    std::unordered_set<const void*> none;
    auto unit = std::make_shared<Unit>(module, path, /*is_root=*/false, none, groups_, options_);
    for (shard::FlatParam* flat : unit->flat_params()) {
      for (const at::Tensor& p : flat->params()) {
        if (!owned.insert(p.unsafeGetTensorImpl()).second) {
          throw std::invalid_argument("fully_shard: parameter " + flat->layout().entries[0].name +
                                      "... of unit '" + path +
                                      "' is shared with another unit; tie parameters inside one unit (the root)");
        }
      }
    }
    unit->adopt(this, path);
    units_.push_back(std::move(unit));
  }
  // Children in model order (prebuilt ones came first, in construction order).
  std::unordered_map<const torch::nn::Module*, size_t> order;
  for (const auto& item : root_->named_modules("", /*include_self=*/false)) order.emplace(item.value().get(), order.size());
  std::stable_sort(units_.begin(), units_.end(),
                   [&](const auto& a, const auto& b) { return order[a->module().get()] < order[b->module().get()]; });
  auto root_unit = std::make_shared<Unit>(root_, "", /*is_root=*/true, owned, groups_, options_);
  root_unit->adopt(this, "");
  units_.push_back(std::move(root_unit));

  // Cache capacity in fp32 bytes: with bf16 compute, a gradient cast for an fp32 reduction is fp32.
  // The reduced gradient shards in flight (up to K + 2 of them) are cached too.
  int64_t root_bytes = 0, largest_bytes = 0, largest_shard_bytes = 0;
  for (const auto& unit : units_) {
    int64_t unit_bytes = 0;
    for (shard::FlatParam* flat : unit->flat_params()) {
      unsharded_param_bytes_ += flat->layout().numel * 4;
      unit_bytes += flat->layout().padded_numel * 4;
      largest_shard_bytes = std::max(largest_shard_bytes, flat->layout().shard_numel * 4);
      flat->set_buffer_caching(options_.cache_buffers);
    }
    if (unit->is_root()) {
      root_bytes = unit_bytes;
    } else {
      largest_bytes = std::max(largest_bytes, unit_bytes);
    }
  }
  if (options_.cache_buffers) {
    const int64_t wanted = 2 * root_bytes + (options_.max_inflight + 2) * (largest_bytes + largest_shard_bytes);
    if (wanted > shard::buffer_cache_capacity()) shard::set_buffer_cache_capacity(wanted);
  }
}

FsdpState::~FsdpState() {
  for (auto& unit : units_) unit->release_hooks();
  std::lock_guard<std::mutex> lock(g_wrapped_mutex);
  g_wrapped_roots.erase(root_.get());
}

std::vector<shard::FlatParam*> FsdpState::flat_params() {
  std::vector<shard::FlatParam*> out;
  for (auto& unit : units_) {
    for (shard::FlatParam* flat : unit->flat_params()) out.push_back(flat);
  }
  return out;
}

std::vector<std::string> FsdpState::unit_names() const {
  std::vector<std::string> names;
  for (const auto& unit : units_) names.push_back(unit->is_root() ? "<root>" : unit->name());
  return names;
}

void FsdpState::zero_grad() {
  for (auto& unit : units_) unit->drop_unsharded_grads();
  for (shard::FlatParam* flat : flat_params()) {
    if (flat->trainable()) flat->zero_shard_grad();
  }
}

std::vector<std::pair<std::string, at::Tensor>> FsdpState::full_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (shard::FlatParam* flat : flat_params()) {
    std::vector<at::Tensor> tensors = flat->gather_full_params();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const shard::FlatEntry& entry = flat->layout().entries[i];
      out.emplace_back(entry.name, tensors[i]);
      for (const std::string& alias : entry.aliases) out.emplace_back(alias, tensors[i]);
    }
  }
  return out;
}

MemoryStats FsdpState::memory_stats() const {
  MemoryStats stats;
  for (const auto& unit : units_) {
    for (shard::FlatParam* flat : unit->flat_params()) {
      stats.sharded_param_bytes += flat->layout().shard_numel * 4;
      if (flat->trainable()) stats.sharded_grad_bytes += flat->layout().shard_numel * 4;
    }
    if (unit->is_root()) {
      stats.root_unit_bytes = unit->unsharded_param_bytes();
    } else {
      stats.largest_unit_bytes = std::max(stats.largest_unit_bytes, unit->unsharded_param_bytes());
    }
  }
  stats.gathered_bytes = gathered_bytes_;
  stats.peak_gathered_bytes = peak_gathered_bytes_;
  stats.unsharded_param_bytes = unsharded_param_bytes_;
  return stats;
}

void FsdpState::reset_peak_memory() { peak_gathered_bytes_ = gathered_bytes_; }

namespace {
std::vector<std::string> names_of(const std::vector<Unit*>& units) {
  std::vector<std::string> names;
  for (const Unit* unit : units) names.push_back(unit->name());
  return names;
}
}  // namespace

std::vector<std::string> FsdpState::forward_order() const { return names_of(forward_order_); }
std::vector<std::string> FsdpState::backward_order() const { return names_of(backward_order_); }

void FsdpState::on_memory_changed() {
  // A sum over the units, not deltas: a few dozen units, and it cannot drift.
  int64_t total = 0;
  for (const auto& unit : units_) total += unit->gathered_bytes();
  gathered_bytes_ = total;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

void FsdpState::wait(const comm::WorkPtr& work) {
  if (work->is_completed()) {
    work->wait();  // rethrows a failure; returns at once
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  work->wait();
  comm_stats_.exposed_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void FsdpState::count_gather(bool prefetch) {
  ++comm_stats_.gathers;
  if (prefetch) ++comm_stats_.prefetched_gathers;
}

void FsdpState::record_forward(Unit* unit) { forward_running_.push_back(unit); }
void FsdpState::record_backward(Unit* unit) { backward_running_.push_back(unit); }

int FsdpState::inflight() const {
  int count = static_cast<int>(pending_reduces_.size());
  for (const auto& unit : units_) count += unit->is_prefetched() ? 1 : 0;
  return count;
}

void FsdpState::finish_oldest_reduce() {
  Unit* unit = pending_reduces_.front();
  pending_reduces_.pop_front();
  unit->finish_reduce();
}

void FsdpState::on_reduce_issued(Unit* unit) {
  pending_reduces_.push_back(unit);
  ++comm_stats_.reductions;
  while (inflight() > options_.max_inflight && !pending_reduces_.empty()) finish_oldest_reduce();
}

// Prefetches up to K units that follow `after` in `order` (from its start when `after` is absent),
// while the budget allows. Every rank follows the same recorded order, so they issue the same gathers.
void FsdpState::prefetch_from(const std::vector<Unit*>& order, Unit* after, int depth) {
  const int budget = options_.max_inflight;
  if (budget <= 0 || options_.strategy == ShardingStrategy::NoShard) return;
  size_t next = 0;
  if (after != nullptr) {
    auto found = std::find(order.begin(), order.end(), after);
    if (found == order.end()) return;
    next = static_cast<size_t>(found - order.begin()) + 1;
  }
  for (size_t i = next; i < order.size() && i < next + static_cast<size_t>(depth); ++i) {
    // Reductions give way to gathers: the unit that runs next matters more than an early wait.
    while (inflight() >= budget && !pending_reduces_.empty()) finish_oldest_reduce();
    if (inflight() >= budget) return;
    order[i]->prefetch();
  }
}

void FsdpState::prefetch_forward_after(Unit* unit) {
  // Forward: up to K units ahead (no reductions compete for the budget).
  if (options_.forward_prefetch) prefetch_from(forward_order_, unit, options_.max_inflight);
}

void FsdpState::prefetch_backward_after(Unit* unit) {
  if (!options_.backward_prefetch) return;
  std::vector<Unit*> order = backward_order_;
  if (order.empty()) order.assign(forward_order_.rbegin(), forward_order_.rend());  // first step: a guess
  // Only units this forward ran can run in this backward; the rest would be gathered for nothing.
  std::vector<Unit*> candidates;
  for (Unit* u : order) {
    if (u == unit || (u->ran_forward() && !u->ran_pre_backward())) candidates.push_back(u);
  }
  // Backward: one unit ahead; the rest of the budget lets reductions finish in the background
  // instead of being waited for as soon as they are issued.
  prefetch_from(candidates, unit->is_root() ? nullptr : unit, 1);
}

void FsdpState::pre_root_forward() {
  for (auto& unit : units_) unit->reset_step();
  forward_running_.clear();
  units_.back()->pre_forward();
}

void FsdpState::post_root_forward(const std::vector<at::Tensor>& outputs) {
  static std::set<std::string> reported;
  for (auto& unit : units_) {
    if (!unit->is_root() && !unit->ran_forward() && reported.insert(unit->name()).second) {
      std::fprintf(stderr,
                   "fsdp [rank %d]: unit '%s' did not run in this forward: unused (allowed), or called without "
                   "fsdp::nn::call (then it ran on freed parameters). Reported once.\n",
                   group_->rank(), unit->name().c_str());
    }
  }
  // Re-recorded whenever it changes (a model whose control flow varies between steps).
  if (forward_running_ != forward_order_) forward_order_ = forward_running_;
  if (!units_.back()->register_pre_backward_hooks(outputs)) reshard_after_eval();
}

void FsdpState::reshard_after_eval() {
  for (auto& unit : units_) unit->release_params();
}

void FsdpState::on_pre_backward() {
  if (backward_callback_queued_) return;
  backward_callback_queued_ = true;
  backward_running_.clear();
  torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_backward(); });
}

void FsdpState::end_of_backward() {
  // Units whose post-backward did not fire (unused this step, or a parameter without gradient) reduce
  // now, in a fixed order, so every rank issues the same collectives.
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) (*it)->post_backward();
  while (!pending_reduces_.empty()) finish_oldest_reduce();
  for (auto& unit : units_) {
    unit->release_params();
    unit->reset_step();
  }
  if (!backward_running_.empty() && backward_running_ != backward_order_) backward_order_ = backward_running_;
  backward_callback_queued_ = false;
}

double FsdpState::communication_seconds() const {
  double seconds = group_->communication_seconds();
  if (groups_.shard != group_) seconds += groups_.shard->communication_seconds();
  if (groups_.replicate) seconds += groups_.replicate->communication_seconds();
  return seconds;
}

std::shared_ptr<FsdpState> make_fsdp_state(std::shared_ptr<torch::nn::Module> root, comm::ProcessGroupPtr group,
                                           FsdpOptions options, std::vector<std::shared_ptr<Unit>> prebuilt) {
  if (!root) throw std::invalid_argument("fully_shard: the model is null");
  const torch::nn::Module* root_id = root.get();
  std::shared_ptr<torch::nn::Module> root_ref = root;
  {
    std::lock_guard<std::mutex> lock(g_wrapped_mutex);
    if (!g_wrapped_roots.insert(root.get()).second || fsdp::nn::find_forward_hooks(root.get()) != nullptr) {
      throw std::invalid_argument("fully_shard: " + root->name() +
                                  " is already wrapped; wrap a model once (its parameters are already sharded)");
    }
  }
  try {
    return std::make_shared<FsdpState>(std::move(root), std::move(group), std::move(options), std::move(prebuilt));
  } catch (...) {
    // Units adopted before the failure registered hooks that point at them: remove them all.
    for (const auto& item : root_ref->named_modules("", /*include_self=*/true)) {
      fsdp::nn::clear_forward_hooks(item.value().get());
    }
    std::lock_guard<std::mutex> lock(g_wrapped_mutex);
    g_wrapped_roots.erase(root_id);
    throw;
  }
}

// ---------------------------------------------------------------------------------------------

BuildListener::BuildListener(const comm::ProcessGroupPtr& group, const FsdpOptions& options) {
  if (!options.wrap_policy.module_paths.empty()) {
    throw std::invalid_argument("build_fully_sharded: wrap by module path needs a built model; use fully_shard, "
                                "or select blocks by type or parameter count");
  }
  groups_ = make_sharding_groups(group, options);
  scope_ = std::make_unique<fsdp::nn::ScopedBlockBuiltListener>(
      [this, options](const std::shared_ptr<torch::nn::Module>& block) {
        if (!options.wrap_policy.selects(*block, "")) return;
        std::unordered_set<const void*> none;
        units_.push_back(std::make_shared<Unit>(block, "", /*is_root=*/false, none, groups_, options));
      });
}

BuildListener::~BuildListener() = default;

std::vector<std::shared_ptr<Unit>> BuildListener::take_units() {
  scope_.reset();
  return std::move(units_);
}

}  // namespace fsdp::runtime
