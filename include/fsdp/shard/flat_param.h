// fsdp/shard/flat_param.h: a group of parameters flattened into one padded buffer, of which
// each rank keeps one contiguous slice.
//
//   unsharded  [padded_numel] compute dtype  parameters are views of it; memory freed while resharded
//   shard      [shard_numel]  fp32   this rank's slice: the master copy the optimizer updates
//   shard_grad [shard_numel]  fp32   this rank's slice of the averaged gradient (trainable only;
//                                     undefined until the first backward reduces into it)
//   .grad of each parameter          compute dtype  autograd's own tensors until the unit reduces them
//
// The compute dtype is fp32 unless mixed precision sets another (bf16): then the gather sends the
// shard cast to bf16 (half the traffic and half the gathered memory), the parameters are bf16
// tensors for good, gradients come out in bf16 and are reduced in the reduce dtype (fp32 by
// default: cast once, then reduce-scattered), and the fp32 shard stays the master copy.
//
// shard_numel is the parameters' total divided among the group, rounded up so that every rank's
// shard starts on 16 bytes (shard/shard_extent.h); padded_numel = shard_numel * group size
// (NO_SHARD: the whole buffer, replicated).
// A parameter keeps its identity and shape for its whole life (set_data to a view), so autograd's
// gradient accumulators and hooks on it stay valid.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::shard {

struct Nf4StorageLayout;  // nf4_storage.h

struct FlatEntry {
  std::string name;                  // e.g. "blocks.3.attn.qkv.weight"
  std::vector<std::string> aliases;  // other names of the same (tied) parameter
  std::vector<int64_t> shape;
  int64_t offset = 0;  // first element in the unsharded buffer
  int64_t numel = 0;
};

// A piece of one entry that falls into one rank's shard.
struct ShardSegment {
  size_t entry = 0;          // index into FlatLayout::entries
  int64_t entry_offset = 0;  // first element of the piece inside the entry (flattened)
  int64_t shard_offset = 0;  // where it sits in the shard
  int64_t length = 0;
};

struct FlatLayout {
  std::vector<FlatEntry> entries;
  int64_t numel = 0;         // sum of the entries
  int64_t padded_numel = 0;  // shard_numel * number of shards
  int64_t shard_numel = 0;   // shard_extent(numel, number of shards, kValueShardAlignment)
  int num_shards = 1;

  static FlatLayout make(std::vector<FlatEntry> entries, int num_shards);
  // The pieces of the entries inside shard `shard_index`, in order (padding belongs to none).
  std::vector<ShardSegment> segments_of_shard(int shard_index) const;
};

class FlatParam {
 public:
  // Takes over `params` (same order as names): copies their values into the flat buffer, makes each
  // a view of it, and keeps this rank's slice. `replicate`: NO_SHARD (every rank keeps everything).
  FlatParam(std::string unit_name, std::vector<std::string> names, std::vector<at::Tensor> params,
            std::vector<std::vector<std::string>> aliases, comm::ProcessGroupPtr group, bool replicate, bool trainable);

  const std::string& unit_name() const { return unit_name_; }
  const FlatLayout& layout() const { return layout_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  bool trainable() const { return trainable_; }
  bool replicated() const { return replicate_; }
  // One rank holds the whole unit (a group of one, no replicas: N = 1): a gather is the shard cast
  // into the unsharded buffer and a reduction the gradient itself, on the caller's stream, and no
  // collective is issued (an NF4 base's bytes are still gathered, then decoded).
  bool alone() const { return group_->size() == 1 && !replica_group_; }
  const comm::ProcessGroupPtr& group() const { return group_; }
  int shard_index() const { return replicate_ ? 0 : group_->rank(); }

  at::Tensor& shard() { return shard_; }
  at::Tensor& shard_grad() { return shard_grad_; }  // [shard_numel] fp32; read after wait_for_shard_grad()
  const at::Tensor& unsharded() const { return unsharded_; }

  // Mixed precision: gather and compute in `compute` (the parameters become tensors of that dtype;
  // call before their grad accumulators are created), reduce gradients in `reduce`. Call once,
  // while resharded. Not for replicated (NO_SHARD) parameters.
  void set_precision(at::ScalarType compute, at::ScalarType reduce);
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  // Keeps this (frozen) FlatParam's shard in `dtype` (bf16 for a LoRA base). Throws for a
  // trainable one (its shard is the fp32 master) and under no_shard.
  void set_storage_dtype(at::ScalarType dtype);
  // QLoRA: keeps this frozen FlatParam as bitsandbytes' NF4 (shard/nf4_storage.h): the entries
  // `nf4` selects (linear weights) quantized, the others in `raw_dtype`; the shard becomes this
  // rank's shard_bytes of the encoded bytes (uint8), a gather moves those bytes and decodes them
  // into the compute dtype. Call while unsharded, with the values to quantize in place (at
  // construction); throws for a trainable or replicated FlatParam. encode_values false: the shard's
  // bytes are zeros, for the caller to fill (loading weights: nf4_shard_for) before any gather.
  void set_nf4_storage(const std::vector<bool>& nf4, bool double_quant, at::ScalarType raw_dtype,
                       bool encode_values = true);
  // The NF4 layout, or nullptr when the shard holds the values themselves.
  const Nf4StorageLayout* nf4_storage() const { return nf4_.get(); }
  // This rank's shard of the NF4 bytes (uint8 [shard_bytes], CPU) for new entry values (loading
  // weights): `values_of(i)` returns entry i's values, and is called only for the entries whose
  // bytes overlap this rank's shard (each is quantized whole: its blocks and double quantization
  // span it). Local; no collective. The caller copies the result into shard().
  at::Tensor nf4_shard_for(const std::function<at::Tensor(size_t entry)>& values_of) const;
  // The same from each overlapping entry's encoded bytes (uint8 [entry.end - entry.begin]:
  // encode_nf4_entry or nf4_entry_bytes).
  at::Tensor nf4_shard_from_entries(const std::function<at::Tensor(size_t entry)>& entry_bytes_of) const;
  // What a gather sends: the narrower of the shard's dtype and the compute dtype (a bf16 base is
  // gathered as bf16 and widened after, under fp32 compute; an fp32 master is cast to bf16 first
  // under bf16 compute). gather_wire_bytes: the bytes one gather delivers to each rank.
  at::ScalarType wire_dtype() const;
  int64_t gather_wire_bytes() const;
  // Where the gathered buffers live and compute runs: the parameters' device (CPU, or this rank's
  // GPU). The shard, its gradient and the optimizer state live there too, unless offloaded.
  at::Device device() const { return compute_device_; }

  // CPU offload: the fp32 shard and its gradient move to host memory (pinned when the compute
  // device is a GPU, so copies run asynchronously); the optimizer steps them on the CPU. A gather
  // first copies the shard to the device (on the caller's stream, ordered before the gather); a
  // reduced gradient is copied back, asynchronously when it is the step's first (accumulating
  // into an existing one waits for the copy). Call once, while resharded, before any backward;
  // not for replicated (NO_SHARD) parameters.
  void set_cpu_offload(bool on);
  bool cpu_offload() const { return offload_; }
  // Before reading shard_grad (the optimizer, the norm): lands an offloaded gradient's copy, and
  // writes the zeros of a gradient zero_shard_grad marked and no reduction has overwritten since.
  void wait_for_shard_grad();
  // The optimizer's zero_grad for this shard: marked, not written; the next reduction overwrites it.
  void zero_shard_grad();
  at::ScalarType reduce_dtype() const { return reduce_dtype_; }

  // Gathers every rank's shard into the unsharded buffer (allocating it; NF4: allocating it at the
  // work's wait(), which decodes into it); params become usable once the work is waited for.
  // Returns nullptr when nothing had to be done (already unsharded or in flight, or replicated).
  comm::WorkPtr unshard_async();
  void unshard();
  // Frees the unsharded buffer (not for replicated params, whose buffer is the shard).
  void reshard();
  bool is_unsharded() const;

  // Gradients, as FSDP2 takes them: autograd's AccumulateGrad keeps each parameter's gradient
  // tensor as it comes (summing micro-batches without sync into it). reduce: casts each once into
  // the reduction's input [padded_numel] in the reduce dtype (zeros for a parameter without one)
  // and returns the reduction's work (the caller then drops the gradients: drop_grads); the step's first fp32 reduction
  // writes shard_grad itself, a later one (micro-batches with sync), an offloaded or a narrower one lands beside it and
  // finish_reduce adds it in. Alone, the gradients go straight into shard_grad.
  bool holds_grads() const;  // a parameter's .grad is defined (produced, not yet reduced)
  comm::WorkPtr reduce_grad_async();
  void finish_reduce_grad();
  void drop_grads();  // forgets the parameters' gradients (packed for a reduction, or zero_grad)

  // HybridShard: the ranks that hold this shard in the other replica groups. The reduced gradient
  // shard is then averaged across them before it is added to shard_grad: reduce_across_replicas_after
  // issues that all-reduce right behind the reduce-scatter (finish_reduce_grad issues and waits for
  // it if the caller did not). verify_same_across_ranks covers them too. Call before the first
  // backward.
  void set_replica_group(comm::ProcessGroupPtr group);
  const comm::ProcessGroupPtr& replica_group() const { return replica_group_; }
  // Issues the all-reduce across replicas of the gradient shard `reduce_scatter` (reduce_grad_async's
  // work) writes, to start once that completes (ProcessGroup::all_reduce_after): neither the host
  // nor the compute stream waits. Returns its work (null without a replica group); wait for it
  // before finish_reduce_grad.
  comm::WorkPtr reduce_across_replicas_after(const comm::WorkPtr& reduce_scatter);

  // Checks (collective) that every rank holds the same values, by a checksum; with
  // broadcast_from_rank0, overwrites them with rank 0's instead. Call while unsharded.
  void verify_same_across_ranks(bool broadcast_from_rank0);

  // Prepends "prefix." to every name, once the unit's path in the model is known.
  void prefix_names(const std::string& prefix);

  // The full (unpadded) tensor of every entry, gathered from all ranks. Collective.
  std::vector<at::Tensor> gather_full_params() const;

  // Bytes of the unsharded parameter buffer in the compute dtype (what a gather allocates).
  int64_t unsharded_bytes() const {
    return layout_.padded_numel * static_cast<int64_t>(c10::elementSize(compute_dtype_));
  }
  // Bytes held now in unsharded buffers: gathered parameters (not for replicated ones, which are
  // the shard; NF4: the gathered bytes until wait() decodes them), the parameters' gradients not
  // yet reduced, and the reduction's packed input.
  int64_t gathered_bytes() const;

  // Freed unsharded buffers (parameters, gradients) go to shard::storage's buffer cache, so the
  // next gather of the same size reuses resident memory (see storage.h). Off by default.
  void set_buffer_caching(bool on) { cache_buffers_ = on; }

 private:
  std::string unit_name_;
  FlatLayout layout_;
  std::vector<at::Tensor> params_;
  comm::ProcessGroupPtr group_;
  comm::ProcessGroupPtr replica_group_;  // HybridShard: same shard index, other replica groups
  bool replicate_ = false;
  bool trainable_ = true;
  at::ScalarType compute_dtype_ = at::kFloat;
  at::ScalarType reduce_dtype_ = at::kFloat;
  bool cache_buffers_ = false;
  bool offload_ = false;
  bool host_copy_pending_ = false;  // an asynchronous device-to-host copy into shard_grad_ is queued
  bool shard_grad_zeroed_ = false;  // shard_grad_ counts as zeros until the next reduction overwrites it
  at::Device compute_device_ = at::kCPU;
  at::Tensor unsharded_;  // [padded_numel] compute dtype
  at::Tensor shard_;  // [shard_numel] fp32 on the compute device, or the host if offloaded (replicated: same tensor as
                      // unsharded_)
  at::Tensor shard_grad_;               // [shard_numel] fp32 beside shard_, trainable only
  at::Tensor reduce_input_;             // [padded_numel] reduce dtype: the gradients packed for the reduction
  at::Tensor reduced_grad_;             // [shard_numel] reduce dtype output of the in-flight reduction
  bool reduced_in_shard_grad_ = false;  // the in-flight reduction writes shard_grad_ itself
  comm::WorkPtr replica_reduce_;        // HybridShard: the all-reduce of reduced_grad_ across replicas
  // The parameters' gradients into out [padded_numel] at their offsets (overwrite: copied, with
  // zeros for the missing ones and the padding; else added), cast to out's dtype (through the
  // reduce dtype first if asked).
  void pack_grads(const at::Tensor& out, bool overwrite, bool round_through_reduce_dtype);
  bool shard_grad_counts_as_zeros() const;  // undefined, or zeroed and not written since
  void take_shard_grad();                   // allocates shard_grad_ if needed; about to be overwritten
  void add_reduced_to_shard_grad(const at::Tensor& reduced);  // finish: copies or adds (offloaded: to the host)
  int64_t held_grad_bytes() const;                            // the parameters' .grad tensors
  std::shared_ptr<const Nf4StorageLayout> nf4_;               // set: shard_ is uint8 [shard_bytes] of the NF4 encoding
  bool nf4_landing_ = false;  // an NF4 gather is in flight: unsharded_ is allocated and decoded at its wait()
};

// A 64-bit hash of a tensor's bytes (FNV-1a), to compare parameters across ranks.
int64_t checksum(const at::Tensor& contiguous);

}  // namespace fsdp::shard
