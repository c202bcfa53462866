// NF4 (shard/nf4.h): the layout by hand, round-trip error bounds, double quantization, and the
// errors. Bit-for-bit agreement with bitsandbytes is tests/hf/check_nf4.py (CTest nf4_bitsandbytes).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "fsdp/shard/nf4.h"
#include "fsdp/shard/nf4_storage.h"

namespace nf4_tests {

using fsdp::shard::dequantize_nf4;
using fsdp::shard::nf4_block_absmax;
using fsdp::shard::quantize_nf4;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// [1, -1, 0, 0.5] in one block of absmax 1: codes 15, 0, 7 and 12 (0.5 lies below the midpoint of
// 0.4407 and 0.5626), two to a byte with the first element in the high nibble; an odd count is
// padded with 0.0's code, 7.
TEST(Nf4, PacksTwoCodesToAByteHighNibbleFirst) {
  const auto weight = quantize_nf4(torch::tensor({1.0f, -1.0f, 0.0f, 0.5f}), 64, /*double_quant=*/false);
  ASSERT_EQ(weight.packed.numel(), 2);
  EXPECT_EQ(weight.packed[0].item<int>(), 0xF0);
  EXPECT_EQ(weight.packed[1].item<int>(), 0x7C);
  EXPECT_EQ(weight.absmax.item<float>(), 1.0f);
  const auto odd = quantize_nf4(torch::tensor({-2.0f}), 64, false);
  EXPECT_EQ(odd.packed[0].item<int>(), 0x07);
  EXPECT_EQ(odd.absmax.item<float>(), 2.0f);
  EXPECT_TRUE(torch::equal(dequantize_nf4(odd), torch::tensor({-2.0f})));
}

// quantize_nf4 is one pass over the values (8 B weights took minutes as a chain of tensor ops);
// it must give the bytes of bitsandbytes' formulation, which this writes out op for op: whole blocks
// times the reciprocal of their absmax, the short last block divided by its own, clamped, then
// bucketize on the midpoints of the code (a value equal to a midpoint takes the lower code). The
// weights: float32 and bfloat16, a short last block and an odd count, a block of zeros, and a block
// whose values lie exactly on the midpoints and on each side of them.
TEST(Nf4, QuantizesAsBitsandbytesOpForOp) {
  // The code's values are checked against bitsandbytes' by tests/hf/check_nf4.py; this checks the arithmetic.
  const std::vector<float> code(fsdp::shard::nf4_code().begin(), fsdp::shard::nf4_code().end());
  const auto code_tensor = torch::tensor(code);
  const auto midpoints = (code_tensor.slice(0, 0, -1) + code_tensor.slice(0, 1)) / 2;
  auto reference = [&](const at::Tensor& weight, int64_t blocksize) {
    const auto flat = weight.reshape(-1).to(at::kFloat);
    const int64_t n = flat.numel(), full = n - n % blocksize;
    std::vector<at::Tensor> absmax, scaled;
    const auto blocks = flat.slice(0, 0, full).reshape({-1, blocksize});
    absmax.push_back(std::get<0>(blocks.abs().max(-1)));
    scaled.push_back(at::clamp(blocks * at::reciprocal(absmax[0].clamp_min(1e-38)).view({-1, 1}), -1, 1).reshape(-1));
    if (full < n) {
      const auto largest = flat.slice(0, full).abs().max().clamp_min(1e-38);
      absmax.push_back(largest.unsqueeze(0));
      scaled.push_back(at::clamp(flat.slice(0, full) / largest, -1, 1));
    }
    auto all = at::cat(scaled);
    if (all.numel() % 2) all = at::constant_pad_nd(all, {0, 1}, 0.0);
    const auto index = at::bucketize(all, midpoints, true).to(at::kByte);
    const auto packed = at::bitwise_or(at::bitwise_left_shift(index.slice(0, 0, c10::nullopt, 2), 4),
                                       index.slice(0, 1, c10::nullopt, 2));
    return std::make_pair(packed, at::cat(absmax));
  };
  torch::manual_seed(11);
  auto edges = torch::zeros({3, 64});
  edges[0] = torch::randn({64});                            // an ordinary block
  edges[1].zero_();                                         // zeros: absmax 0, every code 7
  edges[2].slice(0, 0, 15).copy_(midpoints);                // on the midpoints
  edges[2].slice(0, 15, 30).copy_(midpoints * (1 + 1e-6));  // just above them
  edges[2].slice(0, 30, 45).copy_(midpoints * (1 - 1e-6));  // just below
  edges[2][63] = 1.0f;                                      // absmax 1: the scaled values are the values
  const auto random = torch::randn({4093}) * 0.02;          // 63 blocks and 61, an odd count
  for (const auto& weight : {edges.reshape(-1), random, random.to(at::kBFloat16), edges.to(at::kBFloat16)}) {
    for (int64_t blocksize : {64, 256}) {
      const auto q = quantize_nf4(weight, blocksize, /*double_quant=*/false);
      const auto [packed, absmax] = reference(weight, blocksize);
      EXPECT_TRUE(torch::equal(q.packed, packed))
          << weight.numel() << " " << weight.scalar_type() << " block " << blocksize;
      EXPECT_TRUE(torch::equal(q.absmax, absmax))
          << weight.numel() << " " << weight.scalar_type() << " block " << blocksize;
    }
  }
}

// Every element comes back within half the widest gap between NF4 values (-1 and -0.696) of its
// block's absmax, in blocks of 64 and a short last block; shape and dtype as asked.
TEST(Nf4, RoundTripWithinHalfTheWidestCodeGap) {
  torch::manual_seed(3);
  const auto w = torch::randn({37, 29}) * torch::logspace(-3, 1, 29);  // 1073 elements: 16 blocks and 49
  for (bool double_quant : {false, true}) {
    const auto q = quantize_nf4(w, 64, double_quant);
    EXPECT_EQ(q.blocks(), 17);
    const auto back = dequantize_nf4(q, at::kFloat);
    ASSERT_EQ(back.sizes(), w.sizes());
    const auto flat = w.reshape(-1);
    const auto padded = at::constant_pad_nd(flat, {0, 17 * 64 - flat.numel()}, 0.0).reshape({17, 64});
    const auto block_absmax = std::get<0>(padded.abs().max(1));
    const auto bound =
        (block_absmax * (1.0 - 0.6961928009986877) / 2 * 1.02).repeat_interleave(64).slice(0, 0, flat.numel());
    const auto error = (back.reshape(-1) - flat).abs();
    EXPECT_TRUE((error <= bound).all().item<bool>())
        << "double quant " << double_quant << ": worst error/bound " << (error / bound).max().item<double>();
    EXPECT_EQ(dequantize_nf4(q, at::kBFloat16).scalar_type(), at::kBFloat16);
  }
}

// Double quantization stores the absmax as 8-bit codes of (absmax - mean) in blocks of 256: they
// come back within half the 8-bit map's widest gap near 1 ((1 - 0.1) / 64 / 2) of each nested
// block's largest centred value.
TEST(Nf4, DoubleQuantizedAbsmaxWithinTheMapsResolution) {
  torch::manual_seed(5);
  const auto w = torch::randn({600, 64}) * torch::rand({600, 1}) * 3;  // 600 blocks: 3 nested blocks
  const auto plain = quantize_nf4(w, 64, false);
  const auto nested = quantize_nf4(w, 64, true);
  EXPECT_TRUE(torch::equal(plain.packed, nested.packed));
  EXPECT_EQ(nested.absmax.scalar_type(), at::kByte);
  EXPECT_EQ(nested.nested_absmax.numel(), 3);
  EXPECT_FLOAT_EQ(nested.offset, plain.absmax.mean().item<float>());
  const auto centred = plain.absmax - nested.offset;
  const auto padded = at::constant_pad_nd(centred, {0, 768 - 600}, 0.0).reshape({3, 256});
  const auto largest = std::get<0>(padded.abs().max(1)).repeat_interleave(256).slice(0, 0, 600);
  const auto error = (nf4_block_absmax(nested) - plain.absmax).abs();
  EXPECT_TRUE((error <= largest * (0.9 / 64 / 2) * 1.01).all().item<bool>()) << (error / largest).max().item<double>();
  const auto map = fsdp::shard::dynamic_map_signed();
  ASSERT_EQ(map.numel(), 256);
  EXPECT_TRUE((map.slice(0, 1) > map.slice(0, 0, -1)).all().item<bool>());
  EXPECT_NEAR(map[0].item<float>(), -0.993, 1e-3);
  EXPECT_EQ(map[255].item<float>(), 1.0f);
}

// Double quantization centres the blocks' absmax on their mean. libtorch splits a long mean over
// its threads, and the split moves its last bit: bitsandbytes' offset for Llama 3.1 8B's shape of
// v_proj, 0.051962967962026596 at one thread, is 0.051962971687316895 at two, and 20 of its 65,536
// blocks take another 8-bit absmax code (found comparing an 8B QLoRA run with peft, 2026-12-06).
// The mean is summed as one thread sums it, whatever the thread count: the bytes do not depend on
// the machine, and are bitsandbytes' at one thread (tests/hf/check_nf4.py compares them).
// Seeds 0-4 of this shape: libtorch 2.11's mean of seed 2's absmax differs at 1 and 4 threads.
TEST(Nf4, DoubleQuantizationDoesNotDependOnTheThreadCount) {
  const int threads = at::get_num_threads();
  for (int seed = 0; seed < 5; ++seed) {
    torch::manual_seed(seed);
    const at::Tensor weight = (torch::randn({1024, 4096}) * 0.02).to(at::kBFloat16);  // 65,536 blocks of 64
    at::set_num_threads(1);
    const auto one = quantize_nf4(weight);
    at::set_num_threads(4);
    const auto several = quantize_nf4(weight);
    at::set_num_threads(threads);
    EXPECT_EQ(one.offset, several.offset) << "seed " << seed << ": the absmax mean at 1 and 4 threads";
    EXPECT_TRUE(torch::equal(one.absmax, several.absmax)) << "seed " << seed << ": the 8-bit absmax codes";
  }
}

TEST(Nf4, BadInputIsNamed) {
  const auto w = torch::randn({4, 64});
  EXPECT_NE(error_of([&] { quantize_nf4(w, 48); }).find("block size 48"), std::string::npos);
  EXPECT_NE(error_of([&] { quantize_nf4(torch::empty({0})); }).find("empty"), std::string::npos);
  auto bad = w.clone();
  bad[1][3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(error_of([&] { quantize_nf4(bad); }).find("not finite"), std::string::npos);
  EXPECT_NE(error_of([&] { quantize_nf4(w.to(at::kInt)); }).find("expected float32"), std::string::npos);
  // A truncated absmax (one block's scale missing) is named with what was expected.
  auto q = quantize_nf4(w, 64, false);
  q.absmax = q.absmax.slice(0, 0, 3);
  const std::string truncated = error_of([&] { dequantize_nf4(q); });
  EXPECT_NE(truncated.find("absmax holds 3 Float, expected 4 Float for a weight of shape [4, 64] in blocks of 64"),
            std::string::npos)
      << truncated;
  auto d = quantize_nf4(w, 64, true);
  d.nested_absmax = at::Tensor();
  EXPECT_NE(error_of([&] { dequantize_nf4(d); }).find("nested absmax holds nothing"), std::string::npos);
  auto p = quantize_nf4(w, 64, true);
  p.packed = p.packed.slice(0, 1);
  EXPECT_NE(error_of([&] { dequantize_nf4(p); }).find("packed weight holds 127"), std::string::npos);
}

// A frozen FlatParam's NF4 string (shard/nf4_storage.h): each NF4 entry's parts are exactly
// quantize_nf4's tensors (codes, 8-bit absmax, nested absmax, offset), each raw entry its values in
// the raw dtype; every part starts 16-byte aligned; the bytes before the padding are the same for
// any number of shards; decoding gives each entry dequantize_nf4's values (NF4) or the raw values
// widened, at its element offset, in the target dtype. Entries: Llama-like [8, 64], a bias of 7, an
// odd [3, 5] and a [20, 70] of 22 blocks with a short last one.
TEST(Nf4Storage, EachEntryIsQuantizeNf4sBytesAndDecodesToDequantizeNf4sValues) {
  torch::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes = {{8, 64}, {7}, {3, 5}, {20, 70}};
  const std::vector<bool> nf4 = {true, false, true, true};
  std::vector<fsdp::shard::FlatEntry> entries;
  std::vector<at::Tensor> values;
  for (size_t i = 0; i < shapes.size(); ++i) {
    values.push_back(torch::randn(shapes[i]) * 0.05);
    entries.push_back(fsdp::shard::FlatEntry{"e" + std::to_string(i), {}, shapes[i], 0, values.back().numel()});
  }
  for (bool double_quant : {true, false}) {
    const auto layout = fsdp::shard::FlatLayout::make(entries, 3);
    at::Tensor unsharded = torch::zeros({layout.padded_numel});
    for (size_t i = 0; i < values.size(); ++i)
      unsharded.narrow(0, layout.entries[i].offset, values[i].numel()).copy_(values[i].reshape(-1));
    const auto storage = fsdp::shard::Nf4StorageLayout::make(layout, nf4, 3, double_quant, at::kBFloat16);
    EXPECT_EQ(storage.shard_bytes % 16, 0);
    EXPECT_EQ(storage.shard_bytes * 3, storage.padded_bytes);
    EXPECT_EQ(storage.nf4_weights(), 3);
    const at::Tensor bytes = fsdp::shard::encode_nf4_storage(storage, layout, unsharded);
    ASSERT_EQ(bytes.numel(), storage.padded_bytes);
    auto part = [&](const fsdp::shard::Nf4Part& p) {
      EXPECT_EQ(p.offset % 16, 0);
      return bytes.narrow(0, p.offset, p.bytes);
    };
    for (size_t i = 0; i < values.size(); ++i) {
      const auto& place = storage.entries[i];
      if (!nf4[i]) {
        EXPECT_TRUE(part(place.raw).view(at::kBFloat16).equal(values[i].reshape(-1).to(at::kBFloat16))) << i;
        continue;
      }
      // Quantized from the base's dtype (bf16 here), as bitsandbytes quantizes a bf16 weight.
      const auto weight = quantize_nf4(values[i].to(at::kBFloat16), 64, double_quant);
      EXPECT_TRUE(part(place.codes).equal(weight.packed)) << i;
      if (double_quant) {
        EXPECT_TRUE(part(place.absmax).equal(weight.absmax)) << i;
        EXPECT_TRUE(part(place.nested_absmax).view(at::kFloat).equal(weight.nested_absmax)) << i;
        EXPECT_EQ(part(place.offset).view(at::kFloat).item<float>(), weight.offset) << i;
      } else {
        EXPECT_TRUE(part(place.absmax).view(at::kFloat).equal(weight.absmax)) << i;
      }
    }
    // The same bytes for another number of shards, up to the padding.
    const auto two =
        fsdp::shard::Nf4StorageLayout::make(fsdp::shard::FlatLayout::make(entries, 2), nf4, 2, double_quant);
    EXPECT_TRUE(fsdp::shard::encode_nf4_storage(two, fsdp::shard::FlatLayout::make(entries, 2), unsharded)
                    .narrow(0, 0, storage.bytes)
                    .equal(bytes.narrow(0, 0, storage.bytes)));
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      at::Tensor decoded = torch::full({layout.padded_numel}, 9.0).to(dtype);
      fsdp::shard::decode_nf4_storage(storage, layout, bytes, decoded);
      for (size_t i = 0; i < values.size(); ++i) {
        const at::Tensor got = decoded.narrow(0, layout.entries[i].offset, values[i].numel());
        // Decoded to the base's dtype (bitsandbytes' dequantize_4bit of a bf16 weight), then widened.
        const at::Tensor want =
            nf4[i] ? dequantize_nf4(quantize_nf4(values[i].to(at::kBFloat16), 64, double_quant), at::kBFloat16)
                         .to(dtype)
                         .reshape(-1)
                   : values[i].reshape(-1).to(at::kBFloat16).to(dtype);
        EXPECT_TRUE(got.equal(want)) << "entry " << i << " " << dtype << " double_quant " << double_quant;
      }
    }
  }
  EXPECT_NE(error_of([&] {
              fsdp::shard::Nf4StorageLayout::make(fsdp::shard::FlatLayout::make(entries, 2), {true}, 2);
            }).find("1 flags for 4 entries"),
            std::string::npos);
}

// On a CUDA device (FSDP_TEST_DEVICE=cuda in scripts/gpu-check.sh, where a missing GPU is a
// failure; skipped elsewhere), decode_nf4_storage gives the host's values to the bit: every base
// dtype, with and without double quantization, into fp32, bf16 and fp16, into an aligned target and
// one element off (the kernel's 16-byte stores then fall back to single ones). Entries cover a short
// last block, fewer than 8 elements, an odd count, and more than 256 blocks (two nested absmax).
// Where the build has the decode kernel, that is what runs; a wrong nibble order, a fused
// multiply-add in absmax (one rounding instead of two) or a scale from the wrong block differ.
TEST(Nf4Storage, DecodesOnTheDeviceAsOnTheHost) {
  const char* wanted = std::getenv("FSDP_TEST_DEVICE");
  const bool asked = wanted != nullptr && std::string(wanted) == "cuda";
  if (!torch::cuda::is_available()) {
    if (asked) FAIL() << "FSDP_TEST_DEVICE=cuda, but libtorch sees no CUDA device";
    GTEST_SKIP() << "no CUDA device";
  }
  std::cout << "[ info ] NF4 decode kernel compiled: " << (fsdp::shard::nf4_decode_kernel_compiled() ? "yes" : "no")
            << "\n";
  // scripts/gpu-check.sh builds with nvcc: there the composed path passing would hide the kernel.
  const char* expect_kernels = std::getenv("FSDP_EXPECT_CUDA_KERNELS");
  if (expect_kernels != nullptr && std::string(expect_kernels) == "1") {
    ASSERT_TRUE(fsdp::shard::nf4_decode_kernel_compiled())
        << "FSDP_EXPECT_CUDA_KERNELS=1, but this build has no NF4 decode kernel";
  }
  torch::manual_seed(11);
  const std::vector<std::vector<int64_t>> shapes = {{20, 70}, {5}, {3, 5}, {256, 72}, {64}, {9, 7}};
  const std::vector<bool> nf4 = {true, true, true, true, false, true};
  std::vector<fsdp::shard::FlatEntry> entries;
  std::vector<at::Tensor> values;
  for (size_t i = 0; i < shapes.size(); ++i) {
    values.push_back(torch::randn(shapes[i]) * torch::logspace(-3, 0, shapes[i].back()));
    entries.push_back(fsdp::shard::FlatEntry{"e" + std::to_string(i), {}, shapes[i], 0, values.back().numel()});
  }
  const auto layout = fsdp::shard::FlatLayout::make(entries, 2);
  at::Tensor unsharded = torch::zeros({layout.padded_numel});
  for (size_t i = 0; i < values.size(); ++i)
    unsharded.narrow(0, layout.entries[i].offset, values[i].numel()).copy_(values[i].reshape(-1));
  for (at::ScalarType base : {at::kBFloat16, at::kFloat, at::kHalf}) {
    for (bool double_quant : {true, false}) {
      const auto storage = fsdp::shard::Nf4StorageLayout::make(layout, nf4, 2, double_quant, base);
      const at::Tensor bytes = fsdp::shard::encode_nf4_storage(storage, layout, unsharded);
      const at::Tensor device_bytes = bytes.to(at::kCUDA);
      for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
        at::Tensor host = torch::full({layout.padded_numel}, 9.0).to(dtype);
        fsdp::shard::decode_nf4_storage(storage, layout, bytes, host);
        for (int64_t shift : {0, 1}) {
          at::Tensor buffer =
              torch::full({layout.padded_numel + 1}, 9.0, at::TensorOptions().dtype(dtype).device(at::kCUDA));
          at::Tensor device = buffer.narrow(0, shift, layout.padded_numel);
          fsdp::shard::decode_nf4_storage(storage, layout, device_bytes, device);
          const at::Tensor back = device.cpu();
          for (size_t i = 0; i < values.size(); ++i) {
            const at::Tensor got = back.narrow(0, layout.entries[i].offset, values[i].numel());
            const at::Tensor want = host.narrow(0, layout.entries[i].offset, values[i].numel());
            EXPECT_TRUE(got.equal(want)) << "entry " << i << ", base " << base << ", into " << dtype
                                         << ", double_quant " << double_quant << ", shift " << shift
                                         << ": largest difference "
                                         << (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
          }
        }
      }
    }
  }
}

}  // namespace nf4_tests
