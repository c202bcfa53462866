#include "fsdp/shard/storage.h"

#include <c10/core/StorageImpl.h>

namespace fsdp::shard {

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  // Swapping in an empty DataPtr runs the old one's deleter: the memory goes back to the allocator.
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes && storage->data() != nullptr) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

bool storage_is_allocated(const at::Tensor& t) { return t.storage().nbytes() > 0; }

}  // namespace fsdp::shard
