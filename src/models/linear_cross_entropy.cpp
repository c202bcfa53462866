#include "fsdp/models/linear_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/fused_ops.h"

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

// Log-sum-exp over dim 1 of z [rows, vocab] fp32, in z's own memory: the steps of at::logsumexp
// (ATen's logsumexp_out_impl: max, an infinite max taken as 0, exp of the difference, sum, log, plus
// the max) without its [rows, vocab] temporary. z then holds exp(z - max) or, where `softmax` is
// asked, exp(z - max) / sum. Returns the log-sum-exp [rows] fp32.
at::Tensor logsumexp_in_place(const at::Tensor& z, bool softmax) {
  at::Tensor maxes = at::amax(z, {1}, /*keepdim=*/true);  // [rows, 1]
  maxes.masked_fill_(maxes.abs() == INFINITY, 0);
  at::Tensor sums = z.sub_(maxes).exp_().sum(1, /*keepdim=*/true);  // [rows, 1]
  if (softmax) z.div_(sums);
  return sums.log_().add_(maxes).squeeze(1);
}

// The op's one [chunk_rows, vocab] buffer, reused by every chunk: a chunk's logits, then their
// softmax and gradient in place (fp32 on the host's path, the compute dtype on the row kernel's).
// One allocation per call, not two or three per chunk: on the host, 16 MiB blocks allocated and
// freed chunk after chunk stranded about 50 MiB of glibc's heap (llama-fortunes-pretrain, 2026-12-05).
at::Tensor chunk_buffer(int64_t chunk_rows, int64_t n, const at::Tensor& weight, at::ScalarType dtype) {
  return at::empty({std::min(chunk_rows, n), weight.size(0)}, weight.options().dtype(dtype));
}

// The gradients forward computes, for the loss times `expected`: d hidden [n, dim] in hidden's
// dtype; d weight [vocab, dim] in the weight's dtype when that is fp32 or wider, else in fp32 (bf16
// sums of many chunks would round each time), cast once in backward. Undefined where not wanted.
struct Gradients {
  at::Tensor hidden, weight;
};

// The host's step from a chunk's softmax dz [rows, vocab] fp32 to d (loss x expected) / d logits,
// in place: (softmax - onehot(target)) x expected on counted rows, 0 on the others.
void softmax_to_gradient(const at::Tensor& dz, const at::Tensor& targets, double expected) {
  dz.scatter_add_(1, targets.clamp_min(0).unsqueeze(1), at::full({dz.size(0), 1}, -1.0f, dz.options()));
  dz.mul_((targets.ne(kIgnored).to(at::kFloat) * expected).unsqueeze(1));
}

// One chunk's share of the gradients from d logits: dz_compute [rows, vocab] in hidden's dtype and,
// on the host's path, the same in fp32 (dz, for widened bf16 products; undefined on the GPU's
// kernel path, which never widens). h [rows, dim] and grad_rows (the chunk's rows of d hidden) in
// hidden's dtype.
void add_chunk_gradients(Gradients& grads, const at::Tensor& grad_rows, const at::Tensor& dz_compute,
                         const at::Tensor& dz, const at::Tensor& h, const at::Tensor& w) {
  if (grads.hidden.defined()) chunk_input_grad_into(grad_rows, dz_compute, w);  // contiguous rows
  if (!grads.weight.defined()) return;
  if (grads.weight.scalar_type() == w.scalar_type()) {
    grads.weight.addmm_(dz_compute.t(), h);
  } else if (matmul_widens(w)) {
    // bf16 matmuls widened (train.bf16_matmul = fp32, CPUs without bf16 instructions): fp32
    // operands, as every other GEMM then is; dz is fp32 already, h [rows, dim] small.
    grads.weight.addmm_(dz.t(), h.to(at::kFloat));
  } else {
    // Native bf16 GEMMs (GPUs): the chunk's [vocab, dim] product from bf16 operands (fp32
    // accumulation inside the GEMM, a bf16 result, as the composed head's one product is), summed
    // into the fp32 accumulator. With fp32 operands here cuBLAS ran an fp32 SIMT GEMM (TF32 is
    // off): 86 of the 1B Llama's 255 ms per step on an H200 (2026-12-04).
    grads.weight.add_(at::mm(dz_compute.t(), h));
  }
}

// The GPU's path (fused_ops.h, cross_entropy_rows): a chunk's logits stay in the compute dtype as
// the head's GEMM writes them, and one kernel computes each row's loss and, in place, its gradient.
// The host's path widens them into an fp32 buffer and composes about eight passes over it.
bool takes_row_kernel(const at::Tensor& hidden) { return !matmul_widens(hidden) && cross_entropy_rows_take(hidden); }

// Forward computes the loss and, when autograd will want them, both gradients, a chunk at a time:
// each chunk's logits are computed once (Liger-Kernel's and cut-cross-entropy's fused linear
// cross-entropy), where recomputing them in backward cost a second head GEMM per chunk. The
// gradients are for the loss times ChunkedLoss::gradient, the factor the caller's backward will
// bring; backward multiplies them by (its actual factor / that), exactly 1 when the caller said
// it right (the trainer does), so nothing changes then, and nothing is read on the host.
struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t chunk_rows, double expected, bool want_hidden,
                            bool want_weight) {
    const int64_t n = hidden.size(0);
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    Gradients grads;
    if (want_hidden) grads.hidden = at::empty_like(hidden);
    if (want_weight) {
      const bool in_weight_dtype = c10::elementSize(weight.scalar_type()) >= 4;
      grads.weight =
          at::zeros(weight.sizes(), weight.options().dtype(in_weight_dtype ? weight.scalar_type() : at::kFloat));
    }
    const bool row_kernel = takes_row_kernel(hidden);
    const bool gradients = want_hidden || want_weight;
    // [chunk rows, vocab]: fp32 on the host's path; the compute dtype on the kernel's, beside the
    // rows' losses [chunk rows] fp32.
    const at::Tensor buffer = chunk_buffer(chunk_rows, n, weight, row_kernel ? hidden.scalar_type() : at::kFloat);
    const at::Tensor row_losses =
        row_kernel ? at::empty({std::min(chunk_rows, n)}, hidden.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t start = 0; start < n; start += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - start);
      at::Tensor z = buffer.narrow(0, 0, rows);  // [rows, vocab]: logits, then their gradient
      const at::Tensor h = hidden.narrow(0, start, rows);
      const at::Tensor t = targets.narrow(0, start, rows);
      const at::Tensor grad_rows = want_hidden ? grads.hidden.narrow(0, start, rows) : at::Tensor();
      if (row_kernel) {
        at::mm_out(z, h, weight.t());
        const at::Tensor losses = row_losses.narrow(0, 0, rows);
        cross_entropy_rows(z, t, losses, expected, gradients);
        total += losses.sum();
        if (gradients) add_chunk_gradients(grads, grad_rows, z, at::Tensor(), h, weight);
        continue;
      }
      chunk_logits_into(z, h, weight);
      const at::Tensor picked = z.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);  // before z is overwritten
      const at::Tensor chunk_lse = logsumexp_in_place(z, /*softmax=*/gradients);
      total += at::where(t.ne(kIgnored), chunk_lse - picked, at::zeros_like(picked)).sum();
      if (gradients) {
        softmax_to_gradient(z, t, expected);
        add_chunk_gradients(grads, grad_rows, z.to(hidden.scalar_type()), z, h, weight);
      }
    }
    ctx->saved_data["expected"] = expected;
    ctx->saved_data["grad_hidden"] = grads.hidden;
    ctx->saved_data["grad_weight"] = grads.weight;
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // Handed over once: a second backward through the same graph (retain_graph) would find them
    // scaled already, so it is refused rather than answered wrong.
    if (!ctx->saved_data["expected"].isDouble()) {
      throw std::runtime_error(
          "linear_cross_entropy_sum: backward ran twice through one forward (retain_graph); the op computes its "
          "gradients once, in forward");
    }
    const double expected = ctx->saved_data["expected"].toDouble();
    at::Tensor grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
    at::Tensor grad_weight = ctx->saved_data["grad_weight"].toTensor();
    ctx->saved_data["expected"] = c10::IValue();
    ctx->saved_data["grad_hidden"] = at::Tensor();
    ctx->saved_data["grad_weight"] = at::Tensor();
    const at::Tensor g = grad_outputs[0].to(at::kFloat);
    // On the host the factor that came is read for free: none to apply when it is the expected one,
    // as in training (a pass over d weight [vocab, dim] saved). A device's is not read (that would
    // wait for its stream): the correction, 1 exactly then, is multiplied in, folded into the
    // weight gradient's cast where it has one. A true division by a tensor: CUDA divides by a host
    // scalar as a product with its reciprocal, which can leave 1 - 2^-24.
    const bool as_expected = g.is_cpu() && g.item<float>() == static_cast<float>(expected);
    const at::Tensor correction = as_expected ? at::Tensor() : g / at::full({}, expected, g.options());
    if (grad_hidden.defined() && !as_expected) grad_hidden.mul_(correction);
    if (grad_weight.defined()) {
      const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
      if (grad_weight.scalar_type() == weight_dtype) {
        if (!as_expected) grad_weight.mul_(correction);
      } else if (as_expected) {
        grad_weight = grad_weight.to(weight_dtype);
      } else {
        // The correction and the cast in one pass over [vocab, dim].
        at::Tensor cast = at::empty(grad_weight.sizes(), grad_weight.options().dtype(weight_dtype));
        grad_weight = at::mul_out(cast, grad_weight, correction);
      }
    }
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                    const ChunkedLoss& chunks) {
  if (chunks.rows <= 0)
    throw std::invalid_argument("linear_cross_entropy_sum: chunk rows must be positive, got " +
                                std::to_string(chunks.rows));
  // A factor that cannot scale the gradients (0, inf, NaN: a loss fault the guard is to see) is
  // left to backward's correction, which carries it into them.
  const double expected = std::isfinite(chunks.gradient) && chunks.gradient != 0 ? chunks.gradient : 1.0;
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
  // Gradients are computed in forward only where autograd will ask for them (evaluation and frozen
  // weights compute none).
  const bool grad_mode = at::GradMode::is_enabled();
  return LinearCrossEntropy::apply(hidden, weight, targets.to(at::kLong).contiguous(), chunks.rows, expected,
                                   grad_mode && hidden.requires_grad(), grad_mode && weight.requires_grad());
}

}  // namespace fsdp::models
