// fsdp/comm/device_group.h: which backend moves a device's tensors, chosen in one place.
//
//   FSDP_DEVICE_COMM = nccl (default) | staged
// A CUDA device gets NCCL (nccl_process_group.h), or the staged test backend
// (staged_process_group.h) where the variable says staged: several ranks on one GPU. The CPU gets
// the bootstrap group itself (MPI), or under staged a staged group over CPU tensors, so that the
// backend's logic runs in CI. The meta device (a model constructed to be checked, not run) gets
// collectives that move nothing (meta_device_group.h).
#pragma once

#include <c10/core/Device.h>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

enum class DeviceComm { kNccl, kStaged };
// FSDP_DEVICE_COMM, read once; anything but nccl or staged throws naming it.
DeviceComm device_comm_from_env();

// The group for `device`'s tensors over the ranks of `bootstrap` (collective over them where a
// group is made); host tensors still go through `bootstrap`.
ProcessGroupPtr make_device_group(const ProcessGroupPtr& bootstrap, at::Device device);

}  // namespace fsdp::comm
