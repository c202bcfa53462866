// fsdp/runtime/sharding_groups.h: the process groups a model is sharded over.
//
// Shard group: ranks holding one copy of the model between them (gathers, reduce-scatters).
// Replicate group: the ranks holding the same shard in the other copies (HybridShard's gradient
// all-reduce); null when there is one copy. Ranks [k S, (k + 1) S) form shard group k, so a node's
// ranks share one when S divides its count.
#pragma once

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/options.h"

namespace fsdp::runtime {

struct ShardingGroups {
  comm::ProcessGroupPtr world;
  comm::ProcessGroupPtr shard;
  comm::ProcessGroupPtr replicate;
  int replica_index() const { return shard ? world->rank() / shard->size() : 0; }
};

// Collective over `world` (splits it for HybridShard). Throws if S does not divide N.
ShardingGroups make_sharding_groups(const comm::ProcessGroupPtr& world, const FsdpOptions& options);

}  // namespace fsdp::runtime
