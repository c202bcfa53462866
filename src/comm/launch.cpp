#include "fsdp/comm/launch.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace fsdp::comm {
namespace {

// Returns -1 when the variable is unset; throws when it is set but not a non-negative integer.
int int_from_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > 1 << 24) {
    throw std::runtime_error(std::string("launch: environment variable ") + name + "='" + value +
                             "' is not a non-negative integer");
  }
  return static_cast<int>(parsed);
}

}  // namespace

LaunchInfo launch_info_from_env() {
  struct Source {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  const Source sources[] = {
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  for (const Source& source : sources) {
    int rank = int_from_env(source.rank);
    if (rank < 0) continue;
    LaunchInfo info;
    info.launcher = source.launcher;
    info.rank = rank;
    info.world_size = int_from_env(source.size);
    if (info.world_size < 1 || rank >= info.world_size) {
      throw std::runtime_error(std::string("launch: ") + source.rank + "=" + std::to_string(rank) + " but " +
                               source.size + "=" + std::to_string(info.world_size));
    }
    info.local_rank = std::max(0, int_from_env(source.local_rank));
    // Unknown local size (e.g. Slurm without --ntasks-per-node): assume every rank shares this machine.
    const int local_size = int_from_env(source.local_size);
    info.local_world_size = local_size > 0 ? local_size : info.world_size;
    return info;
  }
  return LaunchInfo{0, 1, 0, 1, "none"};
}

}  // namespace fsdp::comm
