#include "fsdp/models/attention_kernel.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "fsdp/compat.h"
#include "fsdp/models/attention.h"

namespace fsdp::models {

namespace {

at::SDPBackend backend_of(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Flash: return at::SDPBackend::flash_attention;
    case AttentionKernel::Cudnn: return at::SDPBackend::cudnn_attention;
    case AttentionKernel::Efficient: return at::SDPBackend::efficient_attention;
  }
  return at::SDPBackend::math;
}

// libtorch's order (every backend it knows, its length the version's) as first asked.
const std::vector<at::SDPBackend>& original_order() {
  static const std::vector<at::SDPBackend> order = [] {
    const auto current = at::globalContext().sDPPriorityOrder();
    return std::vector<at::SDPBackend>(current.begin(), current.end());
  }();
  return order;
}

// softmax(q k^T / sqrt(hd) under the mask) v in fp32 by composed operations, k and v repeated to
// every query head: the reference a kernel's result is held against.
at::Tensor composed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                              const at::Tensor& allowed) {
  const int64_t group = q.size(1) / k.size(1), t = q.size(2);
  const at::Tensor k_all = k.to(at::kFloat).repeat_interleave(group, 1);
  const at::Tensor v_all = v.to(at::kFloat).repeat_interleave(group, 1);
  at::Tensor scores = at::matmul(q.to(at::kFloat), k_all.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor keep = allowed;
  if (causal) keep = at::ones({t, t}, q.options().dtype(at::kBool)).tril();
  if (keep.defined()) scores = scores.masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), v_all);
}

double relative_error(const at::Tensor& result, const at::Tensor& reference) {
  const double scale = reference.abs().max().item<double>();
  const double error = (result.to(at::kFloat) - reference).abs().max().item<double>();
  if (!std::isfinite(error)) return std::numeric_limits<double>::infinity();
  return scale > 0 ? error / scale : error;
}

void set_order(const std::vector<at::SDPBackend>& order) {
  std::vector<int64_t> codes;
  for (at::SDPBackend backend : order) codes.push_back(static_cast<int64_t>(backend));
  at::globalContext().setSDPPriorityOrder(codes);
}

}  // namespace

void prefer_attention_kernel(AttentionKernel kernel) {
  std::vector<at::SDPBackend> order{backend_of(kernel)};
  for (at::SDPBackend backend : original_order()) {
    if (backend != order.front()) order.push_back(backend);
  }
  set_order(order);
}

std::optional<AttentionKernel> preferred_attention_kernel() {
  original_order();  // remembered before any change
  const at::SDPBackend first = at::globalContext().sDPPriorityOrder().front();
  for (const auto& [kernel, name] : EnumNames<AttentionKernel>::values) {
    if (backend_of(kernel) == first) return kernel;
  }
  return std::nullopt;
}

void restore_attention_kernel_order() { set_order(original_order()); }

bool attention_kernel_takes(AttentionKernel kernel, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal, const at::Tensor& allowed) {
  const auto before = at::globalContext().sDPPriorityOrder();
  prefer_attention_kernel(kernel);
  const std::optional<at::Tensor> mask = allowed.defined() ? std::optional<at::Tensor>(allowed) : std::nullopt;
  const bool grouped = k.size(1) != q.size(1);
  // As attention() passes them: grouped heads in place where a fused kernel takes them, else
  // repeated to every query head.
  int64_t choice = -1;
  if (grouped && compat::fused_kernel_takes_grouped_heads(q, k, v, causal, allowed)) {
    choice = at::_fused_sdp_choice(q, k, v, mask, 0.0, causal, std::nullopt, /*enable_gqa=*/true);
  } else {
    const int64_t group = q.size(1) / k.size(1);
    const at::Tensor k_all = grouped ? k.repeat_interleave(group, 1) : k;
    const at::Tensor v_all = grouped ? v.repeat_interleave(group, 1) : v;
    choice = at::_fused_sdp_choice(q, k_all, v_all, mask, 0.0, causal, std::nullopt, /*enable_gqa=*/false);
  }
  set_order(std::vector<at::SDPBackend>(before.begin(), before.end()));
  return choice == static_cast<int64_t>(backend_of(kernel));
}

namespace {

// Random q [batch, heads, tokens, hd], k and v [batch, kv_heads, tokens, hd] with gradients, and
// backward's incoming gradient; causal, or two documents in each row (positions restarting halfway).
struct AttentionInputs {
  at::Tensor q, k, v, grad, allowed;
  bool causal = true;
};

AttentionInputs random_inputs(const AttentionCall& call, at::ScalarType dtype, at::Device device) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  AttentionInputs in;
  in.q = at::randn({call.batch, call.heads, call.tokens, call.head_dim}, options).requires_grad_(true);
  in.k = at::randn({call.batch, call.kv_heads, call.tokens, call.head_dim}, options).requires_grad_(true);
  in.v = at::randn({call.batch, call.kv_heads, call.tokens, call.head_dim}, options).requires_grad_(true);
  in.grad = at::randn({call.batch, call.heads, call.tokens, call.head_dim}, options);
  in.causal = !call.masked;
  if (call.masked) {
    const int64_t half = call.tokens / 2;
    const at::Tensor row = at::cat({at::arange(half), at::arange(call.tokens - half)});
    in.allowed = document_causal_mask(row.unsqueeze(0).expand({call.batch, call.tokens}).contiguous().to(device));
  }
  return in;
}

// attention() forward and backward with the order as it stands; returns the output.
at::Tensor forward_and_backward(AttentionInputs& in) {
  const at::Tensor out = attention(in.q, in.k, in.v, in.causal, in.allowed);
  out.backward(in.grad);
  return out.detach();
}

void drop_gradients(AttentionInputs& in) {
  for (at::Tensor* t : {&in.q, &in.k, &in.v}) t->mutable_grad() = at::Tensor();
}

// Each kernel's relative error (output and query gradient) against the composed attention in fp32,
// on one row of at most 256 tokens of the call's heads: the composed reference keeps [heads, t, t]
// fp32 scores, which at the call's full size (a 1B Llama's: 4 x 32 x 2048^2) would take gigabytes.
std::map<AttentionKernel, double> errors_against_composed(const std::vector<AttentionKernel>& kernels,
                                                          AttentionCall call, at::ScalarType dtype, at::Device device) {
  call.batch = 1;
  call.tokens = std::min<int64_t>(call.tokens, 256);
  AttentionInputs in = random_inputs(call, dtype, device);
  at::Tensor q32 = in.q.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor reference = composed_attention(q32, in.k.detach(), in.v.detach(), in.causal, in.allowed);
  reference.backward(in.grad.to(at::kFloat));
  std::map<AttentionKernel, double> errors;
  for (AttentionKernel kernel : kernels) {
    prefer_attention_kernel(kernel);
    const at::Tensor out = forward_and_backward(in);
    errors[kernel] = std::max(relative_error(out, reference.detach()), relative_error(in.q.grad(), q32.grad()));
    drop_gradients(in);
  }
  return errors;
}

}  // namespace

std::vector<AttentionKernelTiming> time_attention_kernels(const AttentionCall& call, at::ScalarType dtype,
                                                          at::Device device, int repeats) {
  const auto before = at::globalContext().sDPPriorityOrder();
  AttentionInputs in = random_inputs(call, dtype, device);
  std::vector<AttentionKernel> taken;
  for (const auto& [kernel, name] : EnumNames<AttentionKernel>::values) {
    if (attention_kernel_takes(kernel, in.q.detach(), in.k.detach(), in.v.detach(), in.causal, in.allowed)) {
      taken.push_back(kernel);
    }
  }
  std::map<AttentionKernel, double> errors = errors_against_composed(taken, call, dtype, device);
  std::map<AttentionKernel, std::vector<double>> seconds;
  for (int round = 0; round <= std::max(1, repeats); ++round) {  // round 0: the warm-up
    for (AttentionKernel kernel : taken) {
      prefer_attention_kernel(kernel);
      const auto start = std::chrono::steady_clock::now();
      forward_and_backward(in);
      if (!device.is_cpu()) in.q.grad().cpu();  // waits for the device's queue
      if (round > 0) {
        seconds[kernel].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      drop_gradients(in);
    }
  }
  set_order(std::vector<at::SDPBackend>(before.begin(), before.end()));
  std::vector<AttentionKernelTiming> timings;
  for (AttentionKernel kernel : taken) {
    std::vector<double>& s = seconds[kernel];
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    const bool wrong = !(errors[kernel] <= kAttentionKernelTolerance);
    timings.push_back({kernel, wrong ? std::numeric_limits<double>::infinity() : s[s.size() / 2], errors[kernel]});
  }
  return timings;
}

}  // namespace fsdp::models
