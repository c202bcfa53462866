// device_memory.h in a build without CUDA (FSDP_CUDA=OFF).
#include <stdexcept>

#include "fsdp/runtime/device_memory.h"

namespace fsdp::runtime {

int64_t device_peak_reserved_bytes(at::Device) { return -1; }

void set_device_memory_fraction(at::Device device, double) {
  throw std::invalid_argument("set_device_memory_fraction: this build has no CUDA support (" + device.str() +
                              "); configure with -DFSDP_CUDA=ON");
}

}  // namespace fsdp::runtime
