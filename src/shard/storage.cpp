#include "fsdp/shard/storage.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <malloc.h>

#include <map>
#include <mutex>

namespace fsdp::shard {
namespace {

struct BufferCache {
  std::mutex mutex;
  std::multimap<size_t, at::DataPtr> buffers;  // by size in bytes
  int64_t bytes = 0;
  int64_t capacity = 0;
};

BufferCache& cache() {
  static BufferCache* instance = new BufferCache();  // never destroyed: buffers may be freed at exit
  return *instance;
}

}  // namespace

void set_buffer_cache_capacity(int64_t bytes) {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().capacity = bytes;
  while (cache().bytes > cache().capacity && !cache().buffers.empty()) {
    auto largest = std::prev(cache().buffers.end());
    cache().bytes -= static_cast<int64_t>(largest->first);
    cache().buffers.erase(largest);
  }
}

int64_t buffer_cache_capacity() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().capacity;
}

int64_t buffer_cache_bytes() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().bytes;
}

void clear_buffer_cache() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().buffers.clear();
  cache().bytes = 0;
}

void free_storage(const at::Tensor& t, bool keep_in_cache) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = storage->nbytes();
  if (nbytes == 0) return;
  // Taking the DataPtr out leaves the storage empty; dropping it runs its deleter (back to the
  // allocator), keeping it caches the memory.
  at::DataPtr memory = storage->set_data_ptr(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  if (!keep_in_cache || !memory.device().is_cpu()) return;
  std::lock_guard<std::mutex> lock(cache().mutex);
  if (cache().bytes + static_cast<int64_t>(nbytes) <= cache().capacity) {
    cache().buffers.emplace(nbytes, std::move(memory));
    cache().bytes += static_cast<int64_t>(nbytes);
  }
}

void allocate_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes && storage->data() != nullptr) return;
  at::DataPtr memory;
  if (storage->device().is_cpu()) {
    std::lock_guard<std::mutex> lock(cache().mutex);
    auto found = cache().buffers.find(nbytes);
    if (found != cache().buffers.end()) {
      memory = std::move(found->second);
      cache().buffers.erase(found);
      cache().bytes -= static_cast<int64_t>(nbytes);
    }
  }
  if (!memory) {
    // A CUDA storage's memory comes from the current device's caching allocator: make it this one's.
    c10::OptionalDeviceGuard guard(storage->device().is_cpu() ? c10::nullopt : c10::optional<at::Device>(storage->device()));
    memory = storage->allocator()->allocate(nbytes);
  }
  storage->set_data_ptr_noswap(std::move(memory));
  storage->set_nbytes(nbytes);
}

bool storage_is_allocated(const at::Tensor& t) { return t.storage().nbytes() > 0; }

bool keep_freed_host_memory_mapped() {
  const bool threshold = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;  // glibc's maximum on 64-bit
  const bool trim = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return threshold && trim;
}

void release_free_host_memory() { malloc_trim(0); }

at::Tensor empty_from_cache(int64_t numel, at::ScalarType dtype, at::Device device) {
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype).device(device));
  if (!device.is_cpu()) return t;  // CUDA's caching allocator already reuses freed blocks
  const size_t nbytes = t.storage().nbytes();
  {
    // The fresh allocation has not been touched (no pages yet): swap it for a cached buffer if any.
    std::lock_guard<std::mutex> lock(cache().mutex);
    if (cache().buffers.find(nbytes) == cache().buffers.end()) return t;
  }
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr(at::DataPtr(nullptr, storage->device()));  // the untouched allocation goes back
  storage->set_nbytes(0);
  allocate_storage(t, nbytes);
  return t;
}

void synchronize_current_stream(at::Device device) {
  if (device.is_cpu()) return;
  // Device-generic: the CUDA guard implementation is registered by a CUDA libtorch.
  c10::impl::VirtualGuardImpl guard(device.type());
  guard.getStream(device).synchronize();
}

}  // namespace fsdp::shard
