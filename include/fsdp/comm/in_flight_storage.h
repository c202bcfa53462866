// fsdp/comm/in_flight_storage.h: the memory a collective may still read or write, so that handing
// it back early is refused rather than silently corrupting (issue 40).
//
// shard::free_storage frees a buffer's memory at once, whatever holds the tensor: the storage
// object survives, its bytes do not. A collective in flight on that memory would then write into
// memory the allocator has given to something else (the MPI backend's thread on the CPU; on the GPU
// a stream other than the collective's, where recordStream is what keeps the block). Each backend
// marks its collective's tensors' storages from issue until the collective completed or was waited
// for (wait() on the GPU: from then the caller's stream is ordered after it), and free_storage
// refuses a marked storage, naming the collective. Process-wide, thread-safe; one lock and one
// hash lookup per free and per collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <string>
#include <vector>

namespace fsdp::comm {

// Marks the storages of `tensors` (undefined ones skipped) while it lives or until release().
class InFlightStorage {
 public:
  InFlightStorage(const std::vector<at::Tensor>& tensors, std::string description);
  ~InFlightStorage();
  InFlightStorage(const InFlightStorage&) = delete;
  InFlightStorage& operator=(const InFlightStorage&) = delete;

  void release();  // idempotent, thread-safe
  const std::string& description() const { return description_; }

 private:
  std::vector<const void*> storages_;  // StorageImpl*
  std::string description_;
  std::atomic<bool> released_{false};
};

// The description of a collective in flight on `tensor`'s storage, or "" when none is.
std::string collective_holding(const at::Tensor& tensor);

}  // namespace fsdp::comm
