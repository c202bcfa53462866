#include "fsdp/models/fused_ops.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <utility>

#ifdef FSDP_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "fused_kernels.h"
#endif

namespace fsdp::models {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

std::atomic<bool> g_fused_ops{true};

// RMSNorm's composed arithmetic, with the 1/rms per row a closed-form backward needs: h [..., dim]
// -> normed in h's dtype, rstd [..., 1] fp32. Normalised in fp32 even when h is bf16, as the
// reference implementations do. The reference is its normed output (under autograd); the fused
// CPU forward calls it without a graph, so the two agree bit for bit.
struct NormWithStatistics {
  at::Tensor normed, rstd;
};
NormWithStatistics rms_norm_with_statistics(const at::Tensor& h, const at::Tensor& weight, double eps) {
  const at::Tensor h32 = h.to(at::kFloat);
  at::Tensor rstd = at::rsqrt(h32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return {(h32 * rstd).to(h.scalar_type()) * weight.to(h.scalar_type()), rstd};
}

}  // namespace

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return rms_norm_with_statistics(x, weight, eps).normed;
}

void set_fused_ops(bool enabled) { g_fused_ops.store(enabled); }
bool fused_ops_enabled() { return g_fused_ops.load(); }

AddRmsNorm add_rms_norm_reference(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  at::Tensor sum = x + delta;
  at::Tensor normed = rms_norm_reference(sum, weight, eps);
  return {sum, normed};
}

at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor rotary_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // cos, sin [t, hd] -> [t, 1, hd]: broadcast over the heads of x [b, t, heads, hd].
  const int64_t half = x.size(-1) / 2;
  auto rotated_half = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1).to(x.scalar_type()) + rotated_half * sin.unsqueeze(1).to(x.scalar_type());
}

bool fused_kernels_compiled() {
#ifdef FSDP_HAVE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

namespace {

// CUDA tensors take fsdp.cpp's kernels where this build has them and the dtype is one they take;
// otherwise the composed reference (never the host's chunked backward: a launch per 64 K elements).
bool cuda_kernels_take(const at::Tensor& x) {
#ifdef FSDP_HAVE_CUDA_KERNELS
  const at::ScalarType dtype = x.scalar_type();
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
#else
  (void)x;
  return false;
#endif
}

#ifdef FSDP_HAVE_CUDA_KERNELS
kernels::Dtype kernel_dtype(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kBFloat16: return kernels::Dtype::BFloat16;
    case at::kHalf: return kernels::Dtype::Float16;
    default: return kernels::Dtype::Float32;
  }
}

void* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
#endif

// The kernel's closed form, in fp32 (fp64 for fp64), a cache-sized chunk of rows at a time: fp32
// temporaries of the whole [tokens, ffn] tensors would outweigh the activation the fused op saves
// (in bf16, 4x over). gate, up, grad_out [rows, cols] (views, any row stride) -> written into
// grad_gate and grad_up [rows, cols] (views: of a contiguous tensor each, or of one stacked one).
//   d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g)
void swiglu_backward_host(const at::Tensor& grad_out, const at::Tensor& gate, const at::Tensor& up,
                          const at::Tensor& grad_gate, const at::Tensor& grad_up) {
  constexpr int64_t kChunk = 1 << 16;  // elements: 256 KiB per fp32 temporary
  const at::ScalarType math = at::promote_types(gate.scalar_type(), at::kFloat);  // fp32, or fp64 for fp64
  const int64_t rows = gate.size(0), chunk_rows = std::max<int64_t>(1, kChunk / std::max<int64_t>(1, gate.size(1)));
  for (int64_t row = 0; row < rows; row += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - row);
    const at::Tensor g = gate.narrow(0, row, n).to(math), u = up.narrow(0, row, n).to(math);
    const at::Tensor dy = grad_out.narrow(0, row, n).to(math);
    const at::Tensor s = at::sigmoid(g);
    const at::Tensor dy_s = dy * s;
    grad_gate.narrow(0, row, n).copy_(dy_s * u * (1.0 + g * (1.0 - s)));
    grad_up.narrow(0, row, n).copy_(dy_s * g);
  }
}

// SwiGLU that keeps gate and up (not silu(gate) as well) for a backward in closed form.
struct SwigluFunction : torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (gate.is_cuda()) {  // contiguous, one dtype the kernels take: swiglu() saw to it
      const c10::cuda::CUDAGuard device(gate.device());
      at::Tensor out = at::empty_like(gate);
      kernels::swiglu_forward(gate.data_ptr(), up.data_ptr(), out.data_ptr(), 1, gate.numel(), gate.numel(),
                              kernel_dtype(gate), current_stream());
      return out;
    }
#endif
    return swiglu_reference(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1];
    const at::Tensor dy = grads[0].to(gate.scalar_type()).contiguous();
    at::Tensor grad_gate = at::empty_like(gate, at::MemoryFormat::Contiguous);
    at::Tensor grad_up = at::empty_like(up, at::MemoryFormat::Contiguous);
    if (gate.numel() == 0) return {grad_gate, grad_up};
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (gate.is_cuda()) {
      const c10::cuda::CUDAGuard device(gate.device());
      kernels::swiglu_backward(dy.data_ptr(), gate.data_ptr(), up.data_ptr(), grad_gate.data_ptr(), grad_up.data_ptr(),
                               1, gate.numel(), gate.numel(), kernel_dtype(gate), current_stream());
      return {grad_gate, grad_up};
    }
#endif
    const auto rows = [](const at::Tensor& t) { return t.reshape({-1, t.dim() == 0 ? 1 : t.size(-1)}); };
    swiglu_backward_host(rows(dy), rows(gate), rows(up), rows(grad_gate), rows(grad_up));
    return {grad_gate, grad_up};
  }
};

// SwiGLU of one stacked product's halves: gate_up [..., 2 cols] -> [..., cols]; backward writes
// the gradient of both halves into one [..., 2 cols] tensor (no concatenation of two).
struct SwigluStackedFunction : torch::autograd::Function<SwigluStackedFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    const int64_t cols = gate_up.size(-1) / 2;
    const at::Tensor gate = gate_up.narrow(-1, 0, cols), up = gate_up.narrow(-1, cols, cols);
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (gate_up.is_cuda()) {  // contiguous (rows 2 cols apart): swiglu_stacked() saw to it
      const c10::cuda::CUDAGuard device(gate_up.device());
      at::Tensor out = at::empty(gate.sizes(), gate_up.options());
      kernels::swiglu_forward(gate.data_ptr(), up.data_ptr(), out.data_ptr(), out.numel() / std::max<int64_t>(1, cols),
                              cols, 2 * cols, kernel_dtype(gate_up), current_stream());
      return out;
    }
#endif
    return swiglu_reference(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0];
    const int64_t cols = gate_up.size(-1) / 2;
    const at::Tensor dy = grads[0].to(gate_up.scalar_type()).contiguous();
    at::Tensor grad = at::empty(gate_up.sizes(), gate_up.options());  // [..., 2 cols]: gate's gradient, then up's
    if (grad.numel() == 0) return {grad};
    const auto half = [&](const at::Tensor& t, int64_t first) { return t.narrow(-1, first, cols); };
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (gate_up.is_cuda()) {
      const c10::cuda::CUDAGuard device(gate_up.device());
      // gate_up (contiguous: swiglu_stacked() saw to it) and grad (new): rows 2 cols apart.
      kernels::swiglu_backward(dy.data_ptr(), half(gate_up, 0).data_ptr(), half(gate_up, cols).data_ptr(),
                               half(grad, 0).data_ptr(), half(grad, cols).data_ptr(), dy.numel() / cols, cols, 2 * cols,
                               kernel_dtype(gate_up), current_stream());
      return {grad};
    }
#endif
    const at::Tensor all = gate_up.reshape({-1, 2 * cols}), grad_all = grad.view({-1, 2 * cols});
    swiglu_backward_host(dy.reshape({-1, cols}), half(all, 0), half(all, cols), half(grad_all, 0),
                         half(grad_all, cols));
    return {grad};
  }
};

// The transpose of the rotation (rotation by minus the angles): the backward of rotary, in fp32 (or fp64),
// one sequence of the batch at a time (bounded temporaries, as above).
//   dx[c] = dy[c] cos[c] + dy[c+h] sin[c+h];  dx[c+h] = dy[c+h] cos[c+h] - dy[c] sin[c]
at::Tensor rotate_back(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = grad.size(-1) / 2;
  const at::Tensor cos_t = cos.unsqueeze(1), sin_t = sin.unsqueeze(1);  // [t, 1, hd]: over the heads
  at::Tensor grad_x = at::empty_like(grad, at::MemoryFormat::Contiguous);
  for (int64_t b = 0; b < grad.size(0); ++b) {
    const at::Tensor g = grad[b].to(at::promote_types(grad.scalar_type(), at::kFloat));  // [t, heads, hd]
    const at::Tensor scaled = g * sin_t;
    const at::Tensor swapped = at::cat({scaled.narrow(-1, half, half), -scaled.narrow(-1, 0, half)}, -1);
    grad_x[b].copy_(g * cos_t + swapped);
  }
  return grad_x;
}

// Rotary that keeps only the tables for backward (the rotation is linear in x).
struct RotaryFunction : torch::autograd::Function<RotaryFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (x.is_cuda()) {  // the fp32 tables contiguous, x's rows of tokens (rotary() saw to it), on one device
      const c10::cuda::CUDAGuard device(x.device());
      at::Tensor out = at::empty(x.sizes(), x.options());
      kernels::rotary(x.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), out.data_ptr(), x.size(0), x.size(1),
                      x.size(2), x.size(3), x.stride(1), /*inverse=*/false, kernel_dtype(x), current_stream());
      return out;
    }
#endif
    return rotary_reference(x, cos, sin);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &cos = saved[0], &sin = saved[1];
    const at::Tensor& grad = grads[0];
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (grad.is_cuda()) {
      const at::Tensor grad_out = grad.contiguous();
      const c10::cuda::CUDAGuard device(grad_out.device());
      at::Tensor grad_x = at::empty_like(grad_out);
      kernels::rotary(grad_out.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), grad_x.data_ptr(),
                      grad_out.size(0), grad_out.size(1), grad_out.size(2), grad_out.size(3),
                      grad_out.size(2) * grad_out.size(3), /*inverse=*/true, kernel_dtype(grad_out), current_stream());
      return {grad_x, at::Tensor(), at::Tensor()};
    }
#endif
    return {rotate_back(grad, cos, sin), at::Tensor(), at::Tensor()};
  }
};

// RMSNorm's backward in closed form, in fp32 (fp64 for fp64), a chunk of rows at a time (bounded
// temporaries, as above). With hat = h rstd and g = dy w, per row:
//   dh = rstd (g - hat mean(g hat)) (+ the gradient that reaches h itself, grad_sum, when h is also
//   an output: the residual stream);   dw = sum over rows of dy hat.
// grad_normed or grad_sum may be undefined (no gradient reached that output). Returns {dh in h's
// dtype, dw in weight's dtype (undefined unless need_weight_grad)}.
std::pair<at::Tensor, at::Tensor> rms_norm_backward_host(const at::Tensor& grad_normed, const at::Tensor& grad_sum,
                                                         const at::Tensor& h, const at::Tensor& weight,
                                                         const at::Tensor& rstd, bool need_weight_grad) {
  const int64_t dim = h.size(-1), rows = dim == 0 ? 0 : h.numel() / dim;
  const at::ScalarType math = at::promote_types(h.scalar_type(), at::kFloat);
  const at::Tensor h_rows = h.reshape({rows, dim}), rstd_rows = rstd.reshape({rows, 1});
  const at::Tensor dy_rows = grad_normed.defined() ? grad_normed.reshape({rows, dim}) : at::Tensor();
  const at::Tensor dsum_rows = grad_sum.defined() ? grad_sum.reshape({rows, dim}) : at::Tensor();
  const at::Tensor w = weight.to(math);
  at::Tensor grad_h = at::empty({rows, dim}, h.options());
  at::Tensor grad_w = need_weight_grad ? at::zeros({dim}, w.options()) : at::Tensor();
  constexpr int64_t kChunk = 1 << 16;  // elements per chunk: 256 KiB per fp32 temporary
  const int64_t chunk_rows = std::max<int64_t>(1, kChunk / std::max<int64_t>(dim, 1));
  for (int64_t row = 0; row < rows; row += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - row);
    at::Tensor grad;  // [n, dim] in math
    if (dy_rows.defined()) {
      const at::Tensor r = rstd_rows.narrow(0, row, n).to(math);
      const at::Tensor hat = h_rows.narrow(0, row, n).to(math) * r;
      const at::Tensor dy = dy_rows.narrow(0, row, n).to(math);
      const at::Tensor g = dy * w;
      grad = r * (g - hat * (g * hat).mean(-1, /*keepdim=*/true));
      if (need_weight_grad) grad_w += (dy * hat).sum(0);
    }
    if (dsum_rows.defined()) {
      const at::Tensor dsum = dsum_rows.narrow(0, row, n).to(math);
      grad = grad.defined() ? grad + dsum : dsum;
    }
    if (grad.defined()) {
      grad_h.narrow(0, row, n).copy_(grad);
    } else {
      grad_h.narrow(0, row, n).zero_();
    }
  }
  return {grad_h.view(h.sizes()), need_weight_grad ? grad_w.to(weight.scalar_type()) : at::Tensor()};
}

// RMSNorm on the CPU that keeps its input and 1/rms per row (the reference keeps an fp32 copy of
// the input and the normalised output as well).
struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    NormWithStatistics out = rms_norm_with_statistics(x, weight, eps);
    ctx->save_for_backward({x, weight, out.rstd});
    return out.normed;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    auto [grad_x, grad_weight] =
        rms_norm_backward_host(grads[0], at::Tensor(), saved[0], saved[1], saved[2], ctx->needs_input_grad(1));
    return {grad_x, grad_weight, at::Tensor()};
  }
};

// h = x + delta and RMSNorm(h) in one pass, keeping h (an output: the residual stream, alive
// anyway), the weight and 1/rms per row. On CUDA: one kernel forward, one backward (plus the sum
// of the weight gradient's per-block partial rows). The gradient of h reaches x and delta alike.
struct AddRmsNormFunction : torch::autograd::Function<AddRmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps) {
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (x.is_cuda()) {  // x, delta and weight contiguous, in one dtype the kernels take: add_rms_norm() saw to it
      const c10::cuda::CUDAGuard device(x.device());
      const int64_t dim = x.size(-1), rows = dim == 0 ? 0 : x.numel() / dim;
      at::Tensor sum = at::empty_like(x), normed = at::empty_like(x);
      at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
      kernels::add_rms_norm_forward(x.data_ptr(), delta.data_ptr(), weight.data_ptr(), sum.data_ptr(),
                                    normed.data_ptr(), rstd.data_ptr<float>(), rows, dim, static_cast<float>(eps),
                                    kernel_dtype(x), current_stream());
      ctx->save_for_backward({sum, weight, rstd});
      return {sum, normed};
    }
#endif
    at::Tensor sum = x + delta;
    NormWithStatistics out = rms_norm_with_statistics(sum, weight, eps);
    ctx->save_for_backward({sum, weight, out.rstd});
    return {sum, out.normed};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &sum = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::Tensor &grad_sum = grads[0], &grad_normed = grads[1];
    const bool need_weight_grad = ctx->needs_input_grad(2);
#ifdef FSDP_HAVE_CUDA_KERNELS
    if (sum.is_cuda() && grad_normed.defined()) {
      const c10::cuda::CUDAGuard device(sum.device());
      const int64_t dim = sum.size(-1), rows = dim == 0 ? 0 : sum.numel() / dim;
      const at::Tensor dy = grad_normed.to(sum.scalar_type()).contiguous();
      const at::Tensor dsum = grad_sum.defined() ? grad_sum.to(sum.scalar_type()).contiguous() : at::Tensor();
      const int blocks = kernels::rms_norm_backward_blocks(rows);
      // [blocks, dim] fp32: block b's sum of dy hat over the rows it took; summed over blocks below.
      at::Tensor weight_partials =
          need_weight_grad ? at::zeros({blocks, dim}, sum.options().dtype(at::kFloat)) : at::Tensor();
      at::Tensor grad_h = at::empty_like(sum);
      kernels::add_rms_norm_backward(dy.data_ptr(), dsum.defined() ? dsum.data_ptr() : nullptr, sum.data_ptr(),
                                     weight.data_ptr(), rstd.data_ptr<float>(), grad_h.data_ptr(),
                                     need_weight_grad ? weight_partials.data_ptr<float>() : nullptr, rows, dim, blocks,
                                     kernel_dtype(sum), current_stream());
      at::Tensor grad_weight = need_weight_grad ? weight_partials.sum(0).to(weight.scalar_type()) : at::Tensor();
      return {grad_h, grad_h, grad_weight, at::Tensor()};
    }
#endif
    auto [grad_h, grad_weight] = rms_norm_backward_host(grad_normed, grad_sum, sum, weight, rstd, need_weight_grad);
    return {grad_h, grad_h, grad_weight, at::Tensor()};
  }
};

}  // namespace

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(), "swiglu: gate ", gate.sizes(), " ",
              gate.scalar_type(), " and up ", up.sizes(), " ", up.scalar_type(), " must have one shape and dtype");
  TORCH_CHECK(gate.device() == up.device(), "swiglu: gate on ", gate.device(), " and up on ", up.device());
  if (!fused_ops_enabled() || (gate.is_cuda() && !cuda_kernels_take(gate))) return swiglu_reference(gate, up);
  if (gate.is_cuda()) return SwigluFunction::apply(gate.contiguous(), up.contiguous());
  return SwigluFunction::apply(gate, up);
}

at::Tensor swiglu_stacked(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "swiglu_stacked: gate_up must be [..., 2 cols], got ",
              gate_up.sizes());
  const int64_t cols = gate_up.size(-1) / 2;
  if (!fused_ops_enabled() || (gate_up.is_cuda() && !cuda_kernels_take(gate_up))) {
    return swiglu_reference(gate_up.narrow(-1, 0, cols), gate_up.narrow(-1, cols, cols));
  }
  return SwigluStackedFunction::apply(gate_up.is_cuda() ? gate_up.contiguous() : gate_up);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(weight.dim() == 1 && x.dim() >= 1 && weight.size(0) == x.size(-1), "rms_norm: weight ", weight.sizes(),
              " must be [dim] for x ", x.sizes());
  if (!fused_ops_enabled()) return rms_norm_reference(x, weight, eps);
  // at::rms_norm takes libtorch's fused CUDA kernels (one forward, one backward) where the
  // version has them, and composes the same arithmetic where it does not; the weight must be in
  // x's dtype for the fused path. Its rounding differs from the reference's (once, not twice).
  if (x.is_cuda()) return at::rms_norm(x, {x.size(-1)}, weight.to(x.scalar_type()), eps);
  // The CPU computes the reference's forward (the values published checkpoints were checked
  // against) and the closed-form backward.
  return RmsNormFunction::apply(x, weight, eps);
}

AddRmsNorm add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.sizes() == delta.sizes() && x.scalar_type() == delta.scalar_type(), "add_rms_norm: x ", x.sizes(), " ",
              x.scalar_type(), " and delta ", delta.sizes(), " ", delta.scalar_type(),
              " must have one shape and dtype");
  TORCH_CHECK(weight.dim() == 1 && x.dim() >= 1 && weight.size(0) == x.size(-1), "add_rms_norm: weight ",
              weight.sizes(), " must be [dim] for x ", x.sizes());
  TORCH_CHECK(x.device() == delta.device() && x.device() == weight.device(), "add_rms_norm: x on ", x.device(),
              ", delta on ", delta.device(), ", weight on ", weight.device());
  if (!fused_ops_enabled() || (x.is_cuda() && !cuda_kernels_take(x)))
    return add_rms_norm_reference(x, delta, weight, eps);
  // CUDA kernels take one dtype for all three (the weight's cast is autograd's, outside the kernel).
  const bool cuda = x.is_cuda();
  const variable_list out =
      cuda ? AddRmsNormFunction::apply(x.contiguous(), delta.contiguous(), weight.to(x.scalar_type()).contiguous(), eps)
           : AddRmsNormFunction::apply(x, delta, weight, eps);
  return {out[0], out[1]};
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && x.size(-1) % 2 == 0,
              "rotary: x must be [b, t, heads, head_dim] with an even head_dim, got ", x.sizes());
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == x.size(1) && cos.size(1) == x.size(3) && sin.sizes() == cos.sizes(),
              "rotary: cos and sin must be [t, head_dim] = [", x.size(1), ", ", x.size(3), "], got ", cos.sizes(),
              " and ", sin.sizes());
  TORCH_CHECK(!cos.requires_grad() && !sin.requires_grad(), "rotary: the tables are constants (no gradient)");
  TORCH_CHECK(cos.device() == x.device() && sin.device() == x.device(), "rotary: x on ", x.device(), ", the tables on ",
              cos.device(), " and ", sin.device());
  if (!fused_ops_enabled()) return rotary_reference(x, cos, sin);
  if (x.is_cuda()) {
    if (!cuda_kernels_take(x) || cos.scalar_type() != at::kFloat || sin.scalar_type() != at::kFloat) {
      return rotary_reference(x, cos, sin);
    }
    // x [b, t, heads, hd] read in place where each token's heads are contiguous and the tokens
    // one stride apart (q and k as narrow views of a stacked q, k, v product are); else a copy.
    const bool token_rows = x.stride(3) == 1 && (x.size(2) == 1 || x.stride(2) == x.size(3)) &&
                            (x.size(0) == 1 || x.stride(0) == x.stride(1) * x.size(1));
    return RotaryFunction::apply(token_rows ? x : x.contiguous(), cos.contiguous(), sin.contiguous());
  }
  return RotaryFunction::apply(x, cos, sin);
}

bool cross_entropy_rows_take(const at::Tensor& like) {
  return fused_ops_enabled() && like.is_cuda() && cuda_kernels_take(like);
}

void cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& row_loss, double scale,
                        bool gradient) {
  if (!cross_entropy_rows_take(logits) || logits.dim() != 2 || !logits.is_contiguous() ||
      targets.scalar_type() != at::kLong || !targets.is_contiguous() || targets.numel() != logits.size(0) ||
      row_loss.scalar_type() != at::kFloat || !row_loss.is_contiguous() || row_loss.numel() != logits.size(0) ||
      targets.device() != logits.device() || row_loss.device() != logits.device()) {
    throw std::invalid_argument(
        "cross_entropy_rows: contiguous CUDA logits [rows, vocab] of a dtype the kernels take, targets [rows] int64 "
        "and row_loss [rows] fp32 expected, all on one device");
  }
#ifdef FSDP_HAVE_CUDA_KERNELS
  const c10::cuda::CUDAGuard device(logits.device());
  kernels::cross_entropy_rows(logits.data_ptr(), targets.data_ptr<int64_t>(), row_loss.data_ptr<float>(),
                              logits.size(0), logits.size(1), static_cast<float>(scale), gradient, kernel_dtype(logits),
                              current_stream());
#else
  (void)scale;
  (void)gradient;
#endif
}

}  // namespace fsdp::models
