// fsdp/checkpoint/staging_buffers.h: host buffers a background save copies a rank's tensors into,
// kept from one save to the next.
//
// A fresh buffer costs its first-touch page faults on every save (GPT-2 124M's shard and moments
// at N = 2, 500 MB a rank: 0.1-0.9 s of the 2-core VM's step, docs/benchmarks.md); a kept one
// costs the copy alone. Holding them is what fsdp-plan counts as checkpoint staging. One save uses
// them at a time: checkpoint.async keeps at most one in flight, and the next waits for it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>

namespace fsdp::checkpoint {

class StagingBuffers {
 public:
  // A CPU buffer shaped and typed as `like` for the tensor saved as `name`: the kept one when it
  // matches, else a new one (pinned when asked, for a GPU tensor's asynchronous copy).
  at::Tensor buffer_for(const std::string& name, const at::Tensor& like, bool pinned);
  int64_t bytes() const;

 private:
  std::unordered_map<std::string, at::Tensor> buffers_;
};

}  // namespace fsdp::checkpoint
