#include "fsdp/checkpoint/staging_buffers.h"

#include <ATen/ATen.h>

namespace fsdp::checkpoint {

at::Tensor StagingBuffers::buffer_for(const std::string& name, const at::Tensor& like, bool pinned) {
  at::Tensor& kept = buffers_[name];
  if (!kept.defined() || kept.sizes() != like.sizes() || kept.scalar_type() != like.scalar_type() ||
      kept.is_pinned() != pinned) {
    kept = at::empty(like.sizes(), like.options().device(at::kCPU).pinned_memory(pinned));
  }
  return kept;
}

int64_t StagingBuffers::bytes() const {
  int64_t total = 0;
  for (const auto& [name, buffer] : buffers_) total += static_cast<int64_t>(buffer.nbytes());
  return total;
}

}  // namespace fsdp::checkpoint
