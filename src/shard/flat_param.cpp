#include "fsdp/shard/flat_param.h"

#include <torch/torch.h>

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "fsdp/comm/collective_log.h"
#include "fsdp/shard/nf4_storage.h"
#include "fsdp/shard/shard_extent.h"
#include "fsdp/shard/storage.h"

namespace fsdp::shard {

namespace {
// How this buffer's collectives are labelled in the step's collective record (comm/collective_log.h).
std::string unit_label(const std::string& unit_name) { return "unit '" + unit_name + "'"; }
}  // namespace

FlatLayout FlatLayout::make(std::vector<FlatEntry> entries, int num_shards) {
  FlatLayout layout;
  layout.num_shards = num_shards;
  int64_t offset = 0;
  for (FlatEntry& entry : entries) {
    entry.offset = offset;
    offset += entry.numel;
  }
  layout.entries = std::move(entries);
  layout.numel = offset;
  layout.shard_numel = shard_extent(offset, num_shards, kValueShardAlignment);
  layout.padded_numel = layout.shard_numel * num_shards;
  return layout;
}

std::vector<ShardSegment> FlatLayout::segments_of_shard(int shard_index) const {
  std::vector<ShardSegment> segments;
  const int64_t begin = shard_index * shard_numel, end = begin + shard_numel;
  for (size_t i = 0; i < entries.size(); ++i) {
    const int64_t lo = std::max(begin, entries[i].offset);
    const int64_t hi = std::min(end, entries[i].offset + entries[i].numel);
    if (lo < hi) segments.push_back(ShardSegment{i, lo - entries[i].offset, lo - begin, hi - lo});
  }
  return segments;
}

FlatParam::FlatParam(std::string unit_name, std::vector<std::string> names, std::vector<at::Tensor> params,
                     std::vector<std::vector<std::string>> aliases, comm::ProcessGroupPtr group, bool replicate,
                     bool trainable)
    : unit_name_(std::move(unit_name)),
      params_(std::move(params)),
      group_(std::move(group)),
      replicate_(replicate),
      trainable_(trainable) {
  std::vector<FlatEntry> entries;
  const at::Device device = params_.empty() ? at::Device(group_->device_type()) : params_[0].device();
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (p.scalar_type() != at::kFloat || p.device() != device || p.device().type() != group_->device_type()) {
      std::ostringstream what;
      what << "fully_shard: parameter " << names[i] << " of unit '" << unit_name_ << "' is " << p.scalar_type()
           << " on " << p.device() << "; sharded parameters are kept as float32 (mixed precision casts at gather "
           << "time), all on one device, the device of the process group (" << group_->name() << ": "
           << at::Device(group_->device_type()) << "; CUDA parameters need the NCCL backend)";
      throw std::invalid_argument(what.str());
    }
    entries.push_back(FlatEntry{names[i], aliases[i], p.sizes().vec(), 0, p.numel()});
  }
  layout_ = FlatLayout::make(std::move(entries), replicate_ ? 1 : group_->size());

  torch::NoGradGuard no_grad;
  compute_device_ = device;
  // A unit of one parameter that needs no padding (a token embedding, an output head) takes the
  // parameter's own memory as its unsharded buffer: a copy would hold it twice while the unit is
  // made, and an 8 B Llama's embedding and head are 2.1 GB each in fp32 on every rank.
  const bool adopt = params_.size() == 1 && device.is_cpu() && layout_.padded_numel == params_[0].numel() &&
                     params_[0].is_contiguous() && params_[0].storage_offset() == 0 &&
                     params_[0].storage().nbytes() == static_cast<size_t>(params_[0].numel()) * sizeof(float) &&
                     params_[0].storage().use_count() == 1;
  if (adopt) {
    // variable_data(), not detach(): the buffer gets a version counter of its own, as a new buffer
    // has, so gathers writing into it do not count as in-place changes of the parameter autograd
    // saved in forward (detach() shares the counter: cli_strategies' staged hybrid run failed so).
    unsharded_ = params_[0].variable_data().reshape(-1);
    params_[0].set_data(unsharded_.view(layout_.entries[0].shape));
  } else {
    unsharded_ = empty_buffer(layout_.padded_numel, at::kFloat, device).zero_();
  }
  for (size_t i = 0; i < params_.size() && !adopt; ++i) {
    const FlatEntry& entry = layout_.entries[i];
    unsharded_.narrow(0, entry.offset, entry.numel).copy_(params_[i].reshape(-1));
    // The parameter keeps its TensorImpl (and so its grad accumulator); its data becomes a view.
    params_[i].set_data(unsharded_.narrow(0, entry.offset, entry.numel).view(entry.shape));
  }
  if (replicate_) {
    shard_ = unsharded_;
  } else {
    shard_ = empty_buffer(layout_.shard_numel, at::kFloat, device);
    shard_.copy_(unsharded_.narrow(0, shard_index() * layout_.shard_numel, layout_.shard_numel));
  }
  // shard_grad_ is allocated by the first reduction: building a model holds parameters only.
}

bool FlatParam::is_unsharded() const { return nf4_landing_ || storage_is_allocated(unsharded_); }

void FlatParam::set_storage_dtype(at::ScalarType dtype) {
  if (nf4_)
    throw std::logic_error("FlatParam '" + unit_name_ + "': stored as NF4; its other entries' dtype was set with it");
  if (dtype == shard_.scalar_type()) return;
  if (trainable_) throw std::invalid_argument("fully_shard: only frozen parameters may be stored in another dtype");
  if (replicate_)
    throw std::invalid_argument(
        "fully_shard: frozen parameters in another dtype need a sharding strategy (not no_shard)");
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    throw std::invalid_argument(std::string("fully_shard: frozen parameters are stored in float32 or bfloat16, not ") +
                                c10::toString(dtype));
  }
  torch::NoGradGuard no_grad;
  shard_ = shard_.to(dtype);
}

void FlatParam::set_precision(at::ScalarType compute, at::ScalarType reduce) {
  for (at::ScalarType dtype : {compute, reduce}) {
    if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
      throw std::invalid_argument(
          std::string("fully_shard: mixed precision supports float32, bfloat16 and float16, not ") +
          c10::toString(dtype));
    }
  }
  reduce_dtype_ = reduce;
  if (compute == compute_dtype_) return;
  if (replicate_) {
    throw std::invalid_argument(
        std::string("fully_shard: a ") + c10::toString(compute) +
        " parameter dtype needs sharded parameters (full_shard, shard_grad_op or hybrid_shard); "
        "no_shard keeps float32 parameters");
  }
  if (!holds_grads() && is_unsharded()) reshard();
  compute_dtype_ = compute;
  torch::NoGradGuard no_grad;
  unsharded_ = empty_buffer(layout_.padded_numel, compute, device());
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatEntry& entry = layout_.entries[i];
    // A dtype change drops the parameter's grad accumulator: the unit creates it afterwards.
    params_[i].set_data(unsharded_.narrow(0, entry.offset, entry.numel).view(entry.shape));
  }
  free_storage(unsharded_);
}

namespace {

// Keeps the gather's staging buffers alive until the gather is done, then frees them (into the
// buffer cache when caching: the next unit's gather reuses them). `input`: the shard copied or
// cast for sending, if it is not the shard itself. `wire_output`: where the gather landed when it
// travelled in another form than the compute dtype (a bf16 LoRA base under fp32 compute, NF4
// bytes); wait() lands it into the unsharded buffer once, through `land`.
class GatherWork final : public comm::Work {
 public:
  using Land = std::function<void(const at::Tensor& wire_output)>;
  GatherWork(comm::WorkPtr inner, at::Tensor input, at::Tensor wire_output, Land land, bool cache)
      : inner_(std::move(inner)),
        input_(std::move(input)),
        wire_output_(std::move(wire_output)),
        land_(std::move(land)),
        cache_(cache) {}
  void wait() override {
    inner_->wait();
    finish_gather();
  }
  bool wait_timing_stream() override {
    const bool timed = inner_->wait_timing_stream();
    finish_gather();
    return timed;
  }
  bool is_completed() override { return inner_->is_completed(); }
  double busy_seconds() const override { return inner_->busy_seconds(); }

 private:
  // After the gather: the wire buffer cast into the unsharded parameters, both buffers let go.
  void finish_gather() {
    if (input_.defined()) free_storage(input_, cache_);
    input_ = at::Tensor();
    if (wire_output_.defined()) {
      torch::NoGradGuard no_grad;
      land_(wire_output_);
      free_storage(wire_output_, cache_);
      wire_output_ = at::Tensor();
    }
  }

  comm::WorkPtr inner_;
  at::Tensor input_;
  at::Tensor wire_output_;
  Land land_;
  bool cache_;
};

}  // namespace

at::ScalarType FlatParam::wire_dtype() const {
  if (nf4_) return at::kByte;
  // The narrower of the stored and the computed dtype: a bf16 base travels as bf16 even when fp32
  // compute widens it afterwards; an fp32 master travels as bf16 under bf16 compute.
  const at::ScalarType stored = shard_.scalar_type();
  return c10::elementSize(stored) < c10::elementSize(compute_dtype_) ? stored : compute_dtype_;
}

comm::WorkPtr FlatParam::unshard_async() {
  if (replicate_ || is_unsharded()) return nullptr;
  const comm::CollectiveLabel label(unit_label(unit_name_));
  if (nf4_) {
    // [shard_bytes] uint8 on the device (offloaded: copied from pinned host memory on the
    // caller's stream), gathered into [padded_bytes] uint8. unsharded_ is allocated and decoded
    // into at wait(), when the unit is about to run: a prefetched unit holds its NF4 bytes alone
    // (about 4.1 bits a weight), not its values in the compute dtype as well.
    at::Tensor input;
    if (offload_) {
      input = empty_from_cache(nf4_->shard_bytes, at::kByte, compute_device_);
      input.copy_(shard_, /*non_blocking=*/true);
    }
    at::Tensor wire_output = empty_from_cache(nf4_->padded_bytes, at::kByte, compute_device_);
    comm::WorkPtr work = group_->all_gather(wire_output, input.defined() ? input : shard_);
    nf4_landing_ = true;
    std::shared_ptr<const Nf4StorageLayout> storage = nf4_;
    const FlatLayout* layout = &layout_;
    at::Tensor unsharded = unsharded_;
    const size_t unsharded_nbytes = static_cast<size_t>(unsharded_bytes());
    bool* landing = &nf4_landing_;
    return std::make_shared<GatherWork>(
        std::move(work), input, wire_output,
        [storage, layout, unsharded, unsharded_nbytes, landing](const at::Tensor& bytes) {
          allocate_storage(unsharded, unsharded_nbytes);  // the storage the params' views share
          decode_nf4_storage(*storage, *layout, bytes, unsharded.variable_data());
          *landing = false;
        },
        cache_buffers_);
  }
  allocate_storage(unsharded_, static_cast<size_t>(unsharded_bytes()));
  if (alone()) {
    // The shard is the whole unit: cast (or copied from host memory) into the unsharded buffer on
    // the caller's stream, the values a gather in the wire dtype would land. variable_data(): a
    // version counter of its own, as the collective's raw writes bump none.
    unsharded_.variable_data().copy_(shard_, /*non_blocking=*/offload_);
    return comm::completed_work();
  }
  // Writes through the raw pointer: no version bump, so autograd's saved views stay acceptable.
  const at::ScalarType wire = wire_dtype();
  if (wire == shard_.scalar_type() && wire == compute_dtype_ && !offload_)
    return group_->all_gather(unsharded_, shard_);
  // [shard_numel] wire dtype on the compute device, freed after the gather. Offloaded: a copy from
  // pinned host memory, asynchronous on the caller's stream (the gather is ordered after it).
  at::Tensor input;
  if (wire != shard_.scalar_type() || offload_) {
    input = empty_from_cache(layout_.shard_numel, wire, compute_device_);
    input.copy_(shard_, /*non_blocking=*/offload_);
  }
  // [padded_numel] wire dtype: where a narrower gather lands before widening into unsharded_.
  at::Tensor wire_output;
  if (wire != compute_dtype_) wire_output = empty_from_cache(layout_.padded_numel, wire, compute_device_);
  comm::WorkPtr work =
      group_->all_gather(wire_output.defined() ? wire_output : unsharded_, input.defined() ? input : shard_);
  at::Tensor unsharded = unsharded_;
  return std::make_shared<GatherWork>(
      std::move(work), input, wire_output,
      [unsharded](const at::Tensor& wire_values) { unsharded.variable_data().copy_(wire_values); }, cache_buffers_);
}

int64_t FlatParam::gather_wire_bytes() const {
  if (nf4_) return nf4_->padded_bytes;
  return layout_.padded_numel * static_cast<int64_t>(c10::elementSize(wire_dtype()));
}

void FlatParam::set_nf4_storage(const std::vector<bool>& nf4, bool double_quant, at::ScalarType raw_dtype,
                                bool encode_values) {
  if (trainable_)
    throw std::invalid_argument("fully_shard: only frozen parameters may be stored as NF4 (unit '" + unit_name_ + "')");
  if (replicate_) throw std::invalid_argument("fully_shard: an NF4 base needs a sharding strategy (not no_shard)");
  if (nf4_) throw std::logic_error("FlatParam '" + unit_name_ + "': already stored as NF4");
  if (!is_unsharded() || offload_) {
    throw std::logic_error("FlatParam '" + unit_name_ +
                           "': set NF4 storage at construction, while the values are whole");
  }
  auto storage =
      std::make_shared<Nf4StorageLayout>(Nf4StorageLayout::make(layout_, nf4, group_->size(), double_quant, raw_dtype));
  torch::NoGradGuard no_grad;
  // Every rank holds the whole unit here (built alike everywhere); each encodes the weights whose
  // bytes overlap its shard, one at a time.
  nf4_ = std::move(storage);
  if (!encode_values) {
    shard_ = at::zeros({nf4_->shard_bytes}, at::TensorOptions(at::kByte).device(compute_device_));
    return;
  }
  const at::Tensor values = unsharded_;
  shard_ = nf4_shard_for([&](size_t i) {
             const FlatEntry& entry = layout_.entries[i];
             return values.narrow(0, entry.offset, entry.numel);
           }).to(compute_device_);
}

at::Tensor FlatParam::nf4_shard_for(const std::function<at::Tensor(size_t entry)>& values_of) const {
  return nf4_shard_from_entries([&](size_t i) { return encode_nf4_entry(*nf4_, i, values_of(i)); });
}

at::Tensor FlatParam::nf4_shard_from_entries(const std::function<at::Tensor(size_t entry)>& entry_bytes_of) const {
  if (!nf4_) throw std::logic_error("FlatParam '" + unit_name_ + "': nf4_shard_for on a FlatParam not stored as NF4");
  const int64_t begin = shard_index() * nf4_->shard_bytes, end = begin + nf4_->shard_bytes;
  at::Tensor out = at::zeros({nf4_->shard_bytes}, at::kByte);  // the padding stays zeros
  for (size_t i = 0; i < nf4_->entries.size(); ++i) {
    const Nf4EntryLayout& entry = nf4_->entries[i];
    const int64_t lo = std::max(begin, entry.begin), hi = std::min(end, entry.end);
    if (lo >= hi) continue;
    const at::Tensor bytes = entry_bytes_of(i);
    out.narrow(0, lo - begin, hi - lo).copy_(bytes.narrow(0, lo - entry.begin, hi - lo));
  }
  return out;
}

int64_t FlatParam::gathered_bytes() const {
  int64_t bytes = 0;
  if (!replicate_ && storage_is_allocated(unsharded_)) bytes += unsharded_bytes();
  if (nf4_landing_) bytes += nf4_->padded_bytes;  // gathered, not yet decoded
  bytes += held_grad_bytes();
  if (reduce_input_.defined()) bytes += reduce_input_.nbytes();
  return bytes;
}

void FlatParam::unshard() {
  if (auto work = unshard_async()) work->wait();
}

void FlatParam::reshard() {
  // An NF4 gather in flight would allocate and decode at its wait, after this: wait for it first.
  if (nf4_landing_) throw std::logic_error("FlatParam '" + unit_name_ + "': reshard while its NF4 gather is in flight");
  if (!replicate_) free_storage(unsharded_, cache_buffers_);
}

bool FlatParam::holds_grads() const {
  for (const at::Tensor& p : params_)
    if (p.grad().defined()) return true;
  return false;
}

int64_t FlatParam::held_grad_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor& p : params_)
    if (p.grad().defined()) bytes += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
  return bytes;
}

bool FlatParam::shard_grad_counts_as_zeros() const { return !shard_grad_.defined() || shard_grad_zeroed_; }

void FlatParam::pack_grads(const at::Tensor& out, bool overwrite, bool round_through_reduce_dtype) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatEntry& entry = layout_.entries[i];
    at::Tensor destination = out.narrow(0, entry.offset, entry.numel);
    const at::Tensor& grad = params_[i].grad();
    if (!grad.defined()) {
      if (overwrite) destination.zero_();  // unused this step (or a unit unused altogether): zeros
      continue;
    }
    at::Tensor values = grad.reshape(-1);
    if (round_through_reduce_dtype) values = values.to(reduce_dtype_);
    if (overwrite) {
      destination.copy_(values);
    } else {
      destination.add_(values);
    }
  }
  if (overwrite && out.numel() > layout_.numel) out.narrow(0, layout_.numel, out.numel() - layout_.numel).zero_();
}

comm::WorkPtr FlatParam::reduce_grad_async() {
  if (!trainable_) return nullptr;
  torch::NoGradGuard no_grad;
  // Alone, the reduction is the gradient itself, in the reduce dtype's values (rounded through it
  // only where that is neither the compute dtype nor fp32, as a reduce-scatter's input would be;
  // no_shard's all-reduce takes the fp32 gradient as it is).
  const bool rounds = alone() && !replicate_ && reduce_dtype_ != compute_dtype_ && reduce_dtype_ != at::kFloat;
  const bool first = shard_grad_counts_as_zeros();
  if (alone() && !offload_) {
    take_shard_grad();
    pack_grads(shard_grad_, /*overwrite=*/first, rounds);
    return comm::completed_work();
  }
  if (alone()) {  // offloaded: the device's gradient, copied to the host's shard_grad at finish
    reduce_input_ = empty_from_cache(layout_.padded_numel, at::kFloat, device());
    pack_grads(reduce_input_, /*overwrite=*/true, rounds);
    return comm::completed_work();
  }
  const comm::CollectiveLabel label(unit_label(unit_name_));
  if (replicate_) {  // no_shard: the fp32 gradient all-reduced in place, into shard_grad when it is the step's first
    if (first) {
      take_shard_grad();
      reduced_in_shard_grad_ = true;
    } else {
      reduce_input_ = empty_from_cache(layout_.padded_numel, compute_dtype_, device());
    }
    const at::Tensor& buffer = first ? shard_grad_ : reduce_input_;
    pack_grads(buffer, /*overwrite=*/true, /*round_through_reduce_dtype=*/false);
    return group_->all_reduce(buffer, comm::ReduceOp::Average);
  }
  // [padded_numel] reduce dtype: each gradient cast once into the reduce-scatter's input.
  reduce_input_ = empty_from_cache(layout_.padded_numel, reduce_dtype_, device());
  pack_grads(reduce_input_, /*overwrite=*/true, /*round_through_reduce_dtype=*/false);
  // The step's first fp32 reduction writes this rank's shard gradient itself (FSDP2's path); one
  // accumulating, offloaded or in another dtype lands beside it and is added at finish.
  if (first && !offload_ && reduce_dtype_ == at::kFloat) {
    take_shard_grad();
    reduced_grad_ = shard_grad_;
    reduced_in_shard_grad_ = true;
  } else {
    reduced_grad_ = empty_from_cache(layout_.shard_numel, reduce_dtype_, device());
  }
  return group_->reduce_scatter(reduced_grad_, reduce_input_, comm::ReduceOp::Average);
}

void FlatParam::take_shard_grad() {
  if (!shard_grad_.defined()) shard_grad_ = empty_buffer(layout_.shard_numel, at::kFloat, device());
  shard_grad_zeroed_ = false;  // being overwritten: the lazy zeros must not land on it afterwards
}

comm::WorkPtr FlatParam::reduce_across_replicas_after(const comm::WorkPtr& reduce_scatter) {
  if (!replica_group_ || !trainable_) return nullptr;
  if (!reduced_grad_.defined()) {
    throw std::logic_error("FlatParam '" + unit_name_ + "': reduce_across_replicas_after without a reduced gradient");
  }
  // On the replica group's own thread (or stream), once the reduce-scatter has written the shard,
  // while the shard group reduces the next unit. Issued now, whatever the timing: every rank issues
  // the shard group's and the replica group's collectives in the same order.
  const comm::CollectiveLabel label(unit_label(unit_name_));
  if (!replica_reduce_)
    replica_reduce_ = replica_group_->all_reduce_after(reduce_scatter, reduced_grad_, comm::ReduceOp::Average);
  return replica_reduce_;
}

void FlatParam::finish_reduce_grad() {
  if (!trainable_) return;
  torch::NoGradGuard no_grad;
  // HybridShard: the shard group's average, averaged again over the replicas = the world's average.
  if (replica_group_) {
    if (!replica_reduce_) reduce_across_replicas_after(nullptr);  // the reduce-scatter was waited for
    replica_reduce_->wait();
    replica_reduce_ = nullptr;
  }
  // Alone and on the device, reduce_grad_async wrote shard_grad already; so did a reduction into it.
  const bool written = (alone() && !offload_) || reduced_in_shard_grad_;
  if (!written) {
    const at::Tensor reduced = reduced_grad_.defined() ? reduced_grad_ : reduce_input_;
    add_reduced_to_shard_grad(reduced);
  }
  if (reduced_grad_.defined() && !reduced_in_shard_grad_) free_storage(reduced_grad_, cache_buffers_);
  reduced_grad_ = at::Tensor();
  reduced_in_shard_grad_ = false;
  if (reduce_input_.defined()) free_storage(reduce_input_, cache_buffers_);
  reduce_input_ = at::Tensor();
}

void FlatParam::add_reduced_to_shard_grad(const at::Tensor& reduced) {
  if (offload_) {
    if (shard_grad_.defined() && !shard_grad_zeroed_) {
      wait_for_shard_grad();
      shard_grad_.add_(reduced.to(at::kCPU));  // accumulating (micro-batches with sync): waits for the copy
    } else {
      // The step's first gradient overwrites the buffer: asynchronous into pinned memory (fp32 <- reduce dtype).
      if (!shard_grad_.defined())
        shard_grad_ = at::empty({layout_.shard_numel}, shard_.options().pinned_memory(shard_.is_pinned()));
      shard_grad_.copy_(reduced, /*non_blocking=*/true);
      shard_grad_zeroed_ = false;
      host_copy_pending_ = !compute_device_.is_cpu();
    }
  } else if (shard_grad_.defined() && !shard_grad_zeroed_) {
    shard_grad_.add_(reduced);  // accumulating (micro-batches with sync): fp32 += reduce dtype
  } else {
    // The step's first gradient overwrites the buffer: one copy, where zeroing it at the step's
    // start and adding would be two more passes over the fp32 shard.
    take_shard_grad();
    shard_grad_.copy_(reduced);  // fp32 <- reduce dtype
  }
}

void FlatParam::set_cpu_offload(bool on) {
  if (on == offload_) return;
  if (replicate_)
    throw std::invalid_argument("FlatParam '" + unit_name_ + "': CPU offload needs sharded parameters (not no_shard)");
  if (is_unsharded() || shard_grad_.defined()) {
    throw std::logic_error("FlatParam '" + unit_name_ + "': set CPU offload while resharded and before any backward");
  }
  torch::NoGradGuard no_grad;
  // Pinned (page-locked) host memory lets copies to and from a GPU run asynchronously.
  const bool pin = on && !compute_device_.is_cpu();
  const int64_t numel = shard_.numel();  // shard_numel, or shard_bytes of NF4
  at::Tensor moved = pin ? at::empty({numel}, at::TensorOptions().dtype(shard_.scalar_type()).pinned_memory(true))
                         : empty_buffer(numel, shard_.scalar_type(), on ? at::Device(at::kCPU) : compute_device_);
  moved.copy_(shard_);
  shard_ = moved;
  offload_ = on;
}

void FlatParam::wait_for_shard_grad() {
  if (host_copy_pending_) {
    shard::synchronize_current_stream(compute_device_);
    host_copy_pending_ = false;
  }
  if (shard_grad_zeroed_) {  // zeroed lazily, and no reduction wrote it since: zeros it is
    shard_grad_.zero_();
    shard_grad_zeroed_ = false;
  }
}

void FlatParam::zero_shard_grad() {
  if (!shard_grad_.defined()) return;
  // Not written here: the step's first reduction overwrites the buffer (asynchronously when
  // offloaded) instead of adding to zeros. A pending copy must land before the buffer is reused.
  if (host_copy_pending_) {
    shard::synchronize_current_stream(compute_device_);
    host_copy_pending_ = false;
  }
  shard_grad_zeroed_ = true;
}

void FlatParam::drop_grads() {
  for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
}

void FlatParam::set_replica_group(comm::ProcessGroupPtr group) {
  if (replicate_)
    throw std::invalid_argument("FlatParam '" + unit_name_ + "': a replicated (NO_SHARD) buffer has no replica group");
  replica_group_ = group && group->size() > 1 ? std::move(group) : nullptr;
}

namespace {

// Throws unless every rank of `group` computed the same checksum.
void check_same_checksum(const comm::ProcessGroupPtr& group, int64_t mine, const std::string& unit_name,
                         const std::string& first_entry) {
  at::Tensor extremes = at::tensor({mine, -mine}, at::kLong);
  group->all_reduce(extremes, comm::ReduceOp::Max)->wait();
  const int64_t highest = extremes[0].item<int64_t>(), lowest = -extremes[1].item<int64_t>();
  if (highest != lowest) {
    throw std::runtime_error(
        "fully_shard: the parameters of unit '" + unit_name + "' (first: " + first_entry + ") differ across ranks (" +
        group->name() + " rank " + std::to_string(group->rank()) + " checksum " + std::to_string(mine) +
        "): seed every rank alike before building the model, or set sync_module_states to broadcast rank 0's");
  }
}

}  // namespace

void FlatParam::verify_same_across_ranks(bool broadcast_from_rank0) {
  if (!is_unsharded() && !replicate_) unshard();
  const std::string first_entry = layout_.entries.empty() ? std::string("-") : layout_.entries[0].name;
  if (broadcast_from_rank0) {
    group_->broadcast(unsharded_, 0)->wait();
    if (!replicate_) {
      shard_.copy_(unsharded_.narrow(0, shard_index() * layout_.shard_numel, layout_.shard_numel));
    }
    // Replica group rank 0 sits in replica group 0, whose shard group holds world rank 0.
    if (replica_group_) replica_group_->broadcast(shard_, 0)->wait();
    return;
  }
  check_same_checksum(group_, checksum(unsharded_), unit_name_, first_entry);
  if (replica_group_) check_same_checksum(replica_group_, checksum(shard_), unit_name_, first_entry);
}

void FlatParam::prefix_names(const std::string& prefix) {
  if (prefix.empty()) return;
  // A unit built before its path was known (build_fully_sharded) learns its name here too.
  if (unit_name_.empty() || unit_name_ == "<root>") unit_name_ = prefix;
  for (FlatEntry& entry : layout_.entries) {
    entry.name = prefix + "." + entry.name;
    for (std::string& alias : entry.aliases) alias = prefix + "." + alias;
  }
}

std::vector<at::Tensor> FlatParam::gather_full_params() const {
  if (nf4_) {  // the bytes gathered, each entry decoded to fp32
    at::Tensor bytes = at::empty({nf4_->padded_bytes}, shard_.options().device(compute_device_));
    group_->all_gather(bytes, shard_.to(compute_device_))->wait();
    at::Tensor values = at::empty({layout_.padded_numel}, bytes.options().dtype(at::kFloat));
    decode_nf4_storage(*nf4_, layout_, bytes, values);
    std::vector<at::Tensor> out;
    for (const FlatEntry& entry : layout_.entries)
      out.push_back(values.narrow(0, entry.offset, entry.numel).view(entry.shape).clone());
    return out;
  }
  at::Tensor full = shard_;
  if (!replicate_) {
    full = at::empty({layout_.padded_numel}, shard_.options());
    group_->all_gather(full, shard_)->wait();
  }
  std::vector<at::Tensor> out;
  for (const FlatEntry& entry : layout_.entries) {
    out.push_back(full.narrow(0, entry.offset, entry.numel).view(entry.shape).clone());
  }
  return out;
}

int64_t checksum(const at::Tensor& device_tensor) {
  // FNV-1a over 64-bit words (the tail byte by byte): fast enough to run on every unit at wrap time.
  const at::Tensor t = device_tensor.cpu().contiguous();  // a GPU buffer is hashed from a host copy (wrap time only)
  const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
  const size_t n = t.numel() * t.element_size();
  uint64_t hash = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    hash = (hash ^ word) * 1099511628211ull;
  }
  for (; i < n; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return static_cast<int64_t>(hash >> 1);  // non-negative, so max and -max can compare ranks
}

}  // namespace fsdp::shard
