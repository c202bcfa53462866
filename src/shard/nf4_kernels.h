// src/shard/nf4_kernels.h (private): the launcher of the NF4 decode kernel (nf4_kernels.cu), on raw
// device pointers, so that nvcc never compiles libtorch's headers. Used by nf4_storage.cpp to decode
// a gathered unit's NF4 entries on the GPU in one pass: packed codes and 8-bit absmax in, the
// weight in the compute dtype out, with no int64 or fp32 temporaries.
#pragma once

#include <cstdint>

namespace fsdp::shard::kernels {

enum class Dtype { Float32, BFloat16, Float16 };

// One NF4 weight of n elements, blocks of `blocksize` (a multiple of 8) over it, on the current
// device, every pointer into device memory:
//   codes          uint8 [ceil(n / 2)], two codes a byte, the even element in the high nibble;
//   absmax         fp32 [blocks] (double_quant false) or uint8 [blocks] indices into nested_map;
//   nested_absmax  fp32 [ceil(blocks / nested_blocksize)], offset fp32 [1], nested_map fp32 [256]
//                  (double quantization only; null otherwise);
//   code           the 16 NF4 values (host memory, passed by value);
//   out            [n] in out_dtype.
// out[i] = base(code[nibble i] * absmax[i / blocksize]) widened to out_dtype, where base() rounds
// to base_dtype (what the weight was quantized from, as bitsandbytes' dequantize_4bit returns it)
// and, under double quantization, absmax[b] = map[codes[b]] * nested_absmax[b / nested_blocksize] +
// offset, each product and sum rounded once in fp32 (no fused multiply-add: the host's and
// bitsandbytes' values to the bit).
struct Nf4DecodeArgs {
  const uint8_t* codes = nullptr;
  const void* absmax = nullptr;
  const float* nested_absmax = nullptr;
  const float* offset = nullptr;
  const float* nested_map = nullptr;
  float code[16] = {};
  int64_t n = 0;
  int64_t blocksize = 64;
  int64_t nested_blocksize = 256;
  bool double_quant = true;
  Dtype base_dtype = Dtype::BFloat16;
  Dtype out_dtype = Dtype::BFloat16;
  void* out = nullptr;
};

// Launches on `stream` (a cudaStream_t). Throws std::invalid_argument for a block size that is not
// a multiple of 8 and std::runtime_error on a launch failure.
void nf4_decode(const Nf4DecodeArgs& args, void* stream);

}  // namespace fsdp::shard::kernels
