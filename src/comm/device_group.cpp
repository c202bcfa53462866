#include "fsdp/comm/device_group.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "fsdp/comm/meta_device_group.h"
#include "fsdp/comm/nccl_process_group.h"
#include "fsdp/comm/staged_process_group.h"

namespace fsdp::comm {

DeviceComm device_comm_from_env() {
  static const DeviceComm chosen = [] {
    const char* text = std::getenv("FSDP_DEVICE_COMM");
    if (text == nullptr || *text == '\0' || std::string(text) == "nccl") return DeviceComm::kNccl;
    if (std::string(text) == "staged") return DeviceComm::kStaged;
    throw std::runtime_error("FSDP_DEVICE_COMM='" + std::string(text) + "' (expected nccl or staged)");
  }();
  return chosen;
}

ProcessGroupPtr make_device_group(const ProcessGroupPtr& bootstrap, at::Device device) {
  if (device.is_meta()) return make_meta_device_group(bootstrap);  // a construction check: nothing moves
  if (device_comm_from_env() == DeviceComm::kStaged) return make_staged_group(bootstrap, device);
  if (device.is_cuda()) return make_nccl_group(bootstrap, device.index());
  return bootstrap;
}

}  // namespace fsdp::comm
