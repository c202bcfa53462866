// Private to checkpoint/: which elements of a FlatParam's unpadded flat buffer [0, numel) a rank
// holds, and which a checkpoint file stores. Both the sharded checkpoint and the weight import
// read and write by these ranges, so they never depend on padding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "fsdp/shard/flat_param.h"
#include "fsdp/shard/nf4_storage.h"
#include "fsdp/shard/shard_extent.h"

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

// Elements (NF4: bytes) of stored_numel that each of `world` rank files holds of this unit: k of
// the shards (shard/shard_extent.h), so that a sharded rank saves exactly what it holds. The
// manifest records it per unit ("stored_per_file"); format versions 1 and 2 had ceil(numel / world).
inline int64_t stored_per_file(const shard::FlatParam& flat, int world) {
  const int64_t alignment = flat.nf4_storage() != nullptr ? shard::kNf4ShardAlignment : shard::kValueShardAlignment;
  return shard::shard_extent(stored_numel(flat), world, alignment);
}

// [begin, end) of a unit's `numel` stored elements that rank file `rank` holds: `per_file` each,
// the last files fewer or none.
inline std::pair<int64_t, int64_t> saved_range(int64_t numel, int64_t per_file, int rank) {
  const int64_t k = std::min<int64_t>(per_file, std::max<int64_t>(numel, 1));  // rank * k cannot overflow
  const int64_t begin = std::min<int64_t>(static_cast<int64_t>(rank) * k, numel);
  return {begin, std::min<int64_t>(begin + k, numel)};
}

}  // namespace fsdp::checkpoint
