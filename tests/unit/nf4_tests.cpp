// NF4 (models/nf4.h): the layout by hand, round-trip error bounds, double quantization, and the
// errors. Bit-for-bit agreement with bitsandbytes is tests/hf/check_nf4.py (CTest nf4_bitsandbytes).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "fsdp/models/nf4.h"

namespace nf4_tests {

using fsdp::models::dequantize_nf4;
using fsdp::models::nf4_block_absmax;
using fsdp::models::quantize_nf4;

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
    const auto bound = (block_absmax * (1.0 - 0.6961928009986877) / 2 * 1.02).repeat_interleave(64).slice(0, 0, flat.numel());
    const auto error = (back.reshape(-1) - flat).abs();
    EXPECT_TRUE((error <= bound).all().item<bool>()) << "double quant " << double_quant << ": worst error/bound "
                                                     << (error / bound).max().item<double>();
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
  const auto map = fsdp::models::dynamic_map_signed();
  ASSERT_EQ(map.numel(), 256);
  EXPECT_TRUE((map.slice(0, 1) > map.slice(0, 0, -1)).all().item<bool>());
  EXPECT_NEAR(map[0].item<float>(), -0.993, 1e-3);
  EXPECT_EQ(map[255].item<float>(), 1.0f);
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
  EXPECT_NE(truncated.find("absmax holds 3 Float, expected 4 Float for a weight of shape [4, 64] in blocks of 64"), std::string::npos)
      << truncated;
  auto d = quantize_nf4(w, 64, true);
  d.nested_absmax = at::Tensor();
  EXPECT_NE(error_of([&] { dequantize_nf4(d); }).find("nested absmax holds nothing"), std::string::npos);
  auto p = quantize_nf4(w, 64, true);
  p.packed = p.packed.slice(0, 1);
  EXPECT_NE(error_of([&] { dequantize_nf4(p); }).find("packed weight holds 127"), std::string::npos);
}

}  // namespace nf4_tests
