// fsdp/shard/nf4_storage.h: a frozen FlatParam's values as one string of bytes, QLoRA's base: each
// linear weight in bitsandbytes' NF4 (shard/nf4.h), each other entry (norms, biases, embeddings)
// in a narrow float dtype. The FlatParam shards these bytes like any buffer: each rank keeps
// shard_bytes of them, a gather moves uint8 (about 4.1 bits per weight with double quantization),
// and the unit's weights are decoded into the compute dtype after it. A weight's codes and its
// scales live in the same bytes, so they are sharded, gathered and freed together by construction.
//
// Per entry, in FlatLayout's order, each part starting at a multiple of 16 bytes:
//   NF4, double quantization:  codes uint8 [ceil(numel / 2)] | absmax codes uint8 [blocks] |
//                              nested absmax fp32 [ceil(blocks / 256)] | offset fp32 [1]
//   NF4 without it:            codes uint8 [ceil(numel / 2)] | absmax fp32 [blocks]
//   raw:                       the values in raw_dtype [numel]
// raw_dtype is the base's dtype: an NF4 weight is quantized from its values in it and decodes to
// it (as bitsandbytes quantizes a bf16 weight and dequantizes to bf16), then to the compute dtype.
// Every part holds exactly bitsandbytes' tensor (quantize_4bit's packed weight, absmax,
// state2.absmax, offset), blocks of 64 over the weight flattened row-major. The string is padded
// with zeros to padded_bytes, shard_bytes per shard (each shard starting on 16 bytes,
// shard/shard_extent.h); the bytes before the padding do not depend on the number of shards.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "fsdp/shard/flat_param.h"
#include "fsdp/shard/nf4.h"

namespace fsdp::shard {

struct Nf4Part {
  int64_t offset = 0;  // bytes from the start of the string
  int64_t bytes = 0;
};

struct Nf4EntryLayout {
  bool nf4 = false;
  Nf4Part codes, absmax, nested_absmax, offset;  // NF4 entries (nested_absmax, offset: double quantization)
  Nf4Part raw;                                   // raw entries
  int64_t begin = 0, end = 0;                    // the entry's bytes, parts and alignment included
};

struct Nf4StorageLayout {
  std::vector<Nf4EntryLayout> entries;  // one per FlatLayout entry
  int64_t blocksize = 64;
  bool double_quant = true;
  at::ScalarType raw_dtype = at::kBFloat16;
  int64_t bytes = 0;         // the entries' bytes
  int64_t padded_bytes = 0;  // shard_bytes * num_shards
  int64_t shard_bytes = 0;   // shard_extent(bytes, num_shards, kNf4ShardAlignment)

  // `nf4[i]`: store entry i as NF4 (one flag per entry of `layout`); raw_dtype: float32, bfloat16
  // or float16. Throws std::invalid_argument naming a bad argument.
  static Nf4StorageLayout make(const FlatLayout& layout, const std::vector<bool>& nf4, int num_shards,
                               bool double_quant = true, at::ScalarType raw_dtype = at::kBFloat16);
  int64_t nf4_weights() const;  // entries stored as NF4
};

// Entry `index`'s bytes (uint8 [entry.end - entry.begin], on the CPU) for its values (`values`:
// the entry's numel elements, any float dtype, any device).
at::Tensor encode_nf4_entry(const Nf4StorageLayout& storage, size_t index, const at::Tensor& values);

// Entry `index`'s bytes for a weight already in NF4 (bitsandbytes' own, read from a transformers
// 4-bit directory): its parts copied as they are. Throws std::invalid_argument when its block
// sizes or double quantization differ from the storage's or a part's size from the layout's.
at::Tensor nf4_entry_bytes(const Nf4StorageLayout& storage, size_t index, const Nf4Weight& weight);
// nf4_entry_bytes' check of the block sizes and double quantization alone: it needs only the
// weight's quantization state (a reader checks every weight so before it writes any).
void check_nf4_entry_quantization(const Nf4StorageLayout& storage, size_t index, const Nf4Weight& weight);

// The whole string (uint8 [padded_bytes], CPU) for the unsharded values [>= layout.numel].
at::Tensor encode_nf4_storage(const Nf4StorageLayout& storage, const FlatLayout& layout, const at::Tensor& unsharded);

// Writes each entry's values, decoded from `bytes` (uint8 [padded_bytes], 16-byte aligned, on any
// device), into `unsharded` (any float dtype, >= layout.numel elements, same device) at its offset.
// On a CUDA device, into a contiguous target, each NF4 entry is one launch of fsdp.cpp's decode
// kernel where the build has it (nf4_decode_kernel_compiled()): the same values to the bit.
void decode_nf4_storage(const Nf4StorageLayout& storage, const FlatLayout& layout, const at::Tensor& bytes,
                        const at::Tensor& unsharded);

// Whether this build has the CUDA NF4 decode kernel (src/shard/nf4_kernels.cu; needs nvcc).
bool nf4_decode_kernel_compiled();

}  // namespace fsdp::shard
