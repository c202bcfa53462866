#include "fsdp/comm/device_assignment.h"

#include <map>
#include <stdexcept>
#include <utility>

namespace fsdp::comm {

int device_index_for(const LaunchInfo& launch, int visible_devices) {
  if (visible_devices < 1) {
    throw std::runtime_error("no CUDA device is visible to rank " + std::to_string(launch.rank) +
                             " (check CUDA_VISIBLE_DEVICES and the launcher's GPU binding)");
  }
  return launch.local_rank % visible_devices;
}

std::string to_text(const DeviceClaim& claim) {
  return claim.host + "\t" + claim.device + "\t" + std::to_string(claim.device_index);
}

DeviceClaim claim_from_text(const std::string& text) {
  const size_t first = text.find('\t'), second = first == std::string::npos ? first : text.find('\t', first + 1);
  if (second == std::string::npos)
    throw std::runtime_error("device claim '" + text + "' is not host<TAB>device<TAB>index");
  DeviceClaim claim;
  claim.host = text.substr(0, first);
  claim.device = text.substr(first + 1, second - first - 1);
  claim.device_index = std::stoi(text.substr(second + 1));
  return claim;
}

void check_one_rank_per_device(const std::vector<DeviceClaim>& claims, const LaunchInfo& launch, int visible_devices) {
  std::map<std::pair<std::string, std::string>, size_t> first_claim;
  for (size_t r = 0; r < claims.size(); ++r) {
    const auto [it, fresh] = first_claim.emplace(std::make_pair(claims[r].host, claims[r].device), r);
    if (fresh) continue;
    std::string why;
    if (!launch.local_rank_known) {
      why = "the launcher (" + launch.launcher + ") gives no rank on the machine (" + launch.local_rank_variable +
            " is unset), so every rank took local rank 0; launch with mpirun or srun, which set it";
    } else {
      why = std::to_string(launch.local_world_size) + " ranks run on this machine (" +
            launch.local_world_size_variable +
            (launch.local_world_size_known ? "=" + std::to_string(launch.local_world_size)
                                           : " unset: assumed all " + std::to_string(launch.world_size)) +
            ") and each sees " + std::to_string(visible_devices) + " CUDA device" + (visible_devices == 1 ? "" : "s") +
            "; start at most " + std::to_string(visible_devices) + " rank" + (visible_devices == 1 ? "" : "s") +
            " per node (mpirun --npernode, srun --ntasks-per-node) or make "
            "more devices visible (CUDA_VISIBLE_DEVICES)";
    }
    throw std::runtime_error("ranks " + std::to_string(it->second) + " and " + std::to_string(r) +
                             " both took CUDA device " + std::to_string(claims[r].device_index) + " (" +
                             claims[r].device + ") of host '" + claims[r].host +
                             "': NCCL needs a device for each rank. " + why);
  }
}

}  // namespace fsdp::comm
