// The devices a device-generic unit test runs on: the CPU, and CUDA where libtorch sees a GPU or
// FSDP_TEST_DEVICE=cuda asks for it (scripts/gpu-check.sh does: a missing GPU is then a failure,
// not a skip).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace fsdp_tests {

inline std::vector<at::Device> test_devices() {
  std::vector<at::Device> out{at::kCPU};
  const char* wanted = std::getenv("FSDP_TEST_DEVICE");
  if ((wanted != nullptr && std::string(wanted) == "cuda") || torch::cuda::is_available()) out.emplace_back(at::kCUDA);
  return out;
}

// Whether `device` can run here; CUDA asked for without a GPU libtorch sees is a failure.
inline bool usable(const at::Device& device) {
  if (device.is_cpu()) return true;
  if (!torch::cuda::is_available()) {
    ADD_FAILURE() << "FSDP_TEST_DEVICE=cuda, but libtorch sees no CUDA device";
    return false;
  }
  return true;
}

}  // namespace fsdp_tests
