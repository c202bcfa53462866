#include "fsdp/comm/launch.h"

#include <algorithm>
#include <cstdio>
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

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // Comma-separated groups "count" or "count(xrepeat)", in node order.
  size_t position = 0;
  int first_node = 0;
  while (position < tasks_per_node.size()) {
    const size_t comma = tasks_per_node.find(',', position);
    const std::string group =
        tasks_per_node.substr(position, comma == std::string::npos ? std::string::npos : comma - position);
    int count = 0, repeat = 1;
    char close = 0;
    if (std::sscanf(group.c_str(), "%d(x%d%c", &count, &repeat, &close) == 3) {
      if (close != ')') return -1;
    } else if (std::sscanf(group.c_str(), "%d", &count) == 1 &&
               group.find_first_not_of("0123456789") == std::string::npos) {
      repeat = 1;
    } else {
      return -1;
    }
    if (count < 1 || repeat < 1) return -1;
    if (node < first_node + repeat) return node >= first_node ? count : -1;
    first_node += repeat;
    if (comma == std::string::npos) break;
    position = comma + 1;
  }
  return -1;
}

LaunchInfo launch_info_from_env() {
  struct Source {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  const Source sources[] = {
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
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
    const int local_rank = int_from_env(source.local_rank);
    info.local_rank = std::max(0, local_rank);
    info.local_rank_known = local_rank >= 0;
    info.local_rank_variable = source.local_rank;
    info.local_world_size_variable = source.local_size;
    int local_size = int_from_env(source.local_size);
    if (local_size <= 0 && info.launcher == "slurm") {
      // srun without --ntasks-per-node: SLURM_TASKS_PER_NODE says how many run on each node.
      const char* per_node = std::getenv("SLURM_TASKS_PER_NODE");
      const int node = int_from_env("SLURM_NODEID");
      if (per_node != nullptr && node >= 0) {
        local_size = slurm_tasks_on_node(per_node, node);
        info.local_world_size_variable = "SLURM_TASKS_PER_NODE";
      }
    }
    // Unknown local size: assume every rank shares this machine (it only divides the cores among
    // threads); what needs the true figure (hybrid sharding's default, a GPU each) refuses it.
    info.local_world_size_known = local_size > 0;
    info.local_world_size = local_size > 0 ? local_size : info.world_size;
    return info;
  }
  LaunchInfo alone;
  alone.launcher = "none";
  return alone;
}

}  // namespace fsdp::comm
