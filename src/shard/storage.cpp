#include "fsdp/shard/storage.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include <atomic>
#include <map>
#include <mutex>

#include "fsdp/comm/in_flight_storage.h"

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

// FSDP's host buffers from this size up are mapped on their own (see empty_buffer).
constexpr size_t kMappedMinBytes = size_t{1} << 20;

struct Mapping {
  void* address;
  size_t bytes;
};

std::atomic<int64_t> g_mapped_bytes{0};

void unmap(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  munmap(mapping->address, mapping->bytes);
  g_mapped_bytes -= static_cast<int64_t>(mapping->bytes);
  delete mapping;
}

at::DataPtr map_host_bytes(size_t nbytes) {
  void* address = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (address == MAP_FAILED) {
    throw std::runtime_error("fsdp host buffer: mmap of " + std::to_string(nbytes) +
                             " bytes failed: " + std::strerror(errno) + " (out of memory?)");
  }
  g_mapped_bytes += static_cast<int64_t>(nbytes);
  return at::DataPtr(address, new Mapping{address, nbytes}, &unmap, at::Device(at::kCPU));
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
  const std::string holder = comm::collective_holding(t);
  if (!holder.empty()) {
    throw std::logic_error(
        "free_storage: the memory of a " + std::to_string(t.numel()) + "-element " +
        std::string(c10::toString(t.scalar_type())) + " tensor (" + std::to_string(nbytes) +
        " bytes) is in use by a collective in flight, " + holder +
        ": handed back now, the collective would write into memory given to other work (wait for it first)");
  }
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

namespace {
// Memory of `storage`'s device for `nbytes`: a cached CPU buffer of that size, else (CPU, 1 MiB or
// more) a mapping of its own, else the storage's allocator.
at::DataPtr new_memory(c10::StorageImpl* storage, size_t nbytes, bool from_cache) {
  at::DataPtr memory;
  if (storage->device().is_cpu() && from_cache) {
    std::lock_guard<std::mutex> lock(cache().mutex);
    auto found = cache().buffers.find(nbytes);
    if (found != cache().buffers.end()) {
      memory = std::move(found->second);
      cache().buffers.erase(found);
      cache().bytes -= static_cast<int64_t>(nbytes);
    }
  }
  if (!memory && storage->device().is_cpu() && nbytes >= kMappedMinBytes) memory = map_host_bytes(nbytes);
  if (!memory) {
    // A CUDA storage's memory comes from the current device's caching allocator: make it this one's.
    // (reset_device rather than an optional: c10::optional's spelling differs across libtorch versions)
    c10::OptionalDeviceGuard guard;
    if (!storage->device().is_cpu()) guard.reset_device(storage->device());
    memory = storage->allocator()->allocate(nbytes);
  }
  return memory;
}

// A 1-D tensor of `numel` elements over new memory (see new_memory).
at::Tensor empty_with_memory(int64_t numel, at::ScalarType dtype, at::Device device, bool from_cache) {
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(new_memory(storage, nbytes, from_cache));
  storage->set_nbytes(nbytes);
  t.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return t;
}
}  // namespace

void allocate_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes && storage->data() != nullptr) return;
  storage->set_data_ptr_noswap(new_memory(storage, nbytes, /*from_cache=*/true));
  storage->set_nbytes(nbytes);
}

bool storage_is_allocated(const at::Tensor& t) { return t.storage().nbytes() > 0; }

int64_t mapped_host_buffer_bytes() { return g_mapped_bytes.load(); }

at::Tensor empty_buffer(int64_t numel, at::ScalarType dtype, at::Device device) {
  return empty_with_memory(numel, dtype, device, /*from_cache=*/false);
}

// On a GPU the caching allocator already reuses freed blocks; the cache holds CPU buffers only.
at::Tensor empty_from_cache(int64_t numel, at::ScalarType dtype, at::Device device) {
  return empty_with_memory(numel, dtype, device, /*from_cache=*/true);
}

void synchronize_current_stream(at::Device device) {
  if (device.is_cpu()) return;
  // Device-generic: the CUDA guard implementation is registered by a CUDA libtorch.
  c10::impl::VirtualGuardImpl guard(device.type());
  guard.getStream(device).synchronize();
}

}  // namespace fsdp::shard
