#include "fsdp/models/attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>

#include "fsdp/compat.h"

namespace fsdp::models {

namespace {

std::map<at::ScalarType, AttentionPath>& paths() {
  static std::map<at::ScalarType, AttentionPath> chosen;
  return chosen;
}

// softmax(q k^T / sqrt(hd) [+ causal mask | allowed]) v by autograd's composition; the softmax in fp32.
at::Tensor math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                          const at::Tensor& allowed) {
  const int64_t t = q.size(2), s = k.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (causal) {
    const at::Tensor future = at::ones({t, s}, q.options().dtype(at::kBool)).triu(s - t + 1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  }
  if (allowed.defined()) scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  const at::Tensor probabilities = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(probabilities, v);
}

}  // namespace

void set_attention_path(at::ScalarType dtype, AttentionPath path) { paths()[dtype] = path; }

AttentionPath attention_path(at::ScalarType dtype) {
  auto it = paths().find(dtype);
  return it == paths().end() ? AttentionPath::Fused : it->second;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     const at::Tensor& allowed) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: q, k, v must be [b, heads, t, hd]");
  TORCH_CHECK(!(causal && allowed.defined()), "attention: a mask of allowed keys replaces causal, which must be false");
  TORCH_CHECK(!allowed.defined() || (allowed.scalar_type() == at::kBool && allowed.dim() == 4 && allowed.size(1) == 1 &&
                                     allowed.size(2) == q.size(2) && allowed.size(3) == k.size(2)),
              "attention: allowed must be bool [b, 1, t, s], got ",
              allowed.defined() ? allowed.sizes() : at::IntArrayRef{});
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "attention: ", heads, " query heads are not a multiple of ",
              kv_heads, " key/value heads");
  const bool grouped = kv_heads != heads;
  // [b, kv, t, hd] -> [b, kv * group, t, hd]: query head h reads key/value head h / group.
  const auto repeated = [&](const at::Tensor& x) { return grouped ? x.repeat_interleave(heads / kv_heads, 1) : x; };
  // The fused kernels that take grouped heads read k and v in place (enable_gqa), so no
  // [b, heads, t, hd] copies are made, nor kept for backward: the CPU's (libtorch 2.8 on), and
  // CUDA's flash and cuDNN attention. Where libtorch would take its composed math instead (the
  // CPU's in 2.7; CUDA's memory-efficient kernel, which a mask or fp32 selects, takes no groups),
  // k and v are repeated for the fused kernel (compat::fused_kernel_takes_grouped_heads).
  const auto fused = [&](const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in) {
    if (grouped && compat::fused_kernel_takes_grouped_heads(q_in, k_in, v_in, causal, allowed)) {
      return compat::scaled_dot_product_attention(q_in, k_in, v_in, causal, allowed, /*grouped_query=*/true);
    }
    return compat::scaled_dot_product_attention(q_in, repeated(k_in), repeated(v_in), causal, allowed);
  };
  switch (attention_path(q.scalar_type())) {
    case AttentionPath::FusedFp32:
      if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kDouble) {
        return fused(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat)).to(q.scalar_type());
      }
      break;
    case AttentionPath::Math: return math_attention(q, repeated(k), repeated(v), causal, allowed);
    case AttentionPath::Fused: break;
  }
  return fused(q, k, v);
}

at::Tensor document_causal_mask(const at::Tensor& positions) {
  TORCH_CHECK(positions.dim() == 2 && positions.scalar_type() == at::kLong,
              "document_causal_mask: positions must be [b, t] int64, got ", positions.sizes(), " ",
              positions.scalar_type());
  const int64_t t = positions.size(1);
  const at::Tensor documents = positions.eq(0).cumsum(1);                     // [b, t]: which example each token is in
  const at::Tensor same = documents.unsqueeze(2).eq(documents.unsqueeze(1));  // [b, t, t]
  const at::Tensor past = at::ones({t, t}, positions.options().dtype(at::kBool)).tril();
  return same.logical_and(past).unsqueeze(1);
}

at::Tensor sliding_window_mask(int64_t t, int64_t window, const at::Device& device) {
  TORCH_CHECK(window > 0, "sliding_window_mask: the window must be positive, got ", window);
  const at::Tensor i = at::arange(t, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(1);  // [t, 1]
  const at::Tensor j = i.view({1, t});                                                                   // [1, t]
  return j.le(i).logical_and(j.gt(i - window)).view({1, 1, t, t});
}

std::vector<AttentionTiming> time_attention_paths(int64_t batch, int64_t heads, int64_t kv_heads, int64_t t,
                                                  int64_t head_dim, bool causal, at::ScalarType dtype,
                                                  at::Device device, int repeats) {
  const AttentionPath previous = attention_path(dtype);
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  at::Tensor q = at::randn({batch, heads, t, head_dim}, options).requires_grad_(true);
  at::Tensor k = at::randn({batch, kv_heads, t, head_dim}, options).requires_grad_(true);
  at::Tensor v = at::randn({batch, kv_heads, t, head_dim}, options).requires_grad_(true);
  const at::Tensor grad = at::randn({batch, heads, t, head_dim}, options);
  std::vector<AttentionTiming> timings;
  for (AttentionPath path : {AttentionPath::Fused, AttentionPath::FusedFp32, AttentionPath::Math}) {
    if (path == AttentionPath::FusedFp32 && (dtype == at::kFloat || dtype == at::kDouble))
      continue;  // the same as Fused
    set_attention_path(dtype, path);
    std::vector<double> seconds;
    for (int i = 0; i <= repeats; ++i) {
      const auto start = std::chrono::steady_clock::now();
      attention(q, k, v, causal).backward(grad);
      if (!device.is_cpu()) q.grad().cpu();  // waits for the device's queue
      if (i > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      q.mutable_grad() = at::Tensor();
      k.mutable_grad() = at::Tensor();
      v.mutable_grad() = at::Tensor();
    }
    std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
    timings.push_back({path, seconds[seconds.size() / 2]});
  }
  set_attention_path(dtype, previous);
  return timings;
}

}  // namespace fsdp::models
