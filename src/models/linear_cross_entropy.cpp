#include "fsdp/models/linear_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "fsdp/models/bf16_matmul.h"

namespace fsdp::models {

namespace {

constexpr int64_t kIgnored = -100;

// Where bf16 products widen their operands (Bf16Matmul::Fp32, CPUs without bf16 instructions),
// the head's weight [vocab, dim] is widened this many vocabulary rows at a time (128 MiB of fp32
// at width 4096), never whole: Llama 3's whole head in fp32 is 2.1 GB at 8 B, 4.2 GB at 70 B, on
// every rank, in forward and again in backward.
constexpr int64_t kWidenedVocabRows = 8192;

// One chunk's logits [rows, vocab], written as fp32 into `out` (a view of the op's chunk buffer):
// computed in the compute dtype, as the composed head is (a bf16 product rounded to bf16, then
// widened). fp32 operands: one GEMM straight into `out`, no temporary.
void chunk_logits_into(at::Tensor out, const at::Tensor& hidden_chunk, const at::Tensor& weight) {
  if (hidden_chunk.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) {
    at::mm_out(out, hidden_chunk, weight.t());
  } else if (!matmul_widens(hidden_chunk)) {
    out.copy_(matmul_in_compute_dtype(hidden_chunk, weight.t()));
  } else {
    const at::Tensor h = hidden_chunk.to(at::kFloat);  // [rows, dim] fp32
    for (int64_t v = 0; v < weight.size(0); v += kWidenedVocabRows) {
      const int64_t slice = std::min(kWidenedVocabRows, weight.size(0) - v);
      out.narrow(1, v, slice)
          .copy_(at::mm(h, weight.narrow(0, v, slice).to(at::kFloat).t()).to(hidden_chunk.scalar_type()));
    }
  }
}

// d hidden for one chunk's rows: dz [rows, vocab] (in the compute dtype) times weight [vocab, dim],
// into grad_rows [rows, dim]; widened products sum the vocabulary slices in fp32, then round once.
void chunk_input_grad_into(at::Tensor grad_rows, const at::Tensor& dz_compute, const at::Tensor& weight) {
  if (dz_compute.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) {
    at::mm_out(grad_rows, dz_compute, weight);
  } else if (!matmul_widens(dz_compute)) {
    grad_rows.copy_(matmul_in_compute_dtype(dz_compute, weight));
  } else {
    at::Tensor sum = at::zeros(grad_rows.sizes(), grad_rows.options().dtype(at::kFloat));  // [rows, dim] fp32
    for (int64_t v = 0; v < weight.size(0); v += kWidenedVocabRows) {
      const int64_t slice = std::min(kWidenedVocabRows, weight.size(0) - v);
      sum.addmm_(dz_compute.narrow(1, v, slice).to(at::kFloat), weight.narrow(0, v, slice).to(at::kFloat));
    }
    grad_rows.copy_(sum);
  }
}

// logsumexp over dim 1 of z [rows, vocab] fp32, in z's own memory (z holds exp(z - max) after):
// the steps of at::logsumexp (ATen's logsumexp_out_impl: max, an infinite max taken as 0, exp of the
// difference, sum, log, plus the max), without its [rows, vocab] temporary. Returns [rows] fp32.
at::Tensor logsumexp_in_place(const at::Tensor& z) {
  at::Tensor maxes = at::amax(z, {1}, /*keepdim=*/true);  // [rows, 1]
  maxes.masked_fill_(maxes.abs() == INFINITY, 0);
  at::Tensor sums = z.sub_(maxes).exp_().sum(1);
  return sums.log_().add_(maxes.squeeze(1));
}

// The op's one [chunk_rows, vocab] fp32 buffer, reused by every chunk: a chunk's logits, then in
// backward their gradient. One allocation per call, not two or three per chunk: on the host,
// 16 MiB blocks allocated and freed chunk after chunk stranded about 50 MiB of glibc's heap
// (llama-fortunes-pretrain, 2026-12-05).
at::Tensor chunk_buffer(int64_t chunk_rows, int64_t n, const at::Tensor& weight) {
  return at::empty({std::min(chunk_rows, n), weight.size(0)}, weight.options().dtype(at::kFloat));
}

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t chunk_rows) {
    const int64_t n = hidden.size(0);
    at::Tensor lse = at::empty({n}, hidden.options().dtype(at::kFloat));  // [n] fp32, kept for backward
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    const at::Tensor& w = weight;
    const at::Tensor buffer = chunk_buffer(chunk_rows, n, weight);
    for (int64_t start = 0; start < n; start += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - start);
      const at::Tensor z = buffer.narrow(0, 0, rows);  // [rows, vocab] fp32
      chunk_logits_into(z, hidden.narrow(0, start, rows), w);
      const at::Tensor t = targets.narrow(0, start, rows);
      const at::Tensor counted = t.ne(kIgnored);
      const at::Tensor picked = z.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);  // before z is overwritten
      const at::Tensor chunk_lse = logsumexp_in_place(z);
      lse.narrow(0, start, rows).copy_(chunk_lse);
      total += at::where(counted, chunk_lse - picked, at::zeros_like(picked)).sum();
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const at::Tensor g = grad_outputs[0].to(at::kFloat);  // scalar
    const bool need_hidden = ctx->needs_input_grad(0), need_weight = ctx->needs_input_grad(1);
    const int64_t n = hidden.size(0);
    const at::Tensor& w = weight;
    at::Tensor grad_hidden = need_hidden ? at::empty_like(hidden) : at::Tensor();
    // [vocab, dim], accumulated in place chunk by chunk (addmm_: no [vocab, dim] temporary per
    // chunk): in the weight's own dtype when it is fp32 or wider (returned as it is), else in fp32
    // (bf16 sums of many chunks would round each time), cast once at the end.
    const bool accumulate_in_weight_dtype = c10::elementSize(weight.scalar_type()) >= 4;
    at::Tensor grad_weight;
    if (need_weight)
      grad_weight = at::zeros(weight.sizes(),
                              weight.options().dtype(accumulate_in_weight_dtype ? weight.scalar_type() : at::kFloat));
    const at::Tensor buffer = need_hidden || need_weight ? chunk_buffer(chunk_rows, n, weight) : at::Tensor();
    for (int64_t start = 0; start < n && (need_hidden || need_weight); start += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - start);
      const at::Tensor h = hidden.narrow(0, start, rows);
      const at::Tensor t = targets.narrow(0, start, rows);
      // d loss / d z = softmax(z) - onehot(target) for counted rows, 0 for the others; times g.
      const at::Tensor dz = buffer.narrow(0, 0, rows);  // [rows, vocab] fp32: the logits, then their gradient in place
      chunk_logits_into(dz, h, w);
      dz.sub_(lse.narrow(0, start, rows).unsqueeze(1)).exp_();
      const at::Tensor counted = t.ne(kIgnored);
      dz.scatter_add_(1, t.clamp_min(0).unsqueeze(1), at::full({rows, 1}, -1.0f, dz.options()));
      dz.mul_((counted.to(at::kFloat) * g).unsqueeze(1));
      const at::Tensor dz_compute = dz.to(hidden.scalar_type());
      if (need_hidden) {
        chunk_input_grad_into(grad_hidden.narrow(0, start, rows), dz_compute, w);  // contiguous rows
      }
      if (need_weight) {
        if (accumulate_in_weight_dtype) {
          grad_weight.addmm_(dz_compute.t(), h);
        } else if (matmul_widens(w)) {
          // bf16 matmuls widened (train.bf16_matmul = fp32, CPUs without bf16 instructions): fp32
          // operands, as every other GEMM then is; dz is fp32 already, h [rows, dim] small.
          grad_weight.addmm_(dz.t(), h.to(at::kFloat));
        } else {
          // Native bf16 GEMMs (GPUs): the chunk's [vocab, dim] product from bf16 operands (fp32
          // accumulation inside the GEMM, a bf16 result, as the composed head's one product is),
          // summed into the fp32 accumulator. With fp32 operands here cuBLAS ran an fp32 SIMT GEMM
          // (TF32 is off): 86 of the 1B Llama's 255 ms per step on an H200 (2026-12-04).
          grad_weight.add_(at::mm(dz_compute.t(), h));
        }
      }
    }
    if (need_weight && grad_weight.scalar_type() != weight.scalar_type())
      grad_weight = grad_weight.to(weight.scalar_type());
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                    int64_t chunk_rows) {
  if (chunk_rows <= 0)
    throw std::invalid_argument("linear_cross_entropy_sum: chunk_rows must be positive, got " +
                                std::to_string(chunk_rows));
  if (hidden.dim() != 2 || weight.dim() != 2 || hidden.size(1) != weight.size(1)) {
    throw std::invalid_argument("linear_cross_entropy_sum: hidden [n, dim] and weight [vocab, dim] expected");
  }
  if (targets.dim() != 1 || targets.size(0) != hidden.size(0)) {
    throw std::invalid_argument("linear_cross_entropy_sum: targets [n] expected, one per row of hidden");
  }
  // As cross_entropy refuses them (a negative target would otherwise be clamped to class 0 and
  // trained on). On the host this costs a pass over n integers; a device tensor is checked on the
  // device, without waiting for it (the step fails at its next synchronisation).
  const int64_t vocab = weight.size(0);
  const at::Tensor invalid = targets.ne(kIgnored).logical_and(targets.lt(0).logical_or(targets.ge(vocab)));
  if (targets.device().is_cpu()) {
    if (invalid.any().item<bool>()) {
      const int64_t index = invalid.nonzero()[0][0].item<int64_t>();
      throw std::invalid_argument("linear_cross_entropy_sum: target " + std::to_string(targets[index].item<int64_t>()) +
                                  " at row " + std::to_string(index) + " is out of bounds (classes [0, " +
                                  std::to_string(vocab) + "), or " + std::to_string(kIgnored) +
                                  " for a row not counted)");
    }
  } else {
    at::_assert_async(invalid.logical_not().all(), "linear_cross_entropy_sum: a target is out of bounds");
  }
  return LinearCrossEntropy::apply(hidden, weight, targets.to(at::kLong), chunk_rows);
}

}  // namespace fsdp::models
