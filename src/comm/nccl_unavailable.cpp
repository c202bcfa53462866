// The NCCL backend's entry points in a build without it (FSDP_CUDA=OFF, the default): each says so.
#include <stdexcept>

#include "fsdp/comm/nccl_process_group.h"

namespace fsdp::comm {

bool nccl_backend_built() { return false; }

int local_device_index() {
  throw std::runtime_error(
      "local_device_index: this build has no CUDA support; configure with -DFSDP_CUDA=ON "
      "against a CUDA libtorch (see docs/gpu.md)");
}

ProcessGroupPtr make_nccl_group(const ProcessGroupPtr&, int, const ProcessGroupOptions&) {
  throw std::runtime_error(
      "make_nccl_group: this build has no NCCL backend; configure with -DFSDP_CUDA=ON "
      "against a CUDA libtorch (see docs/gpu.md)");
}

}  // namespace fsdp::comm
