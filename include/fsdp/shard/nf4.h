// fsdp/shard/nf4.h: bitsandbytes' 4-bit NormalFloat (NF4) format, byte for byte, for a frozen
// QLoRA base (issue 35: this file is the format; the base layer and its sharding build on it).
//
// What bitsandbytes' Linear4bit stores (quant_type "nf4", bitsandbytes.functional.quantize_4bit):
//   - the weight, flattened in row-major order, in blocks of `blocksize` (64) elements; the last
//     block may be shorter;
//   - per block its absmax (fp32): the largest |x|;
//   - per element the index (0..15) of the NF4 code value nearest x / absmax, two to a byte, the
//     even element in the high nibble; an odd count is padded with the code of 0.0 (index 7).
// With double quantization (bnb_4bit_use_double_quant, compress_statistics) the absmax are stored
// too in 8 bits: their mean (`offset`, fp32) is subtracted, and the centred values are quantized in
// blocks of 256 to the nearest value of the signed 8-bit dynamic map, each block with its fp32
// absmax (`nested_absmax`). Dequantizing undoes it: absmax = map[code] * nested_absmax + offset.
//
// Rounding is bitsandbytes' own, so that the bytes are its bytes (tests/hf/check_nf4.py compares
// them against bitsandbytes on the CPU): NF4 indices by bucketize on the codes' fp32 midpoints
// (a value on a midpoint goes down), the scaled value x * (1 / absmax) for whole blocks and
// x / absmax for the last, short one, clamped to [-1, 1]; the 8-bit map's index as bitsandbytes'
// CPU quantize_blockwise finds it, through a table of 65,536 steps over [-1, 1] (not always the
// nearest map value near 0, where the map is finer than the steps).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

namespace fsdp::shard {

// bitsandbytes' 16 NF4 values (quantiles of N(0, 1) scaled to [-1, 1]), ascending.
const std::array<float, 16>& nf4_code();

// bitsandbytes' create_dynamic_map(signed=True): 256 fp32 values, ascending, from -0.993 to 1.
at::Tensor dynamic_map_signed();

struct Nf4Weight {
  std::vector<int64_t> shape;  // the weight's
  int64_t blocksize = 64;
  at::Tensor packed;  // uint8 [ceil(numel / 2)]
  // Without double quantization: fp32 [blocks]. With: uint8 [blocks], indices into nested_map.
  at::Tensor absmax;
  bool double_quant = false;
  float offset = 0.0f;       // mean of the fp32 absmax (double quantization)
  at::Tensor nested_absmax;  // fp32 [ceil(blocks / 256)] (double quantization)
  at::Tensor nested_map;     // fp32 [256] (double quantization): dynamic_map_signed()
  int64_t nested_blocksize = 256;

  int64_t numel() const;
  int64_t blocks() const;
};

// `weight`: fp32, bf16 or fp16, any shape (read as fp32, as bitsandbytes does). `blocksize`:
// 32 ... 4096, a power of two as bitsandbytes allows. Throws std::invalid_argument naming the
// problem (empty, non-finite values, bad block size, dtype).
Nf4Weight quantize_nf4(const at::Tensor& weight, int64_t blocksize = 64, bool double_quant = true);

// The fp32 absmax per block (undoing double quantization where it was applied).
at::Tensor nf4_block_absmax(const Nf4Weight& weight);

// The weight in `dtype` and its shape: NF4 value * absmax in fp32, then rounded to `dtype`.
// Checks every tensor's size against shape and block size (a truncated absmax is named).
at::Tensor dequantize_nf4(const Nf4Weight& weight, at::ScalarType dtype = at::kFloat);

// dequantize_nf4's two steps, for parts that live elsewhere (nf4_storage.h), unchecked, on any one
// device: the fp32 absmax [blocks] from double quantization's 8-bit codes [blocks], nested absmax
// fp32 and offset fp32 [1] (nested_map: dynamic_map_signed() when undefined); the weight's values
// flat [numel] in `dtype` from its packed codes and fp32 absmax.
at::Tensor nf4_absmax_from_codes(const at::Tensor& codes, const at::Tensor& nested_absmax, const at::Tensor& offset,
                                 int64_t nested_blocksize = 256, const at::Tensor& nested_map = {});
at::Tensor nf4_values(const at::Tensor& packed_codes, const at::Tensor& absmax, int64_t numel, int64_t blocksize,
                      at::ScalarType dtype);

}  // namespace fsdp::shard
