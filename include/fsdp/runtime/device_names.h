// fsdp/runtime/device_names.h: the devices a config names (train.device): cpu (MPI) and cuda (NCCL).
#pragma once

#include <c10/core/DeviceType.h>

#include "fsdp/enum_names.h"

namespace fsdp {
template <>
struct EnumNames<c10::DeviceType> {
  static constexpr std::pair<c10::DeviceType, const char*> values[] = {
      {c10::DeviceType::CPU, "cpu"},
      {c10::DeviceType::CUDA, "cuda"},
  };
};
}  // namespace fsdp
