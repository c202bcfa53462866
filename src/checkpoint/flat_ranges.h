// Private to checkpoint/: which elements of a FlatParam's unpadded flat buffer [0, numel) a rank
// holds, and which a checkpoint file stores. Both the sharded checkpoint and the weight import
// read and write by these ranges, so they never depend on padding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "fsdp/shard/flat_param.h"
#include "fsdp/shard/nf4_storage.h"

namespace fsdp::checkpoint {

// What a FlatParam's shards cut and a checkpoint stores: its elements, or for an NF4 base
// (shard/nf4_storage.h) the bytes of its encoding, which do not depend on the number of shards.
inline int64_t stored_numel(const shard::FlatParam& flat) {
  return flat.nf4_storage() != nullptr ? flat.nf4_storage()->bytes : flat.layout().numel;
}
inline int64_t stored_shard_numel(const shard::FlatParam& flat) {
  return flat.nf4_storage() != nullptr ? flat.nf4_storage()->shard_bytes : flat.layout().shard_numel;
}

// [begin, end) of stored_numel held by this rank; shard() element 0 is element `begin`
// (replicated: all, begin 0).
inline std::pair<int64_t, int64_t> held_range(const shard::FlatParam& flat) {
  const int64_t numel = stored_numel(flat);
  if (flat.replicated()) return {0, numel};
  const int64_t begin = std::min<int64_t>(flat.shard_index() * stored_shard_numel(flat), numel);
  return {begin, std::min<int64_t>(begin + stored_shard_numel(flat), numel)};
}

// [begin, end) that rank `rank` of `world` stores in a checkpoint: k = ceil(numel / world) each.
inline std::pair<int64_t, int64_t> saved_range(int64_t numel, int world, int rank) {
  const int64_t k = (numel + world - 1) / world;
  const int64_t begin = std::min<int64_t>(static_cast<int64_t>(rank) * k, numel);
  return {begin, std::min<int64_t>(begin + k, numel)};
}

}  // namespace fsdp::checkpoint
