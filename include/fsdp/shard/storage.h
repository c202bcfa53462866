// fsdp/shard/storage.h: free a buffer's memory for real while tensors that alias it (parameters,
// and the views autograd saved of them) stay valid objects, then give it memory again.
//
// This is what lets FULL_SHARD hold one gathered unit at a time: after forward the gathered
// buffer is freed; autograd's saved views point at a storage of 0 bytes; before backward the
// same storage is re-allocated and refilled, and the saved views see the new memory.
// The device-specific part is only which allocator is called: the storage's own (CPU, or the
// CUDA caching allocator), so the CUDA path needs no change here.
#pragma once

#include <ATen/core/Tensor.h>

namespace fsdp::shard {

// Frees the memory of t's storage; the storage object (and every tensor aliasing it) survives.
// keep_in_cache: into the buffer cache below if it has room, else back to the allocator.
void free_storage(const at::Tensor& t, bool keep_in_cache = false);
// Gives t's storage `nbytes` fresh, uninitialised bytes from its own allocator (no-op if it already
// holds them). Refill it by writing through data_ptr() (as a collective does) or through
// variable_data(): an in-place torch op on t itself would bump the version counter that autograd
// checks, and backward would refuse to run.
void allocate_storage(const at::Tensor& t, size_t nbytes);
bool storage_is_allocated(const at::Tensor& t);

// A cache of freed buffers, so that a buffer freed after one unit's use serves the next gather of
// the same size. Without it every gather maps fresh pages from the OS, and first-touch page faults
// cost more than the copy itself here (measured in docs/benchmarks.md: 4x on a 2-core VM), the
// problem CUDA's caching allocator solves on GPUs. free_storage keeps a buffer while the cache
// holds at most `capacity` bytes (exact-size reuse; the rest returns to the allocator);
// allocate_storage takes a cached one of the same size first. Capacity 0 (the default) disables it.
// Process-wide, thread-safe. Only CPU buffers are cached.
void set_buffer_cache_capacity(int64_t bytes);
int64_t buffer_cache_capacity();
int64_t buffer_cache_bytes();  // held now
void clear_buffer_cache();
// Blocks the host until the work queued on `device`'s current stream is done (no-op on the CPU).
void synchronize_current_stream(at::Device device);

// A 1-D tensor for FSDP's own buffers (shards, their gradients and optimizer state, gathered and
// reduction buffers) and for weights read from files (checkpoint::SafetensorsFile::read_range):
// contents undefined. On the CPU, one of 1 MiB or more is mapped from the OS
// on its own (mmap), outside glibc's heap, and so is every later re-allocation of its storage by
// allocate_storage. Why: glibc would place buffers under its 32 MiB mmap threshold in the heap,
// between activations, and freed holes there stay resident (fragmentation measured in
// docs/benchmarks.md, "fsdp-plan: predicted against measured"). On a GPU: at::empty.
at::Tensor empty_buffer(int64_t numel, at::ScalarType dtype, at::Device device = at::kCPU);

// Bytes of host buffers mapped by empty_buffer / allocate_storage now (cached ones included).
int64_t mapped_host_buffer_bytes();

// empty_buffer whose memory comes from the cache when it can; contents undefined.
// Give its memory back with free_storage (dropping the tensor frees it to the allocator instead).
at::Tensor empty_from_cache(int64_t numel, at::ScalarType dtype, at::Device device = at::kCPU);

}  // namespace fsdp::shard
