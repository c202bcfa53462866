// The staged group's copies for a CUDA device (see src/comm/staging_copies.h), on a stream of the
// group's own, ordered against the caller's current stream by events. FSDP_CUDA builds only.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "staging_copies.h"

namespace fsdp::comm {
namespace {

class CudaStagingCopies final : public StagingCopies {
 public:
  explicit CudaStagingCopies(at::Device device)
      : index_(device.index()), stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index_)) {}

  // Pinned, so that copies from and to it are asynchronous; the caching host allocator keeps the
  // block until the copies recorded on it (on stream_) have run.
  at::Tensor host_buffer(const at::Tensor& like) const override {
    return at::empty(like.sizes(), like.options().device(at::kCPU).pinned_memory(true));
  }

  // [n] device tensor -> pinned host [n], after the caller's queued work; the host waits for it.
  void to_host(const at::Tensor& host, const at::Tensor& device) override {
    c10::cuda::CUDAGuard guard(index_);
    after_callers_work();
    {
      c10::cuda::CUDAStreamGuard on_ours(stream_);
      host.copy_(device, /*non_blocking=*/true);
    }
    stream_.synchronize();
  }

  // Pinned host -> device on stream_, after the caller's queued work; the caller's stream then
  // waits for the copy (the host does not), and the device memory is recorded on stream_ so that
  // a free from another stream does not reuse it before the copy ran.
  void to_device(const at::Tensor& device, const at::Tensor& host) override {
    c10::cuda::CUDAGuard guard(index_);
    after_callers_work();
    {
      c10::cuda::CUDAStreamGuard on_ours(stream_);
      device.copy_(host, /*non_blocking=*/true);
    }
    c10::cuda::CUDACachingAllocator::recordStream(device.storage().data_ptr(), stream_);
    at::cuda::CUDAEvent copied;
    copied.record(stream_);
    copied.block(c10::cuda::getCurrentCUDAStream(index_));
  }

  void synchronize() override {
    c10::cuda::CUDAGuard guard(index_);
    c10::cuda::getCurrentCUDAStream(index_).synchronize();
    stream_.synchronize();
  }

 private:
  void after_callers_work() {
    at::cuda::CUDAEvent queued;
    queued.record(c10::cuda::getCurrentCUDAStream(index_));
    queued.block(stream_);
  }

  c10::DeviceIndex index_;
  c10::cuda::CUDAStream stream_;  // the group's copy stream (high priority)
};

}  // namespace

std::unique_ptr<StagingCopies> make_cuda_staging_copies(at::Device device) {
  return std::make_unique<CudaStagingCopies>(device);
}

}  // namespace fsdp::comm
