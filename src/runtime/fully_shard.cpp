#include "fsdp/runtime/fully_shard.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/shard/host_heap.h"
#include "fsdp/shard/storage.h"
#include "prefetch_scheduler.h"
#include "unit.h"

namespace fsdp::runtime {

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

// Does a path of the policy name a module registered as `name` ("embed_tokens" matches
// "embed_tokens" and "language_model.embed_tokens")?
bool policy_path_ends_in(const WrapPolicy& policy, const std::string& name) {
  for (const std::string& path : policy.module_paths) {
    if (path == name || (path.size() > name.size() && path.compare(path.size() - name.size(), name.size(), name) == 0 &&
                         path[path.size() - name.size() - 1] == '.'))
      return true;
  }
  return false;
}

bool is_under(const std::string& name, const std::string& prefix) {
  return prefix.empty() || name.compare(0, prefix.size() + 1, prefix + ".") == 0;
}

std::mutex g_wrapped_mutex;
std::set<const torch::nn::Module*> g_wrapped_roots;

}  // namespace

FsdpState::FsdpState(std::shared_ptr<torch::nn::Module> root, comm::ProcessGroupPtr group, FsdpOptions options,
                     std::vector<std::shared_ptr<Unit>> prebuilt)
    : root_(std::move(root)),
      group_(std::move(group)),
      options_(std::move(options)),
      scheduler_(std::make_unique<PrefetchScheduler>(options_)) {
  check_options();
  // Units built by build_fully_sharded already split the groups: reuse theirs (a split is collective).
  groups_ = prebuilt.empty() ? make_sharding_groups(group_, options_) : prebuilt.front()->groups();
  if (groups_.world != group_) {
    throw std::invalid_argument("build_fully_sharded: the blocks were sharded over another process group");
  }
  const bool any_prebuilt = !prebuilt.empty();
  adopt_prebuilt_units(std::move(prebuilt));
  make_units(select_modules(any_prebuilt));
  std::vector<Unit*> unit_pointers;
  for (const auto& unit : units_) unit_pointers.push_back(unit.get());
  scheduler_->set_units(std::move(unit_pointers));
  prepare_buffers();
  if (options_.device.is_cpu() && options_.host_heap_trim_allowance > 0) {
    heap_guard_.emplace(options_.host_heap_trim_allowance);
  }
  size_buffer_cache();
}

void FsdpState::check_options() const {
  if (!group_) throw std::invalid_argument("fully_shard: the process group is null");
  if (options_.activation_checkpointing_every < 1) {
    throw std::invalid_argument("fully_shard: activation_checkpointing_every must be 1 or more, got " +
                                std::to_string(options_.activation_checkpointing_every));
  }
  if (options_.max_inflight < 0) {
    throw std::invalid_argument("fully_shard: max_inflight must be 0 or more, got " +
                                std::to_string(options_.max_inflight));
  }
  if (options_.host_heap_trim_allowance < 0) {
    throw std::invalid_argument("fully_shard: host_heap_trim_allowance must be 0 or more, got " +
                                std::to_string(options_.host_heap_trim_allowance));
  }
}

std::unordered_map<const torch::nn::Module*, std::string> FsdpState::module_paths() const {
  std::unordered_map<const torch::nn::Module*, std::string> path_of;
  for (const auto& item : root_->named_modules("", /*include_self=*/false)) path_of[item.value().get()] = item.key();
  return path_of;
}

void FsdpState::adopt_prebuilt_units(std::vector<std::shared_ptr<Unit>> prebuilt) {
  const auto path_of = module_paths();
  for (auto& unit : prebuilt) {
    auto found = path_of.find(unit->module().get());
    if (found == path_of.end()) {
      throw std::invalid_argument(
          "build_fully_sharded: a block given to fsdp::nn::push_block is not part of the "
          "built model (was it pushed into a list the model does not register?)");
    }
    // (A block's selection by size would count its parameters, sharded by now: only announced ones.)
    if (!unit->checkpointable() && !options_.wrap_policy.selects(*unit->module(), found->second)) {
      throw std::logic_error("build_fully_sharded: the module at '" + found->second +
                             "' was sharded while built (announced by a name a wrap policy path ends in), but the "
                             "policy does not select that path");
    }
    unit->adopt(this, found->second);
    units_.push_back(std::move(unit));
  }
}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> FsdpState::select_modules(
    bool any_prebuilt) const {
  std::unordered_set<const torch::nn::Module*> prebuilt_modules;
  for (const auto& unit : units_) prebuilt_modules.insert(unit->module().get());
  // Outermost selected modules, in model order; a selected module's descendants are not visited.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> selected;
  std::vector<std::string> taken_prefixes;
  for (const auto& item : root_->named_modules("", /*include_self=*/false)) {
    const std::string& path = item.key();
    bool inside = false;
    for (const std::string& prefix : taken_prefixes) inside |= is_under(path, prefix);
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
  const auto path_of = module_paths();
  for (const std::string& wanted : options_.wrap_policy.module_paths) {
    if (!path_of.empty() &&
        std::none_of(path_of.begin(), path_of.end(), [&](const auto& e) { return e.second == wanted; })) {
      throw std::invalid_argument("fully_shard: the wrap policy names module path '" + wanted + "', which " +
                                  root_->name() + " does not have");
    }
  }
  if (!options_.wrap_policy.empty() && selected.empty() && !any_prebuilt) {
    std::set<std::string> types;
    for (const auto& item : root_->named_modules("", false)) types.insert(short_type_name(*item.value()));
    std::string listed;
    for (const auto& t : types) listed += (listed.empty() ? "" : ", ") + t;
    throw std::invalid_argument("fully_shard: the wrap policy selects no module of " + root_->name() +
                                " (module types present: " + listed +
                                "; min_params considers only blocks added with fsdp::nn::push_block)");
  }
  return selected;
}

void FsdpState::make_units(const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& selected) {
  // A parameter already in a unit is left out of the next ones: check_parameter_ties names it.
  std::unordered_set<const void*> owned = parameter_ids(units_);
  for (const auto& [path, module] : selected) {
    auto unit = std::make_shared<Unit>(module, path, /*is_root=*/false, owned, groups_, options_);
    for (const void* id : parameter_ids({unit})) owned.insert(id);
    unit->adopt(this, path);
    units_.push_back(std::move(unit));
  }
  // Children in model order (prebuilt ones came first, in construction order).
  std::unordered_map<const torch::nn::Module*, size_t> order;
  for (const auto& item : root_->named_modules("", /*include_self=*/false))
    order.emplace(item.value().get(), order.size());
  std::stable_sort(units_.begin(), units_.end(),
                   [&](const auto& a, const auto& b) { return order[a->module().get()] < order[b->module().get()]; });
  check_parameter_ties();
  if (options_.activation_checkpointing) {
    // Every k-th block in model order (torchtitan's selective_ac_option = k counts from 1).
    int block = 0;
    for (const auto& unit : units_) {
      if (unit->checkpointable())
        unit->set_activation_checkpointing(++block % options_.activation_checkpointing_every == 0);
    }
  }
  auto root_unit = std::make_shared<Unit>(root_, "", /*is_root=*/true, owned, groups_, options_);
  root_unit->adopt(this, "");
  units_.push_back(std::move(root_unit));
}

// Cache capacity in fp32 bytes: with bf16 compute, a gradient cast for an fp32 reduction is fp32.
// The reduced gradient shards in flight (up to K + 2 of them) are cached too.
void FsdpState::size_buffer_cache() {
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

// A parameter reachable from two units, or from a unit and a module outside every unit (the
// root), would be flattened twice or used by the root after its unit freed it: wrong values
// without an error. Units leave out parameters another unit took; any parameter a module reaches
// that its unit does not hold is such a tie.
void FsdpState::check_parameter_ties() {
  std::unordered_map<const void*, std::pair<std::string, std::string>> owner;  // id -> (unit, full name)
  for (const auto& unit : units_) {
    for (shard::FlatParam* flat : unit->flat_params()) {
      for (size_t i = 0; i < flat->params().size(); ++i) {
        owner.emplace(flat->params()[i].unsafeGetTensorImpl(),
                      std::make_pair(unit->name(), flat->layout().entries[i].name));
      }
    }
  }
  auto refuse = [](const std::string& name, const std::string& where,
                   const std::pair<std::string, std::string>& other) {
    throw std::invalid_argument("fully_shard: parameter '" + name + "' " + where + " is the same tensor as '" +
                                other.second + "' of unit '" + other.first +
                                "'; a parameter may belong to one unit only: tie it inside one module that the model "
                                "calls for both uses (as models::TokenEmbedding does for a tied embedding and head), "
                                "or select a module holding both as the unit");
  };
  for (const auto& unit : units_) {
    for (const auto& item : unit->module()->named_parameters(true)) {
      auto found = owner.find(item.value().unsafeGetTensorImpl());
      if (found != owner.end() && found->second.first != unit->name()) {
        refuse(unit->name() + "." + item.key(), "of unit '" + unit->name() + "'", found->second);
      }
    }
  }
  for (const auto& item : root_->named_parameters(true)) {
    auto found = owner.find(item.value().unsafeGetTensorImpl());
    if (found != owner.end() && !is_under(item.key(), found->second.first)) {
      refuse(item.key(), "of the root (in no unit)", found->second);
    }
  }
}

void FsdpState::prepare_buffers() {
  torch::NoGradGuard no_grad;
  std::unordered_set<const void*> seen;
  for (const auto& item : root_->named_buffers(true)) {
    at::Tensor buffer = item.value();
    if (!buffer.defined() || !seen.insert(buffer.unsafeGetTensorImpl()).second) continue;
    if (buffer.device() != options_.device) buffer.set_data(buffer.to(options_.device));
    if (!buffer.is_contiguous()) buffer.set_data(buffer.contiguous());
    buffers_.push_back(buffer);
  }
  if (buffers_.empty() || options_.device.is_meta()) return;  // meta buffers have no values to agree on
  if (options_.sync_module_states) {
    for (at::Tensor& buffer : buffers_) wait(group_->broadcast(buffer.variable_data(), 0));
  } else {
    // Same values on every rank, or a clear error naming the first buffer that differs.
    at::Tensor sums = at::empty({static_cast<int64_t>(buffers_.size()), 2}, at::kLong);
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const int64_t sum = shard::checksum(buffers_[i].cpu().contiguous());
      sums[static_cast<int64_t>(i)][0] = sum;
      sums[static_cast<int64_t>(i)][1] = -sum;
    }
    at::Tensor on_device = sums.to(options_.device);
    wait(group_->all_reduce(on_device, comm::ReduceOp::Max));
    at::Tensor agreed = on_device.cpu();
    for (size_t i = 0; i < buffers_.size(); ++i) {
      if (agreed[static_cast<int64_t>(i)][0].item<int64_t>() != -agreed[static_cast<int64_t>(i)][1].item<int64_t>()) {
        std::string name;
        for (const auto& item : root_->named_buffers(true)) {
          if (item.value().unsafeGetTensorImpl() == buffers_[i].unsafeGetTensorImpl()) name = item.key();
        }
        throw std::invalid_argument("fully_shard: buffer '" + name +
                                    "' differs across ranks (initialise with the same "
                                    "seed, or set sync_module_states to take rank 0's)");
      }
    }
  }
}

void FsdpState::sync_buffers() {
  // BatchNorm updates its running statistics inside its kernel, without bumping their version
  // counters, so a change cannot be seen: every buffer is broadcast after each training forward,
  // as DDP's broadcast_buffers does (BatchNorm statistics are small beside the parameters).
  // One broadcast per dtype, not per buffer: a ResNet has over a hundred small buffers, and each
  // collective waited for here blocks the step.
  if (buffers_.empty()) return;
  torch::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& buffer : buffers_) by_dtype[buffer.scalar_type()].push_back(buffer.variable_data());
  for (auto& [dtype, group] : by_dtype) {
    if (group.size() == 1) {
      wait(group_->broadcast(group.front(), 0));
      continue;
    }
    std::vector<at::Tensor> flat_views;
    for (const at::Tensor& buffer : group) flat_views.push_back(buffer.reshape(-1));
    at::Tensor flat = at::cat(flat_views);  // [total numel] of this dtype
    wait(group_->broadcast(flat, 0));
    int64_t offset = 0;
    for (at::Tensor& buffer : group) {
      buffer.view(-1).copy_(flat.narrow(0, offset, buffer.numel()));
      offset += buffer.numel();
    }
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

std::vector<std::string> FsdpState::recomputed_unit_names() const {
  std::vector<std::string> names;
  for (const auto& unit : units_) {
    if (unit->activation_checkpointing()) names.push_back(unit->name());
  }
  return names;
}

int FsdpState::checkpointable_units() const {
  return static_cast<int>(
      std::count_if(units_.begin(), units_.end(), [](const auto& unit) { return unit->checkpointable(); }));
}

void FsdpState::zero_grad() {
  for (auto& unit : units_) unit->drop_grads();
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
      stats.sharded_param_bytes +=
          flat->shard().numel() *
          static_cast<int64_t>(flat->shard().element_size());  // a bf16 frozen base: 2 per element; NF4: its bytes
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

std::vector<std::string> FsdpState::forward_order() const { return names_of(scheduler_->forward_order()); }
std::vector<std::string> FsdpState::backward_order() const { return names_of(scheduler_->backward_order()); }

void FsdpState::on_memory_changed() {
  // A sum over the units, not deltas: a few dozen units, and it cannot drift.
  int64_t total = 0;
  for (const auto& unit : units_) total += unit->gathered_bytes();
  gathered_bytes_ = total;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

void FsdpState::on_unit_released() {
  if (heap_guard_) heap_guard_->check();
}

void FsdpState::wait(const comm::WorkPtr& work) {
  if (work->is_completed()) {
    work->wait();  // rethrows a failure; returns at once
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  if (work->wait_timing_stream()) return;  // the device stream's stand-still: its group counts it
  comm_stats_.exposed_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void FsdpState::count_gather(bool prefetch, int64_t bytes) {
  ++comm_stats_.gathers;
  if (prefetch) ++comm_stats_.prefetched_gathers;
  comm_stats_.gathered_bytes += bytes;
}

void FsdpState::pre_root_forward() {
  for (auto& unit : units_) unit->reset_step();
  scheduler_->begin_forward();
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
  scheduler_->end_forward();
  if (torch::GradMode::is_enabled()) {
    sync_buffers();
    for (auto& unit : units_) unit->release_if_backward_reads_none();
  }
  if (!units_.back()->register_pre_backward_hooks(outputs)) reshard_after_eval();
}

void FsdpState::explain_forward_failure(const std::string& what) const {
  if (what.find("data is not allocated") == std::string::npos) return;
  // The unit that ran without gathering: one that has not run in this forward and holds freed
  // parameters. The previous forward's order says which comes next; otherwise, model order.
  std::vector<const Unit*> suspects;
  const auto& previous = scheduler_->forward_order();
  for (const Unit* unit : previous) {
    if (!unit->ran_forward() && std::find(suspects.begin(), suspects.end(), unit) == suspects.end())
      suspects.push_back(unit);
  }
  for (const auto& unit : units_) {
    if (!unit->is_root() && !unit->ran_forward() &&
        std::find(suspects.begin(), suspects.end(), unit.get()) == suspects.end()) {
      suspects.push_back(unit.get());
    }
  }
  if (suspects.empty()) return;
  std::string others;
  for (size_t i = 1; i < suspects.size(); ++i)
    others += (others.empty() ? "" : ", ") + ("'" + suspects[i]->name() + "'");
  throw std::logic_error(
      "fsdp [rank " + std::to_string(group_->rank()) + "]: unit '" + suspects.front()->name() + "' (" +
      short_type_name(*suspects.front()->module()) +
      ") computed on its sharded parameters, which are freed between uses: the model called it directly "
      "(block->forward(x) or block(x)) instead of through fsdp::nn::call(block, x), so they were never gathered" +
      (others.empty() ? std::string() : " (if not that unit, one of the others that had not run yet: " + others + ")") +
      ". libtorch said: " + what.substr(0, what.find('\n')));
}

void FsdpState::reshard_after_eval() {
  for (auto& unit : units_) unit->release_params();
}

void FsdpState::on_pre_backward() {
  if (backward_callback_queued_) return;
  backward_callback_queued_ = true;
  scheduler_->begin_backward();
  torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_backward(); });
}

void FsdpState::end_of_backward() {
  // Units whose post-backward did not fire (unused this step, or a parameter without gradient) reduce
  // now, in a fixed order, so every rank issues the same collectives.
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) (*it)->post_backward();
  scheduler_->finish_reductions();
  for (auto& unit : units_) {
    unit->release_params();
    unit->reset_step();
  }
  scheduler_->end_backward();
  backward_callback_queued_ = false;
}

double FsdpState::sum_over_groups(double (comm::ProcessGroup::*figure)() const) const {
  double seconds = ((*group_).*figure)();
  if (groups_.shard != group_) seconds += ((*groups_.shard).*figure)();
  if (groups_.replicate) seconds += ((*groups_.replicate).*figure)();
  return seconds;
}

double FsdpState::communication_seconds() const { return sum_over_groups(&comm::ProcessGroup::communication_seconds); }

double FsdpState::exposed_seconds() const {
  return comm_stats_.exposed_seconds + sum_over_groups(&comm::ProcessGroup::stream_wait_seconds);
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
  groups_ = make_sharding_groups(group, options);
  scope_ = std::make_unique<fsdp::nn::ScopedBlockBuiltListener>(
      [this, options](const std::shared_ptr<torch::nn::Module>& module, const std::string& name) {
        // A block (name "") by type or size; an announced module (fsdp::nn::announce_built) when a
        // policy path ends in its name: its whole path is known only once the model is built, and
        // make_fsdp_state checks then that the policy selects it there.
        const bool selected =
            name.empty() ? options.wrap_policy.selects(*module, "") : policy_path_ends_in(options.wrap_policy, name);
        if (!selected) return;
        // A parameter an earlier block took is left out here: make_fsdp_state names the tie.
        auto unit = std::make_shared<Unit>(module, "", /*is_root=*/false, owned_, groups_, options);
        for (const void* id : parameter_ids({unit})) owned_.insert(id);
        units_.push_back(std::move(unit));
        // The block's full parameters (and an NF4 base's quantization temporaries) are free now:
        // their pages go back before the next block is built, so construction's resident peak is
        // about one block plus the shards, not the whole model (freed holes the shards sit between
        // would otherwise stay resident until training starts).
        shard::release_free_host_memory();
      });
}

BuildListener::~BuildListener() = default;

std::vector<std::shared_ptr<Unit>> BuildListener::take_units() {
  scope_.reset();
  return std::move(units_);
}

}  // namespace fsdp::runtime
