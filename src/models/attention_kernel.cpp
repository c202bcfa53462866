#include "fsdp/models/attention_kernel.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

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

std::vector<at::SDPBackend> current_order() {
  const auto current = at::globalContext().sDPPriorityOrder();
  return std::vector<at::SDPBackend>(current.begin(), current.end());
}

// libtorch's order (every backend it knows, its length the version's) as first asked, or as
// libtorch settled it at settle_attention_kernel_order().
std::vector<at::SDPBackend>& original_order() {
  static std::vector<at::SDPBackend> order = current_order();
  return order;
}

// softmax(q k^T / sqrt(hd) where keep) v in fp32 by composed operations, k and v repeated to every
// query head: the reference a kernel's result is held against. q [b, heads, r, hd] (r query rows),
// k and v [b, kv_heads, t, hd], keep bool broadcastable to [b, heads, r, t].
at::Tensor composed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keep) {
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor k_all = k.to(at::kFloat).repeat_interleave(group, 1);
  const at::Tensor v_all = v.to(at::kFloat).repeat_interleave(group, 1);
  at::Tensor scores = at::matmul(q.to(at::kFloat), k_all.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  scores = scores.masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity());
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

// The order as it stands, put back however the scope ends.
struct OrderGuard {
  std::vector<at::SDPBackend> before;
  OrderGuard() {
    const auto current = at::globalContext().sDPPriorityOrder();
    before.assign(current.begin(), current.end());
  }
  ~OrderGuard() { set_order(before); }
  OrderGuard(const OrderGuard&) = delete;
  OrderGuard& operator=(const OrderGuard&) = delete;
};

}  // namespace

void settle_attention_kernel_order(at::Device device) {
  static bool settled = false;
  if (!device.is_cuda() || settled) return;
  const std::vector<at::SDPBackend> remembered = original_order();  // remembered before the choice
  const std::vector<at::SDPBackend> before = current_order();
  // [1, 1, 8, 8] half q, k and v: a shape every CUDA kernel's checks read without a launch.
  const at::Tensor tiny = at::zeros({1, 1, 8, 8}, at::TensorOptions().dtype(at::kHalf).device(device));
  try {
    (void)at::_fused_sdp_choice(tiny, tiny, tiny, std::nullopt, 0.0, /*is_causal=*/true, std::nullopt,
                                /*enable_gqa=*/false);
  } catch (const c10::Error&) {
    // No kernel for the tiny shape (every backend turned off, say: libtorch then returns before it
    // settles anything). Not settled: the next call tries again, and a real call says what is
    // wrong with its own inputs.
    return;
  }
  settled = true;
  const std::vector<at::SDPBackend> after = current_order();
  if (after != before) {  // libtorch settled its order just now, over `before`
    original_order() = after;
    if (before != remembered) set_order(before);  // a preference stood: it stays, over libtorch's
  }
}

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
  settle_attention_kernel_order(q.device());  // before the guard: it restores the order it found
  const OrderGuard guard;
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
  return choice == static_cast<int64_t>(backend_of(kernel));
}

namespace {

// Random q [batch, heads, tokens, hd], k and v [batch, kv_heads, tokens, hd] with gradients, and
// backward's incoming gradient; causal, or two documents in each row (positions restarting
// halfway). Drawn from a generator of its own: the global ones drive dropout, and a resumed run
// restores them exactly.
struct AttentionInputs {
  at::Tensor q, k, v, grad, allowed;
  bool causal = true;
};

AttentionInputs random_inputs(const AttentionCall& call, at::ScalarType dtype, at::Device device) {
  auto generator = at::detail::createCPUGenerator(1);
  const auto draw = [&](int64_t heads) {
    return at::randn({call.batch, heads, call.tokens, call.head_dim}, generator).to(device, dtype);
  };
  AttentionInputs in;
  in.q = draw(call.heads).requires_grad_(true);
  in.k = draw(call.kv_heads).requires_grad_(true);
  in.v = draw(call.kv_heads).requires_grad_(true);
  in.grad = draw(call.heads);
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

constexpr int64_t kCheckedRows = 64;

// Each kernel's relative error against the composed attention in fp32, on one row of the call's
// full length: the output and the query gradient of its last kCheckedRows queries (each query's
// output and gradient depend on its own row of scores alone), whose reference keeps
// [heads, kCheckedRows, t] scores, not the [b, heads, t, t] of the whole call (gigabytes at a 1B
// Llama's). A kernel that throws is +inf.
std::map<AttentionKernel, double> errors_against_composed(const std::vector<AttentionKernel>& kernels,
                                                          AttentionCall call, at::ScalarType dtype, at::Device device) {
  call.batch = 1;
  AttentionInputs in = random_inputs(call, dtype, device);
  const int64_t t = call.tokens, rows = std::min(kCheckedRows, t), first = t - rows;
  at::Tensor keep;
  if (in.causal) {
    const at::Tensor query = at::arange(first, t, at::TensorOptions().device(device)).unsqueeze(1);
    keep = at::arange(t, at::TensorOptions().device(device)).unsqueeze(0).le(query);  // [rows, t]
  } else {
    keep = in.allowed.narrow(2, first, rows);
  }
  at::Tensor q_rows = in.q.detach().narrow(2, first, rows).to(at::kFloat).requires_grad_(true);
  const at::Tensor reference = composed_attention(q_rows, in.k.detach(), in.v.detach(), keep);
  reference.backward(in.grad.narrow(2, first, rows).to(at::kFloat));
  std::map<AttentionKernel, double> errors;
  for (AttentionKernel kernel : kernels) {
    try {
      prefer_attention_kernel(kernel);
      const at::Tensor out = forward_and_backward(in).narrow(2, first, rows);
      errors[kernel] = std::max(relative_error(out, reference.detach()),
                                relative_error(in.q.grad().narrow(2, first, rows), q_rows.grad()));
    } catch (const std::exception&) {
      errors[kernel] = std::numeric_limits<double>::infinity();
    }
    drop_gradients(in);
  }
  return errors;
}

}  // namespace

std::vector<AttentionKernelTiming> time_attention_kernels(const AttentionCall& call, at::ScalarType dtype,
                                                          at::Device device, int repeats) {
  settle_attention_kernel_order(device);
  const OrderGuard guard;
  AttentionInputs in = random_inputs(call, dtype, device);
  std::vector<AttentionKernel> taken;
  for (const auto& [kernel, name] : EnumNames<AttentionKernel>::values) {
    if (attention_kernel_takes(kernel, in.q, in.k, in.v, in.causal, in.allowed)) taken.push_back(kernel);
  }
  std::map<AttentionKernel, double> errors = errors_against_composed(taken, call, dtype, device);
  std::map<AttentionKernel, std::vector<double>> seconds;
  for (int round = 0; round <= std::max(1, repeats); ++round) {  // round 0: the warm-up
    for (AttentionKernel kernel : taken) {
      if (!(errors[kernel] <= kAttentionKernelTolerance)) continue;  // wrong, or it threw: not timed
      try {
        prefer_attention_kernel(kernel);
        const auto start = std::chrono::steady_clock::now();
        forward_and_backward(in);
        if (!device.is_cpu()) in.q.grad().cpu();  // waits for the device's queue
        if (round > 0) {
          seconds[kernel].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
      } catch (const std::exception&) {  // out of memory at the call's size, say: left out
        errors[kernel] = std::numeric_limits<double>::infinity();
      }
      drop_gradients(in);
    }
  }
  std::vector<AttentionKernelTiming> timings;
  for (AttentionKernel kernel : taken) {
    std::vector<double>& s = seconds[kernel];
    double median = std::numeric_limits<double>::infinity();
    if (errors[kernel] <= kAttentionKernelTolerance && !s.empty()) {
      std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
      median = s[s.size() / 2];
    }
    timings.push_back({kernel, median, errors[kernel]});
  }
  return timings;
}

}  // namespace fsdp::models
