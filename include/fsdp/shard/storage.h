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
void free_storage(const at::Tensor& t);
// Gives t's storage `nbytes` fresh, uninitialised bytes from its own allocator (no-op if it already
// holds them). Refill it by writing through data_ptr() (as a collective does) or through
// variable_data(): an in-place torch op on t itself would bump the version counter that autograd
// checks, and backward would refuse to run.
void allocate_storage(const at::Tensor& t, size_t nbytes);
bool storage_is_allocated(const at::Tensor& t);

}  // namespace fsdp::shard
