// fsdp/comm/device_assignment.h: one CUDA device per rank, checked across the ranks.
//
// Each rank takes device local_rank % visible devices: with every device of a node visible that is
// its own; with one device bound to each task (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES set per
// rank) it is index 0 of its own. Two ranks on one device is what NCCL refuses with a bare "invalid
// usage": more ranks on a node than devices, or a launcher that gives no local rank (every rank is
// then local rank 0). Before NCCL starts, the ranks exchange their claims (host and device UUID)
// over the bootstrap (MPI) group and refuse such a launch, naming the two ranks, the device, and
// the launcher's variables that decided it. CPU code: the check is tested without a GPU.
#pragma once

#include <string>
#include <vector>

#include "fsdp/comm/launch.h"

namespace fsdp::comm {

struct DeviceClaim {
  std::string host;    // the machine (gethostname)
  std::string device;  // the device's UUID, or another name unique on the host
  int device_index = 0;
};

// This rank's device index: launch.local_rank % visible_devices. Throws when none is visible.
int device_index_for(const LaunchInfo& launch, int visible_devices);

// A claim as one line of text and back (for all_gather_text).
std::string to_text(const DeviceClaim& claim);
DeviceClaim claim_from_text(const std::string& text);

// Throws std::runtime_error naming the first two ranks (by index in `claims`) that claimed the
// same device of the same host, with why (`launch`: this rank's launcher variables;
// visible_devices: what this rank sees).
void check_one_rank_per_device(const std::vector<DeviceClaim>& claims, const LaunchInfo& launch, int visible_devices);

}  // namespace fsdp::comm
