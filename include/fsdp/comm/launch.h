// fsdp/comm/launch.h: what the launcher (mpirun, srun) says about this process.
#pragma once

#include <string>

namespace fsdp::comm {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // index of this process among those on its machine (picks its GPU)
  int local_world_size = 1;  // processes on this machine (they share its cores)
  std::string launcher;      // "openmpi", "slurm", "pmi" or "none"
  // Whether the launcher said them (else local_rank is 0 and local_world_size the world size),
  // and the variables read, for error messages.
  bool local_rank_known = true;
  bool local_world_size_known = true;
  std::string local_rank_variable, local_world_size_variable;
};

// Reads OMPI_COMM_WORLD_*, PMI_* / MPI_LOCAL*, or SLURM_* variables; none of them means a single
// process (rank 0 of 1). Under Slurm the tasks on this node come from SLURM_NTASKS_PER_NODE, else
// from SLURM_TASKS_PER_NODE at SLURM_NODEID. Throws std::runtime_error when a variable is present
// but malformed.
LaunchInfo launch_info_from_env();

// Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": three nodes of 2 tasks, then one of 1) at node
// `node`; -1 when the text does not parse or has no such node.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace fsdp::comm
