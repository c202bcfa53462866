// device_memory.h on a CUDA build (and in fsdp_cuda_compile_check).
#include <c10/cuda/CUDACachingAllocator.h>

#include <stdexcept>
#include <string>

#include "fsdp/runtime/device_memory.h"

namespace fsdp::runtime {

int64_t device_peak_reserved_bytes(at::Device device) {
  if (!device.is_cuda()) return -1;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  // Index 0 is StatType::AGGREGATE (all pools) in every version; the enum itself moved namespace
  // in libtorch 2.5 (c10::CachingDeviceAllocator), and CUDACachingAllocator.h no longer names it.
  constexpr size_t kAggregate = 0;
  return stats.reserved_bytes[kAggregate].peak;
}

void set_device_memory_fraction(at::Device device, double fraction) {
  if (!device.is_cuda())
    throw std::invalid_argument("set_device_memory_fraction: " + device.str() + " is not a CUDA device");
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument("set_device_memory_fraction: fraction " + std::to_string(fraction) +
                                " is not in (0, 1]");
  }
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
}

}  // namespace fsdp::runtime
