// fsdp/compat.h: the one place that knows libtorch versions apart (Debian's 1.13 CPU build here,
// CUDA builds of 2.x on GPU machines). Nowhere else checks TORCH_VERSION_*.
#pragma once

#include <torch/version.h>

#include <c10/core/StorageImpl.h>

namespace fsdp::compat {

// Raw mutable pointer of a storage: 1.13 has data_ptr(), 2.x renamed it mutable_data_ptr().
inline void* storage_data(c10::StorageImpl& storage) {
#if TORCH_VERSION_MAJOR >= 2
  return storage.mutable_data_ptr().get();
#else
  return storage.data_ptr().get();
#endif
}

}  // namespace fsdp::compat
