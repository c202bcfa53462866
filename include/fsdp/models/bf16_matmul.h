// fsdp/models/bf16_matmul.h: how the models' bf16 matmuls compute (linear layers and the head).
//
//   Native  libtorch's bf16 GEMM (bf16 operands, fp32 accumulation, a bf16 result): fast where
//           the CPU has bf16 instructions (AVX512-BF16, AMX) and on GPUs
//   Fp32    the same bf16 operands widened to fp32, an fp32 GEMM, the result rounded to bf16: the
//           same function up to the order of summation, for CPUs without bf16 instructions, where
//           libtorch widens inside its GEMM element by element and a bf16 step ran 6-14x slower
//           than fp32 (AMD EPYC with AVX2, 2026-12-02). Backward keeps the bf16 operands, as
//           Native's does, and widens them again: the fp32 copies are transient.
//
// A process-wide choice (the trainer sets it from train.bf16_matmul); only bf16 inputs are affected.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "fsdp/enum_names.h"

namespace fsdp::models {
enum class Bf16Matmul { Native, Fp32 };
}  // namespace fsdp::models

namespace fsdp {
template <>
struct EnumNames<models::Bf16Matmul> {  // train.bf16_matmul's values
  static constexpr std::pair<models::Bf16Matmul, const char*> values[] = {
      {models::Bf16Matmul::Native, "native"},
      {models::Bf16Matmul::Fp32, "fp32"},
  };
};
}  // namespace fsdp

namespace fsdp::models {

void set_bf16_matmul(Bf16Matmul mode);
Bf16Matmul bf16_matmul();

// at::linear(x, weight, bias) (x [..., in], weight [out, in], bias [out] or undefined) with autograd,
// computed as bf16_matmul() says when x is bf16.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// a [n, k] @ b [k, m] without autograd (inside custom autograd functions), the same way; the
// result in a's dtype. b may come already widened.
at::Tensor matmul_in_compute_dtype(const at::Tensor& a, const at::Tensor& b);

// One linear layer's GEMMs: x [rows, in] times weight [out, in] transposed, and its backward.
struct LinearShape {
  int64_t rows = 0, in = 0, out = 0;
};

// Seconds a forward and backward (input and weight gradients) of linear() on bf16 operands of
// every shape take together, on the CPU, computed each way: the median of `repeats` rounds after a
// warm-up, the two ways alternating round by round so that both see the same load. What
// train.bf16_matmul = "auto" chooses from on a CPU with bf16 instructions, where neither way is
// faster everywhere (docs/benchmarks.md: native 1.5x fp32 on an AMD EPYC, 0.7-0.8x on an Intel
// Xeon, both with AVX512-BF16). One timed round where the warm-up took over 2 s. Restores the
// process-wide mode it found.
struct Bf16MatmulTimes {
  double native_seconds = 0.0;
  double fp32_seconds = 0.0;
  Bf16Matmul faster() const { return fp32_seconds < native_seconds ? Bf16Matmul::Fp32 : Bf16Matmul::Native; }
};
Bf16MatmulTimes time_bf16_matmuls(const std::vector<LinearShape>& shapes, int repeats = 3);

// Does a product with bf16 operand `t` widen its operands to fp32 (Bf16Matmul::Fp32)?
bool matmul_widens(const at::Tensor& t);

}  // namespace fsdp::models
