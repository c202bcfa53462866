// The fused operations (fsdp/models/fused_ops.h) against their composed references, forward and
// backward, on the CPU and, where this build and machine have one, the GPU (scripts/gpu-check.sh
// runs these with FSDP_TEST_DEVICE=cuda, where a missing GPU is a failure, not a skip).
//
// Criterion: the truth is the operation's formula written out here, independently of both the
// fused op and the composed reference it replaces, evaluated in fp64 (autograd for the gradients).
// A fused result may be off by at most twice the error of the composed reference in the same
// dtype, plus 1e-6 of the largest value (fp32 reduction orders): no less accurate than what it
// replaces. A wrong closed-form backward (say without the 1 + g (1 - s) of silu') is off by O(1).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "fsdp/models/fused_ops.h"
#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/layers.h"
#include "fsdp/models/linear_cross_entropy.h"
#include "test_devices.h"

namespace fused_ops_tests {

using fsdp::models::rotary_tables;

using fsdp_tests::usable;

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// |fused - truth| <= 2 |reference - truth| + 1e-6 max|truth|, elementwise maximum over the tensor.
void expect_as_accurate(const at::Tensor& fused, const at::Tensor& reference, const at::Tensor& truth,
                        const std::string& what) {
  const at::Tensor t = truth.to(at::kCPU, at::kDouble);
  const double fused_error = max_abs(fused.to(at::kCPU, at::kDouble) - t);
  const double reference_error = max_abs(reference.to(at::kCPU, at::kDouble) - t);
  const double bound = 2 * reference_error + 1e-6 * max_abs(t);
  EXPECT_LE(fused_error, bound) << what << ": fused error " << fused_error << ", composed reference's "
                                << reference_error;
}

struct Case {
  at::Device device;
  at::ScalarType dtype;
  std::string name() const { return std::string(device.is_cuda() ? "cuda " : "cpu ") + c10::toString(dtype); }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const at::Device& device : fsdp_tests::test_devices()) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) out.push_back({device, dtype});
  }
  return out;
}

TEST(FusedOps, SwigluMatchesTheComposedReference) {
  for (const Case& c : cases()) {
    if (!usable(c.device)) continue;
    SCOPED_TRACE(c.name());
    torch::manual_seed(1);
    // Odd sizes: no kernel may assume a multiple of its block. Gates up to +-6 cover silu's bend.
    const at::Tensor gate64 = torch::randn({3, 5, 37}, at::kDouble) * 3, up64 = torch::randn({3, 5, 37}, at::kDouble);
    const at::Tensor grad64 = torch::randn({3, 5, 37}, at::kDouble);
    const auto opts = at::TensorOptions().device(c.device).dtype(c.dtype);
    const auto leaf = [&](const at::Tensor& t) { return t.to(opts).detach().requires_grad_(true); };

    at::Tensor g64 = gate64.clone().requires_grad_(true), u64 = up64.clone().requires_grad_(true);
    const at::Tensor truth = g64 / (1 + at::exp(-g64)) * u64;  // silu(g) = g sigmoid(g), times up
    truth.backward(grad64);

    at::Tensor gf = leaf(gate64), uf = leaf(up64), gr = leaf(gate64), ur = leaf(up64);
    const at::Tensor fused = fsdp::models::swiglu(gf, uf), reference = fsdp::models::swiglu_reference(gr, ur);
    fused.backward(grad64.to(opts));
    reference.backward(grad64.to(opts));
    ASSERT_EQ(fused.scalar_type(), c.dtype);
    if (c.device.is_cpu()) EXPECT_TRUE(torch::equal(fused, reference)) << "the CPU forward is the reference's";
    expect_as_accurate(fused, reference, truth, "forward");
    expect_as_accurate(gf.grad(), gr.grad(), g64.grad(), "gradient of gate");
    expect_as_accurate(uf.grad(), ur.grad(), u64.grad(), "gradient of up");

    // Inputs one element past a 16-byte boundary (the CUDA kernels then move one element at a
    // time, not 16 bytes): the same bits, forward and backward, as the aligned inputs'.
    const auto misaligned = [&](const at::Tensor& t) {
      const at::Tensor buffer = torch::empty({t.numel() + 1}, opts);
      return buffer.narrow(0, 1, t.numel()).view(t.sizes()).copy_(t.to(opts)).requires_grad_(true);
    };
    at::Tensor gm = misaligned(gate64), um = misaligned(up64);
    const at::Tensor fused_misaligned = fsdp::models::swiglu(gm, um);
    fused_misaligned.backward(misaligned(grad64).detach());
    EXPECT_TRUE(torch::equal(fused_misaligned, fused)) << "forward, misaligned inputs";
    EXPECT_TRUE(torch::equal(gm.grad(), gf.grad()) && torch::equal(um.grad(), uf.grad()))
        << "backward, misaligned inputs";
  }
}

// SwiGLU of one stacked [..., 2 cols] product's halves (the MLP's gate and up as one GEMM) against
// swiglu() of the two halves copied out, forward and backward, its gradient one [..., 2 cols]
// tensor (gate's, then up's). On CUDA the same kernel arithmetic: the same bits. On the CPU the
// forward is the reference's operations on the strided halves, which libtorch's fp32 kernels
// compute unvectorized (other last bits than the contiguous copies' vectorized ones): there,
// within 1e-6 of the largest value (a gradient of the wrong half is off by O(1)). Columns of 40
// take the CUDA kernels' 16-byte packs (rows 80 elements apart), 37 one element at a time. Empty
// tensors (no rows; no columns) give empty results and gradients.
TEST(FusedOps, SwigluOfStackedHalvesIsSwigluOfEach) {
  for (const Case& c : cases()) {
    if (!usable(c.device)) continue;
    SCOPED_TRACE(c.name());
    torch::manual_seed(11);
    // {rows, cols}: 15 rows; 70,000 rows (more than a CUDA grid's 65,535 rows of blocks: the row loop steps).
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{15, 40}, {15, 37}, {70000, 8}}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + ", cols " + std::to_string(cols));
      const auto opts = at::TensorOptions().device(c.device).dtype(c.dtype);
      const at::Tensor gate_up0 = (torch::randn({rows, 2 * cols}, at::kDouble) * 3).to(opts);
      const at::Tensor grad = torch::randn({rows, cols}, at::kDouble).to(opts);
      at::Tensor gate_up = gate_up0.clone().requires_grad_(true);
      at::Tensor gate = gate_up0.narrow(-1, 0, cols).contiguous().requires_grad_(true);
      at::Tensor up = gate_up0.narrow(-1, cols, cols).contiguous().requires_grad_(true);
      const at::Tensor stacked = fsdp::models::swiglu_stacked(gate_up), each = fsdp::models::swiglu(gate, up);
      stacked.backward(grad);
      each.backward(grad);
      const at::Tensor grad_each = at::cat({gate.grad(), up.grad()}, -1);
      ASSERT_EQ(gate_up.grad().sizes(), gate_up.sizes());
      if (c.device.is_cuda()) {
        EXPECT_TRUE(torch::equal(stacked, each)) << "forward";
        EXPECT_TRUE(torch::equal(gate_up.grad(), grad_each)) << "backward";
      } else {
        EXPECT_TRUE(torch::equal(
            stacked, fsdp::models::swiglu_reference(gate_up.narrow(-1, 0, cols), gate_up.narrow(-1, cols, cols))))
            << "the CPU forward is the reference's, on the halves";
        EXPECT_LE(max_abs(stacked.to(at::kDouble) - each.to(at::kDouble)), 1e-6 * max_abs(each)) << "forward";
        EXPECT_LE(max_abs(gate_up.grad().to(at::kDouble) - grad_each.to(at::kDouble)), 1e-6 * max_abs(grad_each))
            << "backward";
      }
    }
    for (const auto& shape : std::vector<std::vector<int64_t>>{{0, 16}, {3, 0}}) {
      const auto opts = at::TensorOptions().device(c.device).dtype(c.dtype);
      at::Tensor empty = torch::empty(shape, opts).requires_grad_(true);
      const at::Tensor out = fsdp::models::swiglu_stacked(empty);
      out.backward(torch::empty(out.sizes(), opts));
      EXPECT_EQ(out.size(0), shape[0]);
      EXPECT_EQ(empty.grad().sizes(), empty.sizes());
      at::Tensor gate = torch::empty(shape, opts).requires_grad_(true), up = torch::empty(shape, opts);
      fsdp::models::swiglu(gate, up).backward(torch::empty(shape, opts));
      EXPECT_EQ(gate.grad().sizes(), gate.sizes());
    }
  }
}

TEST(FusedOps, RotaryMatchesTheComposedReference) {
  for (const Case& c : cases()) {
    if (!usable(c.device)) continue;
    SCOPED_TRACE(c.name());
    torch::manual_seed(2);
    // A head_dim below a warp's pairs (10) and the Llamas' (128: two pairs a lane on CUDA).
    for (const int64_t hd : {10, 128}) {
      SCOPED_TRACE("head_dim " + std::to_string(hd));
      const int64_t b = 2, t = 7, heads = 3;
      auto [cos, sin] = rotary_tables(t, hd, 500000.0);  // [t, hd] fp32
      const at::Tensor x64 = torch::randn({b, t, heads, hd}, at::kDouble),
                       grad64 = torch::randn({b, t, heads, hd}, at::kDouble);
      const auto opts = at::TensorOptions().device(c.device).dtype(c.dtype);

      at::Tensor xt = x64.clone().requires_grad_(true);
      // Rotate-half: pair (c, c + hd/2) of each position's row turned by that position's angle:
      // [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], cos and sin [t, hd] broadcast over b and heads.
      const at::Tensor cos64 = cos.to(at::kDouble).view({1, t, 1, hd}), sin64 = sin.to(at::kDouble).view({1, t, 1, hd});
      const at::Tensor x1 = xt.narrow(-1, 0, hd / 2), x2 = xt.narrow(-1, hd / 2, hd / 2);
      const at::Tensor truth = xt * cos64 + at::cat({-x2, x1}, -1) * sin64;
      truth.backward(grad64);

      const at::Tensor cos_d = cos.to(c.device), sin_d = sin.to(c.device);
      at::Tensor xf = x64.to(opts).detach().requires_grad_(true), xr = x64.to(opts).detach().requires_grad_(true);
      const at::Tensor fused = fsdp::models::rotary(xf, cos_d, sin_d);
      const at::Tensor reference = fsdp::models::rotary_reference(xr, cos_d, sin_d);
      fused.backward(grad64.to(opts));
      reference.backward(grad64.to(opts));
      if (c.device.is_cpu()) EXPECT_TRUE(torch::equal(fused, reference)) << "the CPU forward is the reference's";
      expect_as_accurate(fused, reference, truth, "forward");
      expect_as_accurate(xf.grad(), xr.grad(), xt.grad(), "gradient of x");

      // A strided input (the [b, heads, t, hd] view of a contiguous [b, t, heads, hd] tensor, seen
      // back through its transpose) gives the same values as its contiguous copy.
      const at::Tensor strided = x64.to(opts).transpose(1, 2).contiguous().transpose(1, 2);
      ASSERT_FALSE(strided.is_contiguous());
      EXPECT_TRUE(
          torch::equal(fsdp::models::rotary(strided, cos_d, sin_d), fsdp::models::rotary(x64.to(opts), cos_d, sin_d)));

      // q as the first part of a stacked q, k, v product [b, t, (heads + 2) hd]: each token's heads
      // contiguous, tokens a row of the product apart (read in place on CUDA); the same values
      // forward and backward as its contiguous copy's.
      const at::Tensor product = torch::randn({b, t, (heads + 2) * hd}, at::kDouble).to(opts);
      product.narrow(-1, 0, heads * hd).copy_(x64.to(opts).view({b, t, heads * hd}));
      at::Tensor product_leaf = product.clone().requires_grad_(true);
      const at::Tensor q_part = product_leaf.narrow(-1, 0, heads * hd).view({b, t, heads, hd});
      ASSERT_FALSE(q_part.is_contiguous());
      const at::Tensor rotated_part = fsdp::models::rotary(q_part, cos_d, sin_d);
      rotated_part.backward(grad64.to(opts));
      EXPECT_TRUE(torch::equal(rotated_part, fused)) << "q part of a stacked product, forward";
      EXPECT_TRUE(torch::equal(product_leaf.grad().narrow(-1, 0, heads * hd).reshape({b, t, heads, hd}), xf.grad()))
          << "q part of a stacked product, backward";

      // Tokens that are not one stride apart (a slice along t of a longer [b, t + 2, heads, hd]
      // tensor: b's stride is not t's times t): copied, not read as if they were.
      const at::Tensor longer = torch::randn({b, t + 2, heads, hd}, at::kDouble).to(opts);
      longer.narrow(1, 1, t).copy_(x64.to(opts));
      const at::Tensor slice = longer.narrow(1, 1, t);
      EXPECT_TRUE(torch::equal(fsdp::models::rotary(slice, cos_d, sin_d), fused)) << "a slice along t";
    }
  }
}

TEST(FusedOps, RmsNormMatchesTheComposedReference) {
  for (const Case& c : cases()) {
    if (!usable(c.device)) continue;
    SCOPED_TRACE(c.name());
    torch::manual_seed(3);
    const int64_t dim = 67;
    const at::Tensor x64 = torch::randn({4, 9, dim}, at::kDouble) * 2, w64 = 1 + 0.1 * torch::randn({dim}, at::kDouble);
    const at::Tensor grad64 = torch::randn({4, 9, dim}, at::kDouble);
    const auto opts = at::TensorOptions().device(c.device).dtype(c.dtype);

    at::Tensor xt = x64.clone().requires_grad_(true), wt = w64.clone().requires_grad_(true);
    // The truth in fp64 throughout (the reference would compute its statistics in fp32).
    const at::Tensor truth = xt * at::rsqrt(xt.pow(2).mean(-1, true) + 1e-5) * wt;
    truth.backward(grad64);

    // The weight as FSDP's mixed precision gathers it: in the compute dtype.
    at::Tensor xf = x64.to(opts).detach().requires_grad_(true), wf = w64.to(opts).detach().requires_grad_(true);
    at::Tensor xr = x64.to(opts).detach().requires_grad_(true), wr = w64.to(opts).detach().requires_grad_(true);
    const at::Tensor fused = fsdp::models::rms_norm(xf, wf, 1e-5);
    const at::Tensor reference = fsdp::models::rms_norm_reference(xr, wr, 1e-5);
    fused.backward(grad64.to(opts));
    reference.backward(grad64.to(opts));
    ASSERT_EQ(fused.scalar_type(), c.dtype);
    if (c.device.is_cpu()) EXPECT_TRUE(torch::equal(fused, reference)) << "the CPU forward is the reference's";
    expect_as_accurate(fused, reference, truth, "forward");
    expect_as_accurate(xf.grad(), xr.grad(), xt.grad(), "gradient of x");
    expect_as_accurate(wf.grad(), wr.grad(), wt.grad(), "gradient of the weight");
  }
}

TEST(FusedOps, AddRmsNormMatchesTheComposedReference) {
  for (const Case& c : cases()) {
    if (!usable(c.device)) continue;
    SCOPED_TRACE(c.name());
    torch::manual_seed(4);
    // Rows more than the CUDA backward's 1024 blocks (blocks take several rows: the weight
    // partials accumulate), an odd dim below and above one block's 256 threads (on CUDA one
    // element a load; 300 in 16-byte packs of fp32). On CUDA also dims of whole bf16 packs, with the
    // backward's weight partials in 32 registers a thread (4096) and in global memory (8200,
    // beyond 32 x 256 columns).
    // And 70,000 rows of 16: more rows than the launcher's 65,536 blocks, so a block takes several
    // (the row loops, and the block-wide sums' shared memory reused from row to row).
    std::vector<int64_t> dims = {67, 300, 16};
    if (c.device.is_cuda()) dims.insert(dims.end(), {4096, 8200});
    for (const int64_t dim : dims) {
      SCOPED_TRACE("dim " + std::to_string(dim));
      const std::vector<int64_t> shape = dim == 16    ? std::vector<int64_t>{70000, dim}
                                         : dim <= 300 ? std::vector<int64_t>{3, 401, dim}
                                                      : std::vector<int64_t>{1030, dim};
      const at::Tensor x64 = torch::randn(shape, at::kDouble) * 2, delta64 = torch::randn(shape, at::kDouble);
      const at::Tensor w64 = 1 + 0.1 * torch::randn({dim}, at::kDouble);
      const at::Tensor grad_sum64 = torch::randn(shape, at::kDouble), grad_normed64 = torch::randn(shape, at::kDouble);
      const auto opts = at::TensorOptions().device(c.device).dtype(c.dtype);
      const auto leaf = [&](const at::Tensor& t) { return t.to(opts).detach().requires_grad_(true); };

      at::Tensor xt = x64.clone().requires_grad_(true), dt = delta64.clone().requires_grad_(true);
      at::Tensor wt = w64.clone().requires_grad_(true);
      const at::Tensor sum_truth = xt + dt;
      const at::Tensor normed_truth = sum_truth * at::rsqrt(sum_truth.pow(2).mean(-1, true) + 1e-5) * wt;
      torch::autograd::backward({sum_truth, normed_truth}, {grad_sum64, grad_normed64});

      at::Tensor xf = leaf(x64), df = leaf(delta64), wf = leaf(w64), xr = leaf(x64), dr = leaf(delta64), wr = leaf(w64);
      const auto fused = fsdp::models::add_rms_norm(xf, df, wf, 1e-5);
      const auto reference = fsdp::models::add_rms_norm_reference(xr, dr, wr, 1e-5);
      torch::autograd::backward({fused.sum, fused.normed}, {grad_sum64.to(opts), grad_normed64.to(opts)});
      torch::autograd::backward({reference.sum, reference.normed}, {grad_sum64.to(opts), grad_normed64.to(opts)});
      ASSERT_EQ(fused.normed.scalar_type(), c.dtype);
      if (c.device.is_cpu()) {
        EXPECT_TRUE(torch::equal(fused.sum, reference.sum) && torch::equal(fused.normed, reference.normed))
            << "the CPU forward is the reference's";
      }
      expect_as_accurate(fused.sum, reference.sum, sum_truth, "sum");
      expect_as_accurate(fused.normed, reference.normed, normed_truth, "normed");
      expect_as_accurate(xf.grad(), xr.grad(), xt.grad(), "gradient of x");
      expect_as_accurate(df.grad(), dr.grad(), dt.grad(), "gradient of delta");
      expect_as_accurate(wf.grad(), wr.grad(), wt.grad(), "gradient of the weight");
    }
  }
}

// Only the normalised output used (no gradient reaches the sum), and a frozen weight (LoRA's base):
// the input's gradient is the norm's alone and the weight gets none.
TEST(FusedOps, AddRmsNormWithoutTheSumsGradientOrTheWeights) {
  for (const Case& c : cases()) {
    if (!usable(c.device)) continue;
    SCOPED_TRACE(c.name());
    torch::manual_seed(5);
    const auto opts = at::TensorOptions().device(c.device).dtype(c.dtype);
    const at::Tensor x = torch::randn({5, 33}, opts), delta = torch::randn({5, 33}, opts),
                     w = torch::rand({33}, opts) + 0.5;
    const at::Tensor grad = torch::randn({5, 33}, opts);
    at::Tensor xf = x.clone().requires_grad_(true), xr = x.clone().requires_grad_(true);
    const auto fused = fsdp::models::add_rms_norm(xf, delta, w, 1e-6);
    fused.normed.backward(grad);
    fsdp::models::add_rms_norm_reference(xr, delta, w, 1e-6).normed.backward(grad);
    EXPECT_FALSE(w.grad().defined());
    const at::Tensor truth_x = x.to(at::kDouble).requires_grad_(true);
    const at::Tensor sum = truth_x + delta.to(at::kDouble);
    (sum * at::rsqrt(sum.pow(2).mean(-1, true) + 1e-6) * w.to(at::kDouble)).backward(grad.to(at::kDouble));
    expect_as_accurate(xf.grad(), xr.grad(), truth_x.grad(), "gradient of x");
  }
}

// What add_rms_norm() hands the kernels after its casts and copies: a strided x (a transposed
// view), an fp32 weight with half-precision inputs (the weight's cast is autograd's), and fp16,
// the kernels' third dtype.
TEST(FusedOps, AddRmsNormTakesStridedInputsAndAnFp32Weight) {
  for (const at::Device& device : fsdp_tests::test_devices()) {
    if (!usable(device)) continue;
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(std::string(device.is_cuda() ? "cuda " : "cpu ") + c10::toString(dtype));
      torch::manual_seed(6);
      const int64_t rows = 45, dim = 70;
      const at::Tensor x64 = torch::randn({dim, rows}, at::kDouble).t(),
                       delta64 = torch::randn({rows, dim}, at::kDouble);
      const at::Tensor w64 = 1 + 0.1 * torch::randn({dim}, at::kDouble),
                       grad64 = torch::randn({rows, dim}, at::kDouble);
      const auto opts = at::TensorOptions().device(device).dtype(dtype);
      const auto strided = [&](const at::Tensor& t) {
        return t.t().contiguous().t().to(opts).detach().requires_grad_(true);
      };
      const auto weight = [&] { return w64.to(device, at::kFloat).detach().requires_grad_(true); };

      at::Tensor xt = x64.clone().requires_grad_(true), wt = w64.clone().requires_grad_(true);
      const at::Tensor sum_truth = xt + delta64;
      const at::Tensor truth = sum_truth * at::rsqrt(sum_truth.pow(2).mean(-1, true) + 1e-5) * wt;
      truth.backward(grad64);

      at::Tensor xf = strided(x64), xr = strided(x64), wf = weight(), wr = weight();
      ASSERT_FALSE(xf.is_contiguous());
      const at::Tensor delta = delta64.to(opts);
      const auto fused = fsdp::models::add_rms_norm(xf, delta, wf, 1e-5);
      const auto reference = fsdp::models::add_rms_norm_reference(xr, delta, wr, 1e-5);
      fused.normed.backward(grad64.to(opts));
      reference.normed.backward(grad64.to(opts));
      EXPECT_TRUE(torch::equal(fused.sum, reference.sum)) << "x + delta, rounded once, in either";
      ASSERT_EQ(wf.grad().scalar_type(), at::kFloat);
      expect_as_accurate(fused.normed, reference.normed, truth, "normed");
      expect_as_accurate(xf.grad(), xr.grad(), xt.grad(), "gradient of x");
      expect_as_accurate(wf.grad(), wr.grad(), wt.grad(), "gradient of the weight");
    }
  }
}

TEST(FusedOps, AddRmsNormRejectsMismatchedInputs) {
  const at::Tensor x = torch::randn({2, 8}), w = torch::ones({8});
  EXPECT_THROW(fsdp::models::add_rms_norm(x, torch::randn({2, 7}), w, 1e-5), c10::Error);
  EXPECT_THROW(fsdp::models::add_rms_norm(x, torch::randn({2, 8}, at::kDouble), w, 1e-5), c10::Error);
  EXPECT_THROW(fsdp::models::add_rms_norm(x, torch::randn({2, 8}), torch::ones({7}), 1e-5), c10::Error);
}

// The chunked head and loss (models/linear_cross_entropy.h) against the composed head (models::linear,
// to fp32) and cross-entropy: on a GPU, the row kernel (fused_ops.h: cross_entropy_rows) computes
// the loss and the logits' gradient in the compute dtype; on the CPU, passes over an fp32 copy.
// Truth: the formula in fp64 from the inputs as rounded to the dtype. Loss, d hidden and d weight,
// for backward's factor (0.25) said right and said wrong (1: corrected in backward), chunks that
// divide the rows and do not, rows not counted, a vocabulary that fills no block evenly and one of
// whole packs, one of several packs a thread, and more rows in a chunk than the launcher's 65,536
// blocks. A missed onehot, an unscaled gradient or a row counted that is not moves these by O(1).
TEST(FusedOps, LinearCrossEntropyMatchesTheComposedReference) {
  for (const Case& c : cases()) {
    if (!usable(c.device)) continue;
    SCOPED_TRACE(c.name());
    torch::manual_seed(3);
    // {vocab, rows, chunks}: an odd vocabulary (on CUDA one logit a load), one of whole 16-byte
    // packs, 16,384 (4 packs of 8 bf16 for each of the kernel's 512 threads; 8 of 4 fp32), and
    // 70,000 rows of 16 in one chunk (more than the launcher's 65,536 blocks: the row loop steps).
    struct Shape {
      int64_t vocab, n;
      std::vector<int64_t> chunks;
    };
    for (const Shape& shape :
         std::vector<Shape>{{1001, 45, {16, 45}}, {1024, 45, {16, 45}}, {16384, 45, {16, 45}}, {16, 70000, {70000}}}) {
      const int64_t vocab = shape.vocab, n = shape.n, dim = 32;
      SCOPED_TRACE("vocab " + std::to_string(vocab) + ", rows " + std::to_string(n));
      const double factor = 0.25;
      const auto opts = at::TensorOptions().device(c.device).dtype(c.dtype);
      const at::Tensor hidden64 = torch::randn({n, dim}, at::kDouble).to(c.dtype).to(at::kDouble);
      const at::Tensor weight64 = (torch::randn({vocab, dim}, at::kDouble) * 0.2).to(c.dtype).to(at::kDouble);
      at::Tensor targets = torch::randint(0, vocab, {n}, at::kLong);
      targets.index_put_({torch::arange(0, n, 7)}, -100);
      const auto sum_ignoring =
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100);

      at::Tensor h_truth = hidden64.clone().requires_grad_(true), w_truth = weight64.clone().requires_grad_(true);
      const at::Tensor truth =
          torch::nn::functional::cross_entropy(at::mm(h_truth, w_truth.t()), targets, sum_ignoring);
      (truth * factor).backward();

      const auto leaf = [&](const at::Tensor& t) { return t.to(opts).detach().requires_grad_(true); };
      at::Tensor h_ref = leaf(hidden64), w_ref = leaf(weight64);
      const at::Tensor reference = torch::nn::functional::cross_entropy(
          fsdp::models::linear(h_ref, w_ref).to(at::kFloat), targets.to(c.device), sum_ignoring);
      (reference * factor).backward();

      for (double said : {factor, 1.0}) {
        for (int64_t chunk : shape.chunks) {
          SCOPED_TRACE("chunk " + std::to_string(chunk) + ", factor said " + std::to_string(said));
          at::Tensor h = leaf(hidden64), w = leaf(weight64);
          const at::Tensor loss = fsdp::models::linear_cross_entropy_sum(h, w, targets.to(c.device), {chunk, said});
          (loss * factor).backward();
          expect_as_accurate(loss, reference, truth, "loss");
          expect_as_accurate(h.grad(), h_ref.grad(), h_truth.grad(), "d hidden");
          expect_as_accurate(w.grad(), w_ref.grad(), w_truth.grad(), "d weight");
          EXPECT_EQ(w.grad().scalar_type(), c.dtype);
        }
      }
    }
  }
}

// Where a GPU runs these, say whether fsdp.cpp's own kernels were tested or the composed fallback;
// where the build says nvcc built them (scripts/gpu-check.sh: FSDP_EXPECT_CUDA_KERNELS=1), fail
// without them: every FusedOps test above passes on the composed path too.
TEST(FusedOps, ReportsWhetherTheCudaKernelsWereBuilt) {
  for (const at::Device& device : fsdp_tests::test_devices()) {
    if (!device.is_cuda() || !usable(device)) continue;
    RecordProperty("fused_kernels_compiled", fsdp::models::fused_kernels_compiled() ? "yes" : "no");
    const char* expected = std::getenv("FSDP_EXPECT_CUDA_KERNELS");
    if (expected != nullptr && std::string(expected) == "1") {
      ASSERT_TRUE(fsdp::models::fused_kernels_compiled())
          << "FSDP_EXPECT_CUDA_KERNELS=1, but fsdp_zoo has no fused CUDA kernels: every FusedOps test ran the "
             "composed path";
    }
    if (!fsdp::models::fused_kernels_compiled()) {
      GTEST_SKIP()
          << "this build has no fused CUDA kernels (no nvcc at configure time): CUDA tensors took the composed path";
    }
  }
}

}  // namespace fused_ops_tests
