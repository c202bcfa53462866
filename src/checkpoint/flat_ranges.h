// Private to checkpoint/: which elements of a FlatParam's unpadded flat buffer [0, numel) a rank
// holds, and which a checkpoint file stores. Both the sharded checkpoint and the weight import
// read and write by these ranges, so they never depend on padding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "fsdp/shard/flat_param.h"

namespace fsdp::checkpoint {

// [begin, end) held by this rank; shard() element 0 is element `begin` (replicated: all, begin 0).
inline std::pair<int64_t, int64_t> held_range(const shard::FlatParam& flat) {
  const auto& layout = flat.layout();
  if (flat.replicated()) return {0, layout.numel};
  const int64_t begin = std::min<int64_t>(flat.shard_index() * layout.shard_numel, layout.numel);
  return {begin, std::min<int64_t>(begin + layout.shard_numel, layout.numel)};
}

// [begin, end) that rank `rank` of `world` stores in a checkpoint: k = ceil(numel / world) each.
inline std::pair<int64_t, int64_t> saved_range(int64_t numel, int world, int rank) {
  const int64_t k = (numel + world - 1) / world;
  const int64_t begin = std::min<int64_t>(static_cast<int64_t>(rank) * k, numel);
  return {begin, std::min<int64_t>(begin + k, numel)};
}

}  // namespace fsdp::checkpoint
