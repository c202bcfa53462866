// src/comm/staging_copies.h (private): how the staged group (fsdp/comm/staged_process_group.h)
// copies between a device tensor and its host staging buffer, one implementation per device.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace fsdp::comm {

class StagingCopies {
 public:
  virtual ~StagingCopies() = default;
  // A host buffer shaped and typed as `like` (pinned where the device copies from it).
  virtual at::Tensor host_buffer(const at::Tensor& like) const = 0;
  // host <- device as the caller's queued work leaves it; returns once `host` holds it.
  virtual void to_host(const at::Tensor& host, const at::Tensor& device) = 0;
  // device <- host, ordered before whatever the caller queues next; `host` stays alive until the
  // copy has read it, `device`'s memory until it has been written.
  virtual void to_device(const at::Tensor& device, const at::Tensor& host) = 0;
  // Returns once the caller's queued work and every copy queued here have run.
  virtual void synchronize() = 0;
};

// kCPU: plain copies. kCUDA: a stream of the group's own (staging_copies_cuda.cpp, FSDP_CUDA
// builds); elsewhere std::runtime_error naming the build.
std::unique_ptr<StagingCopies> make_staging_copies(at::Device device);
std::unique_ptr<StagingCopies> make_cuda_staging_copies(at::Device device);

}  // namespace fsdp::comm
