#include "fsdp/runtime/sharding_groups.h"

#include <stdexcept>
#include <string>

#include "fsdp/comm/launch.h"

namespace fsdp::runtime {

ShardingGroups make_sharding_groups(const comm::ProcessGroupPtr& world, const FsdpOptions& options) {
  if (!world) throw std::invalid_argument("fully_shard: the process group is null");
  ShardingGroups groups;
  groups.world = world;
  if (options.strategy != ShardingStrategy::HybridShard) {
    groups.shard = world;
    return groups;
  }
  const int n = world->size();
  int s = options.shard_group_size;
  if (s == 0) {
    const comm::LaunchInfo launch = comm::launch_info_from_env();
    if (!launch.local_world_size_known && n > 1) {
      // Assumed to be the whole world, it would quietly make hybrid sharding full sharding.
      throw std::invalid_argument(
          "fully_shard: hybrid_shard's shard group is the ranks of one node (shard_group_size = 0), "
          "and the launcher (" +
          launch.launcher + ") does not say how many run on a node (" + launch.local_world_size_variable +
          " unset): set the shard group size (fsdp.shard_group_size)");
    }
    s = launch.local_world_size;
  }
  if (s < 0)
    throw std::invalid_argument("fully_shard: shard_group_size must be 0 (one node) or more, got " + std::to_string(s));
  if (s < 1 || n % s != 0) {
    throw std::invalid_argument("fully_shard: hybrid_shard needs the shard group size to divide the " +
                                std::to_string(n) + " ranks, got " + std::to_string(s) +
                                (options.shard_group_size == 0 ? " (the ranks of this node)" : ""));
  }
  const int rank = world->rank();
  // Ranks [k s, (k + 1) s) shard one copy; ranks r, r + s, r + 2 s, ... hold the same shard.
  groups.shard = s == n ? world : world->split(rank / s, rank);
  if (s < n) groups.replicate = world->split(rank % s, rank);
  return groups;
}

}  // namespace fsdp::runtime
