#include "fsdp/runtime/options.h"

#include <stdexcept>

namespace fsdp::runtime {

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::FullShard: return "full_shard";
    case ShardingStrategy::ShardGradOp: return "shard_grad_op";
    case ShardingStrategy::NoShard: return "no_shard";
    case ShardingStrategy::HybridShard: return "hybrid_shard";
  }
  return "?";
}

ShardingStrategy sharding_strategy_from_string(const std::string& name) {
  if (name == "full_shard") return ShardingStrategy::FullShard;
  if (name == "shard_grad_op") return ShardingStrategy::ShardGradOp;
  if (name == "no_shard") return ShardingStrategy::NoShard;
  if (name == "hybrid_shard") return ShardingStrategy::HybridShard;
  throw std::invalid_argument("unknown sharding strategy '" + name +
                              "' (expected full_shard, shard_grad_op, no_shard or hybrid_shard)");
}

}  // namespace fsdp::runtime
