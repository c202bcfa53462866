// fsdp/runtime/sharding_strategy.h: how fully_shard shards parameters, gradients and optimizer state.
#pragma once

#include <string>

#include "fsdp/enum_names.h"

namespace fsdp::runtime {

// FullShard: parameters gathered for each use and freed after it (ZeRO-3).
// ShardGradOp: gathered in forward and kept until the end of backward (ZeRO-2).
// NoShard: replicated, gradients all-reduced (DDP).
// HybridShard: FullShard inside groups of shard_group_size ranks, replicated across the groups:
// gathers and reduce-scatters stay inside a group (one node's fast links), and each reduced
// gradient shard is then all-reduced across the replicas (HSDP).
enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard };
// Whether parameters are sharded at all (every strategy but NoShard).
inline bool shards_parameters(ShardingStrategy s) { return s != ShardingStrategy::NoShard; }
// Whether gathered parameters are freed after each use (FullShard and HybridShard: gathered twice).
inline bool regathers(ShardingStrategy s) {
  return s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard;
}

const char* to_string(ShardingStrategy strategy);                         // "full_shard", ...
ShardingStrategy sharding_strategy_from_string(const std::string& name);  // throws std::invalid_argument

}  // namespace fsdp::runtime

namespace fsdp {
template <>
struct EnumNames<runtime::ShardingStrategy> {
  static constexpr std::pair<runtime::ShardingStrategy, const char*> values[] = {
      {runtime::ShardingStrategy::FullShard, "full_shard"},
      {runtime::ShardingStrategy::ShardGradOp, "shard_grad_op"},
      {runtime::ShardingStrategy::NoShard, "no_shard"},
      {runtime::ShardingStrategy::HybridShard, "hybrid_shard"},
  };
};
}  // namespace fsdp
