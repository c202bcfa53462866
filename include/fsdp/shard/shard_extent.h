// fsdp/shard/shard_extent.h: how much of a flat buffer each rank keeps, the one rule that
// FlatLayout (values), Nf4StorageLayout (NF4 bytes) and a checkpoint's rank files share.
//
// A buffer of `total` elements cut among N ranks: rank r keeps [r*k, (r+1)*k) of it padded to
// N*k. k is ceil(total / N) rounded up to `alignment`, so every rank's piece of a gathered
// buffer [N*k] and of a reduce-scatter's input starts on a 16-byte boundary: NCCL and the cast
// and decode kernels move 16 bytes at a time only where every segment starts on one (a rank's
// piece of a bf16 buffer with k odd starts 2 bytes off). At one rank there is no start to align:
// k = total (at least 1, so no buffer is empty), and a unit of one parameter can adopt its memory.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fsdp::shard {

// A value buffer's k is a multiple of 8 elements: 16 bytes of bf16 or fp16, 32 of fp32.
constexpr int64_t kValueShardAlignment = 8;
// An NF4 string's k is a multiple of 16 bytes (its parts start on 16 bytes already).
constexpr int64_t kNf4ShardAlignment = 16;

// k for `total` elements (or bytes) among `num_shards` ranks, each start a multiple of `alignment`.
constexpr int64_t shard_extent(int64_t total, int num_shards, int64_t alignment) {
  if (num_shards == 1) return std::max<int64_t>(total, 1);
  const int64_t even = std::max<int64_t>((total + num_shards - 1) / num_shards, 1);
  return (even + alignment - 1) / alignment * alignment;
}

}  // namespace fsdp::shard
