// fsdp/comm/launch.h: what the launcher (mpirun, srun) says about this process.
#pragma once

#include <string>

namespace fsdp::comm {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;     // index of this process among those on its machine (picks its GPU)
  int local_world_size = 1;  // processes on this machine (they share its cores)
  std::string launcher;   // "openmpi", "slurm", "pmi" or "none"
};

// Reads OMPI_COMM_WORLD_*, PMIX_RANK/PMI_*, or SLURM_* variables; none of them means a single
// process (rank 0 of 1). Throws std::runtime_error when a variable is present but malformed.
LaunchInfo launch_info_from_env();

}  // namespace fsdp::comm
