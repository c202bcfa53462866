// fsdp/runtime/device_memory.h: what the GPU's caching allocator holds (for reports; the CPU's
// figure is the process's resident memory, train/reporting.h).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace fsdp::runtime {

// Peak bytes reserved by the CUDA caching allocator on `device` since the process started (what
// torch.cuda.max_memory_reserved reports); -1 for a CPU device or a build without CUDA.
int64_t device_peak_reserved_bytes(at::Device device);

// Limits the CUDA caching allocator on `device` to `fraction` of its memory (what
// torch.cuda.set_per_process_memory_fraction does): allocations past it fail as out of memory.
// Throws on a CPU device or a build without CUDA.
void set_device_memory_fraction(at::Device device, double fraction);

}  // namespace fsdp::runtime
