#include "fsdp/shard/nf4_storage.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "fsdp/shard/nf4.h"
#include "fsdp/shard/shard_extent.h"

#ifdef FSDP_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "nf4_kernels.h"
#endif

namespace fsdp::shard {
namespace {

constexpr int64_t kAlign = 16;  // every part: fp32 parts are read as views of the bytes

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The next part of `bytes` bytes at `cursor` (advanced past it, aligned).
Nf4Part take(int64_t& cursor, int64_t bytes) {
  Nf4Part part{cursor, bytes};
  cursor = aligned(cursor + bytes);
  return part;
}

at::Tensor bytes_of(const at::Tensor& t) { return t.contiguous().view(at::kByte).reshape(-1); }

// out[i] = code[nibble i] * absmax[i / blocksize], in fp32, rounded to the base's dtype R (what
// bitsandbytes' dequantize_4bit returns for a weight quantized in R) and then widened to out's
// dtype T: what nf4_values computes, element by element without its int64 and fp32 temporaries
// (five times the weight's size), in parallel over blocks. codes: uint8 [ceil(n / 2)], absmax:
// fp32 [blocks].
template <class R, class T>
void decode_codes(const uint8_t* codes, const float* absmax, int64_t blocksize, int64_t n, T* out) {
  const std::array<float, 16>& code = nf4_code();
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::parallel_for(0, blocks, 16, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const float scale = absmax[b];
      const int64_t end = std::min(n, (b + 1) * blocksize);
      for (int64_t i = b * blocksize; i < end; ++i) {
        const uint8_t byte = codes[i / 2];
        const R value = static_cast<R>(code[i % 2 == 0 ? byte >> 4 : byte & 15] * scale);
        out[i] = static_cast<T>(value);
      }
    }
  });
}

template <class R>
void decode_codes_as(const uint8_t* codes, const float* absmax, int64_t blocksize, const at::Tensor& out) {
  const int64_t n = out.numel();
  switch (out.scalar_type()) {
    case at::kFloat: decode_codes<R>(codes, absmax, blocksize, n, out.data_ptr<float>()); break;
    case at::kBFloat16: decode_codes<R>(codes, absmax, blocksize, n, out.data_ptr<at::BFloat16>()); break;
    case at::kHalf: decode_codes<R>(codes, absmax, blocksize, n, out.data_ptr<at::Half>()); break;
    default:
      throw std::invalid_argument(std::string("nf4 storage: cannot decode into ") + c10::toString(out.scalar_type()));
  }
}

void decode_codes_on_cpu(const at::Tensor& codes, const at::Tensor& absmax, int64_t blocksize,
                         at::ScalarType base_dtype, const at::Tensor& out) {
  const auto* c = codes.data_ptr<uint8_t>();
  const auto* a = absmax.data_ptr<float>();
  switch (base_dtype) {
    case at::kFloat: decode_codes_as<float>(c, a, blocksize, out); break;
    case at::kBFloat16: decode_codes_as<at::BFloat16>(c, a, blocksize, out); break;
    case at::kHalf: decode_codes_as<at::Half>(c, a, blocksize, out); break;
    default: throw std::invalid_argument(std::string("nf4 storage: a base of ") + c10::toString(base_dtype));
  }
}

#ifdef FSDP_HAVE_CUDA_KERNELS
kernels::Dtype kernel_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return kernels::Dtype::Float32;
    case at::kBFloat16: return kernels::Dtype::BFloat16;
    case at::kHalf: return kernels::Dtype::Float16;
    default: throw std::invalid_argument(std::string("nf4 storage: cannot decode into ") + c10::toString(dtype));
  }
}

// dynamic_map_signed() on `device`, copied there once. Never freed: a device tensor destroyed
// after the CUDA context at exit would fail.
const at::Tensor& nested_map_on(const at::Device& device) {
  static std::mutex mutex;
  static auto* maps = new std::map<int, at::Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& map = (*maps)[device.index()];
  if (!map.defined()) map = dynamic_map_signed().to(device);
  return map;
}

// The NF4 entry `place` of `bytes` (on a CUDA device) decoded into `target` (contiguous, same
// device) by nf4_kernels.cu in one pass, on the current stream.
void decode_entry_on_device(const Nf4StorageLayout& storage, const Nf4EntryLayout& place, const at::Tensor& bytes,
                            const at::Tensor& target) {
  const c10::cuda::CUDAGuard guard(bytes.device());
  const auto* base = bytes.data_ptr<uint8_t>();
  kernels::Nf4DecodeArgs args;
  args.codes = base + place.codes.offset;
  args.absmax = base + place.absmax.offset;
  if (storage.double_quant) {
    args.nested_absmax = reinterpret_cast<const float*>(base + place.nested_absmax.offset);
    args.offset = reinterpret_cast<const float*>(base + place.offset.offset);
    args.nested_map = nested_map_on(bytes.device()).data_ptr<float>();
  }
  std::copy(nf4_code().begin(), nf4_code().end(), args.code);
  args.n = target.numel();
  args.blocksize = storage.blocksize;
  args.double_quant = storage.double_quant;
  args.base_dtype = kernel_dtype(storage.raw_dtype);
  args.out_dtype = kernel_dtype(target.scalar_type());
  args.out = target.data_ptr();
  kernels::nf4_decode(args, c10::cuda::getCurrentCUDAStream(bytes.device().index()).stream());
}

// Where this build has the NF4 decode kernel, it takes CUDA bytes decoded into a contiguous float
// target; otherwise the composed nf4_values (a dozen kernels, int64 and fp32 temporaries).
// The bytes must start 16-byte aligned, as the layout's parts assume (the kernel reads the fp32
// parts in place; the composed path's view() refuses a misaligned one by name).
bool device_kernel_takes(const at::Tensor& bytes, const at::Tensor& target) {
  const at::ScalarType dtype = target.scalar_type();
  return bytes.is_cuda() && target.device() == bytes.device() && bytes.is_contiguous() && target.is_contiguous() &&
         reinterpret_cast<uintptr_t>(bytes.data_ptr()) % 16 == 0 &&
         (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
}
#endif

}  // namespace

bool nf4_decode_kernel_compiled() {
#ifdef FSDP_HAVE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

Nf4StorageLayout Nf4StorageLayout::make(const FlatLayout& layout, const std::vector<bool>& nf4, int num_shards,
                                        bool double_quant, at::ScalarType raw_dtype) {
  if (nf4.size() != layout.entries.size()) {
    throw std::invalid_argument("nf4 storage: " + std::to_string(nf4.size()) + " flags for " +
                                std::to_string(layout.entries.size()) + " entries");
  }
  if (num_shards < 1) throw std::invalid_argument("nf4 storage: the number of shards must be at least 1");
  if (raw_dtype != at::kFloat && raw_dtype != at::kBFloat16 && raw_dtype != at::kHalf) {
    throw std::invalid_argument(
        std::string("nf4 storage: other entries are stored in float32, bfloat16 or float16, not ") +
        c10::toString(raw_dtype));
  }
  Nf4StorageLayout out;
  out.double_quant = double_quant;
  out.raw_dtype = raw_dtype;
  int64_t cursor = 0;
  for (size_t i = 0; i < layout.entries.size(); ++i) {
    const int64_t numel = layout.entries[i].numel;
    Nf4EntryLayout entry;
    entry.nf4 = nf4[i];
    entry.begin = cursor;
    if (entry.nf4) {
      const int64_t blocks = (numel + out.blocksize - 1) / out.blocksize;
      entry.codes = take(cursor, (numel + 1) / 2);
      if (double_quant) {
        entry.absmax = take(cursor, blocks);
        entry.nested_absmax = take(cursor, 4 * ((blocks + 255) / 256));
        entry.offset = take(cursor, 4);
      } else {
        entry.absmax = take(cursor, 4 * blocks);
      }
    } else {
      entry.raw = take(cursor, numel * static_cast<int64_t>(c10::elementSize(raw_dtype)));
    }
    entry.end = cursor;
    out.entries.push_back(entry);
  }
  out.bytes = cursor;
  out.shard_bytes = shard_extent(cursor, num_shards, kNf4ShardAlignment);
  out.padded_bytes = out.shard_bytes * num_shards;
  return out;
}

int64_t Nf4StorageLayout::nf4_weights() const {
  int64_t count = 0;
  for (const auto& entry : entries) count += entry.nf4 ? 1 : 0;
  return count;
}

namespace {

// The entry's bytes with each part from `tensors` (codes, absmax[, nested absmax, offset] or raw),
// each checked against the size laid out.
at::Tensor entry_bytes(const Nf4StorageLayout& storage, size_t index,
                       const std::vector<std::pair<const Nf4Part*, at::Tensor>>& tensors) {
  const Nf4EntryLayout& entry = storage.entries.at(index);
  at::Tensor out = at::zeros({entry.end - entry.begin}, at::kByte);
  for (const auto& [part, tensor] : tensors) {
    const at::Tensor raw = bytes_of(tensor.to(at::kCPU));
    if (raw.numel() != part->bytes) {
      throw std::invalid_argument("nf4 storage: entry " + std::to_string(index) + " has a part of " +
                                  std::to_string(raw.numel()) + " bytes where " + std::to_string(part->bytes) +
                                  " are laid out (truncated or of another shape)");
    }
    out.narrow(0, part->offset - entry.begin, part->bytes).copy_(raw);
  }
  return out;
}

}  // namespace

void check_nf4_entry_quantization(const Nf4StorageLayout& storage, size_t index, const Nf4Weight& weight) {
  const Nf4EntryLayout& entry = storage.entries.at(index);
  if (!entry.nf4) throw std::logic_error("nf4 storage: entry " + std::to_string(index) + " is not stored as NF4");
  if (weight.blocksize != storage.blocksize || weight.double_quant != storage.double_quant ||
      (weight.double_quant && weight.nested_blocksize != 256)) {
    throw std::invalid_argument(
        "nf4 storage: a weight in blocks of " + std::to_string(weight.blocksize) +
        (weight.double_quant ? ", double quantization in blocks of " + std::to_string(weight.nested_blocksize)
                             : std::string(", no double quantization")) +
        "; this storage holds blocks of " + std::to_string(storage.blocksize) +
        (storage.double_quant ? ", double quantization in blocks of 256" : ", no double quantization"));
  }
}

at::Tensor nf4_entry_bytes(const Nf4StorageLayout& storage, size_t index, const Nf4Weight& weight) {
  check_nf4_entry_quantization(storage, index, weight);
  const Nf4EntryLayout& entry = storage.entries.at(index);
  if (!weight.double_quant)
    return entry_bytes(storage, index, {{&entry.codes, weight.packed}, {&entry.absmax, weight.absmax}});
  return entry_bytes(storage, index,
                     {{&entry.codes, weight.packed},
                      {&entry.absmax, weight.absmax},
                      {&entry.nested_absmax, weight.nested_absmax},
                      {&entry.offset, at::full({1}, weight.offset, at::kFloat)}});
}

at::Tensor encode_nf4_entry(const Nf4StorageLayout& storage, size_t index, const at::Tensor& values) {
  const Nf4EntryLayout& entry = storage.entries.at(index);
  if (!entry.nf4) return entry_bytes(storage, index, {{&entry.raw, values.reshape(-1).to(storage.raw_dtype)}});
  // Quantized from the base's dtype, as bitsandbytes' Linear4bit quantizes the bf16 weights
  // transformers loads (its absmax and scaled values computed in that dtype).
  return nf4_entry_bytes(
      storage, index, quantize_nf4(values.reshape(-1).to(storage.raw_dtype), storage.blocksize, storage.double_quant));
}

at::Tensor encode_nf4_storage(const Nf4StorageLayout& storage, const FlatLayout& layout, const at::Tensor& unsharded) {
  at::Tensor out = at::zeros({storage.padded_bytes}, at::kByte);
  for (size_t i = 0; i < layout.entries.size(); ++i) {
    const FlatEntry& entry = layout.entries[i];
    const Nf4EntryLayout& place = storage.entries[i];
    out.narrow(0, place.begin, place.end - place.begin)
        .copy_(encode_nf4_entry(storage, i, unsharded.narrow(0, entry.offset, entry.numel)));
  }
  return out;
}

void decode_nf4_storage(const Nf4StorageLayout& storage, const FlatLayout& layout, const at::Tensor& bytes,
                        const at::Tensor& unsharded) {
  if (bytes.scalar_type() != at::kByte || bytes.numel() < storage.bytes) {
    throw std::invalid_argument("nf4 storage: decoding needs " + std::to_string(storage.bytes) +
                                " bytes (uint8), got " + std::to_string(bytes.numel()) + " " +
                                c10::toString(bytes.scalar_type()));
  }
  auto part = [&](const Nf4Part& p, at::ScalarType dtype) { return bytes.narrow(0, p.offset, p.bytes).view(dtype); };
  for (size_t i = 0; i < layout.entries.size(); ++i) {
    const FlatEntry& entry = layout.entries[i];
    const Nf4EntryLayout& place = storage.entries[i];
    at::Tensor target = unsharded.narrow(0, entry.offset, entry.numel);
    if (!place.nf4) {
      target.copy_(part(place.raw, storage.raw_dtype));
      continue;
    }
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (device_kernel_takes(bytes, target)) {
      decode_entry_on_device(storage, place, bytes, target);
      continue;
    }
#endif
    const at::Tensor absmax = storage.double_quant ? nf4_absmax_from_codes(part(place.absmax, at::kByte),
                                                                           part(place.nested_absmax, at::kFloat),
                                                                           part(place.offset, at::kFloat))
                                                   : part(place.absmax, at::kFloat);
    if (bytes.device().is_cpu() && target.is_contiguous()) {
      decode_codes_on_cpu(part(place.codes, at::kByte), absmax.contiguous(), storage.blocksize, storage.raw_dtype,
                          target);
    } else {
      target.copy_(nf4_values(part(place.codes, at::kByte), absmax, entry.numel, storage.blocksize, storage.raw_dtype));
    }
  }
}

}  // namespace fsdp::shard
