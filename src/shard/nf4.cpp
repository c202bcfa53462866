#include "fsdp/shard/nf4.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>

namespace fsdp::shard {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void check_blocksize(int64_t blocksize) {
  if (blocksize < 32 || blocksize > 4096 || (blocksize & (blocksize - 1)) != 0) {
    throw std::invalid_argument("nf4: block size " + std::to_string(blocksize) +
                                " (bitsandbytes takes 32, 64, 128, 256, 512, 1024, 2048 or 4096)");
  }
}

// bitsandbytes' CPU quantize_blockwise (0.50, csrc/cpu_ops.cpp quantize_cpu_impl), whose bytes
// double quantization stores: per block of `blocksize` its absmax (0 for a block of zeros, whose
// indices are then 0), and each value times 1 / absmax looked up in a table of 65,536 steps over
// [-1, 1], each step holding the index of the map value nearest its left end (ties down). Not
// always the nearest value for the values themselves: near 0 the map's values lie closer together
// than the steps, and bitsandbytes' bytes are what a stored checkpoint holds.
at::Tensor quantize_to_map(const at::Tensor& values, const at::Tensor& map, int64_t blocksize, at::Tensor& absmax) {
  constexpr int kSteps = 65536;
  const int64_t entries = map.numel();
  const float* code = map.data_ptr<float>();
  std::vector<uint8_t> table(kSteps);
  int64_t index_now = 0;
  for (int i = 0; i < kSteps; ++i) {
    const float step_value = -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kSteps - 1);
    while (index_now < entries - 1 && 0.5f * (code[index_now] + code[index_now + 1]) < step_value) ++index_now;
    table[static_cast<size_t>(i)] = static_cast<uint8_t>(index_now);
  }
  const int64_t n = values.numel(), blocks = (n + blocksize - 1) / blocksize;
  const float* x = values.data_ptr<float>();
  at::Tensor out = at::empty({n}, at::kByte);
  absmax = at::empty({blocks}, at::kFloat);
  uint8_t* index = out.data_ptr<uint8_t>();
  float* block_absmax = absmax.data_ptr<float>();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * blocksize, end = std::min(n, begin + blocksize);
    float largest = 0.0f;
    for (int64_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(x[i]));
    block_absmax[b] = largest;
    const float inverse = largest == 0.0f ? 0.0f : 1.0f / largest;
    for (int64_t i = begin; i < end; ++i) {
      if (largest == 0.0f) {
        index[i] = 0;
        continue;
      }
      const float normed = std::clamp(x[i] * inverse, -1.0f, 1.0f);
      const auto step = static_cast<uint16_t>((normed + 1.0f) * 0.5f * static_cast<float>(kSteps - 1) + 0.5f);
      index[i] = table[step];
    }
  }
  return out;
}

void check_size(const at::Tensor& tensor, at::ScalarType dtype, int64_t expected, const char* what,
                const Nf4Weight& weight) {
  if (!tensor.defined() || tensor.scalar_type() != dtype || tensor.numel() != expected) {
    throw std::invalid_argument(std::string("nf4: ") + what + " holds " +
                                (tensor.defined()
                                     ? std::to_string(tensor.numel()) + " " + c10::toString(tensor.scalar_type())
                                     : std::string("nothing")) +
                                ", expected " + std::to_string(expected) + " " + c10::toString(dtype) +
                                " for a weight of shape " + shape_text(weight.shape) + " in blocks of " +
                                std::to_string(weight.blocksize) + " (truncated or of another format)");
  }
}

}  // namespace

const std::array<float, 16>& nf4_code() {
  static const std::array<float, 16> code = {-1.0f,
                                             -0.6961928009986877f,
                                             -0.5250730514526367f,
                                             -0.39491748809814453f,
                                             -0.28444138169288635f,
                                             -0.18477343022823334f,
                                             -0.09105003625154495f,
                                             0.0f,
                                             0.07958029955625534f,
                                             0.16093020141124725f,
                                             0.24611230194568634f,
                                             0.33791524171829224f,
                                             0.44070982933044434f,
                                             0.5626170039176941f,
                                             0.7229568362236023f,
                                             1.0f};
  return code;
}

at::Tensor dynamic_map_signed() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), op for op in fp32 as
  // bitsandbytes computes it with torch: for exponent i, 2^i + 1 fp32 boundaries from 0.1 to 1,
  // their midpoints times +-10^(i-6); with 0 and 1 that makes 256.
  std::vector<double> data;
  for (int i = 0; i < 7; ++i) {
    const at::Tensor boundaries = at::linspace(0.1, 1, (int64_t{1} << i) + 1, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor means = (boundaries.slice(0, 0, -1) + boundaries.slice(0, 1)) / 2.0;
    const double scale = std::pow(10.0, -6 + i);
    for (const double sign : {1.0, -1.0}) {
      const at::Tensor scaled = means * (sign * scale);
      for (int64_t k = 0; k < scaled.numel(); ++k) data.push_back(scaled[k].item<float>());
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  std::sort(data.begin(), data.end());
  at::Tensor map = at::empty({static_cast<int64_t>(data.size())}, at::kFloat);
  for (size_t k = 0; k < data.size(); ++k) map.data_ptr<float>()[k] = static_cast<float>(data[k]);
  return map;
}

int64_t Nf4Weight::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Nf4Weight::blocks() const { return (numel() + blocksize - 1) / blocksize; }

Nf4Weight quantize_nf4(const at::Tensor& weight, int64_t blocksize, bool double_quant) {
  check_blocksize(blocksize);
  if (!weight.defined() || weight.numel() == 0) throw std::invalid_argument("nf4: cannot quantize an empty weight");
  const auto dtype = weight.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
    throw std::invalid_argument(std::string("nf4: weights of ") + c10::toString(dtype) +
                                " (expected float32, bfloat16 or float16)");
  }
  const at::Tensor flat = weight.detach().reshape(-1).to(at::kCPU).to(at::kFloat).contiguous();
  Nf4Weight out;
  out.shape = weight.sizes().vec();
  out.blocksize = blocksize;
  out.double_quant = double_quant;

  // bitsandbytes' default quantize_4bit, in one pass (a chain of tensor ops took minutes at 8 B):
  // whole blocks scaled by the reciprocal of their absmax, the short last block divided by its own;
  // clamped to [-1, 1]; the code index is the number of the code's midpoints below the value
  // (bucketize, a value on a midpoint taking the lower code); two codes to a byte, the first in the
  // high nibble, an odd count padded with 0.0's code. Float arithmetic as those ops do it, so the
  // bytes are theirs (Nf4.QuantizesAsBitsandbytesOpForOp).
  const int64_t n = flat.numel(), blocks = (n + blocksize - 1) / blocksize, whole_blocks = n / blocksize;
  const std::array<float, 16>& code = nf4_code();
  std::array<float, 15> midpoints{};
  for (size_t k = 0; k < midpoints.size(); ++k) midpoints[k] = (code[k] + code[k + 1]) / 2.0f;
  const auto code_of = [&](float scaled) {
    uint8_t index = 0;
    for (float midpoint : midpoints) index += midpoint < scaled ? 1 : 0;
    return index;
  };
  const float* x = flat.data_ptr<float>();
  at::Tensor absmax = at::empty({blocks}, at::kFloat);
  out.packed = at::empty({(n + 1) / 2}, at::kByte);
  float* block_absmax = absmax.data_ptr<float>();
  uint8_t* packed = out.packed.data_ptr<uint8_t>();
  std::atomic<bool> finite{true};
  // blocksize is even (a power of two, 32 or more): a block's codes fill whole bytes.
  at::parallel_for(0, blocks, 16, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t begin = b * blocksize, end = std::min(n, begin + blocksize);
      float largest = 0.0f;
      for (int64_t i = begin; i < end; ++i) {
        if (!std::isfinite(x[i])) finite = false;
        largest = std::max(largest, std::fabs(x[i]));
      }
      block_absmax[b] = largest;
      const bool whole = b < whole_blocks;
      const float divisor = std::max(largest, 1e-38f), inverse = 1.0f / divisor;
      for (int64_t i = begin; i < end; i += 2) {
        const auto scaled = [&](int64_t j) {
          if (j >= n) return 0.0f;  // the padding of an odd count
          return std::clamp(whole ? x[j] * inverse : x[j] / divisor, -1.0f, 1.0f);
        };
        packed[i / 2] = static_cast<uint8_t>((code_of(scaled(i)) << 4) | code_of(scaled(i + 1)));
      }
    }
  });
  if (!finite) throw std::invalid_argument("nf4: the weight holds a value that is not finite");

  if (!double_quant) {
    out.absmax = absmax.contiguous();
    return out;
  }
  // Double quantization (functional.quantize_4bit with compress_statistics): the absmax less
  // their mean, in blocks of 256, to the signed dynamic map. libtorch splits a long sum over its
  // threads, and the split moves the mean's last bit and with it a few blocks' 8-bit codes (for
  // bitsandbytes too: its bytes depend on its thread count). The mean is summed at one thread
  // (libtorch's count is this thread's OpenMP setting, put back after): the bytes are the same on
  // any machine, and bitsandbytes' wherever it sums in one piece (up to 32,768 blocks, or one thread).
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor mean = absmax.mean();
  at::set_num_threads(threads);
  out.offset = mean.item<float>();
  const at::Tensor centred = (absmax - mean).contiguous();
  out.nested_map = dynamic_map_signed();
  out.absmax = quantize_to_map(centred, out.nested_map, out.nested_blocksize, out.nested_absmax);
  return out;
}

at::Tensor nf4_block_absmax(const Nf4Weight& weight) {
  check_blocksize(weight.blocksize);
  const int64_t blocks = weight.blocks();
  if (!weight.double_quant) {
    check_size(weight.absmax, at::kFloat, blocks, "absmax", weight);
    return weight.absmax;
  }
  check_size(weight.absmax, at::kByte, blocks, "absmax (8-bit, double quantization)", weight);
  if (weight.nested_blocksize < 1) throw std::invalid_argument("nf4: nested block size must be 1 or more");
  check_size(weight.nested_absmax, at::kFloat, (blocks + weight.nested_blocksize - 1) / weight.nested_blocksize,
             "nested absmax", weight);
  check_size(weight.nested_map, at::kFloat, 256, "nested quant map", weight);
  return nf4_absmax_from_codes(weight.absmax, weight.nested_absmax, at::full({1}, weight.offset, at::kFloat),
                               weight.nested_blocksize, weight.nested_map);
}

at::Tensor nf4_absmax_from_codes(const at::Tensor& codes, const at::Tensor& nested_absmax, const at::Tensor& offset,
                                 int64_t nested_blocksize, const at::Tensor& nested_map) {
  // bitsandbytes: dequantize_blockwise (map[index] * nested absmax, in fp32), then += offset.
  const at::Tensor map = (nested_map.defined() ? nested_map : dynamic_map_signed()).to(codes.device());
  const at::Tensor values = map.index({codes.to(at::kLong)});
  const at::Tensor scale = nested_absmax.repeat_interleave(nested_blocksize).slice(0, 0, codes.numel());
  return values * scale + offset.to(codes.device());
}

at::Tensor nf4_values(const at::Tensor& packed_codes, const at::Tensor& absmax, int64_t numel, int64_t blocksize,
                      at::ScalarType dtype) {
  const at::Tensor packed = packed_codes.reshape(-1).to(at::kLong);
  const at::Tensor index =
      at::stack({at::bitwise_right_shift(packed, 4), at::bitwise_and(packed, 15)}, 1).reshape(-1).slice(0, 0, numel);
  const std::array<float, 16>& code_values = nf4_code();
  const at::Tensor code = at::from_blob(const_cast<float*>(code_values.data()), {16}, at::kFloat).to(packed.device());
  const at::Tensor scale = absmax.repeat_interleave(blocksize).slice(0, 0, numel);
  return (code.index({index}) * scale).to(dtype);
}

at::Tensor dequantize_nf4(const Nf4Weight& weight, at::ScalarType dtype) {
  const int64_t n = weight.numel();
  if (n <= 0) throw std::invalid_argument("nf4: a weight of shape " + shape_text(weight.shape) + " holds nothing");
  check_size(weight.packed, at::kByte, (n + 1) / 2, "packed weight", weight);
  return nf4_values(weight.packed, nf4_block_absmax(weight), n, weight.blocksize, dtype).reshape(weight.shape);
}

}  // namespace fsdp::shard
