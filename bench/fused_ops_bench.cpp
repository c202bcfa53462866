// fused_ops_bench: how close the decoder's fused operations (models/fused_ops.h: SwiGLU, rotary,
// residual add + RMSNorm, forward and backward; the chunked loss's row kernel) come to the device's
// bandwidth, against their composed references and a plain copy. On a GPU these are fsdp.cpp's
// CUDA kernels (src/models/fused_kernels.cu), whose memory access issue 54 item 4 changed without a
// GPU to run them: this is their first figure. Default shapes: one micro-batch of Llama 3.2 1B
// (4 x 2048 tokens, dim 2048, 32 heads of 64, MLP 8192; a 1024-row chunk of its 128,256-token
// vocabulary), bf16. GB/s counts the bytes each operation must move (every input read once, every
// output written once, forward and backward together), so "of copy" near 1 is the roofline.
//   build/bench/fused_ops_bench [--device cuda] [--repeats 9] [--json runs/bench/fused_ops.json]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "fsdp/models/fused_ops.h"
#include "fsdp/models/layers.h"
#include "fsdp/models/stacked_linear.h"

namespace {

struct Row {
  std::string operation, path;
  double seconds, bytes;
};

// Leaves with gradients, their gradients dropped after each backward.
struct Leaves {
  std::vector<at::Tensor> tensors;
  at::Tensor add(const at::Tensor& t) {
    tensors.push_back(t.detach().requires_grad_(true));
    return tensors.back();
  }
  void drop_gradients() {
    for (at::Tensor& t : tensors) t.mutable_grad() = at::Tensor();
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fused_ops_bench: the decoder's fused operations against their composed references and a copy"};
  int repeats = 9, inner = 5;
  int64_t tokens = 8192, dim = 2048, ffn = 8192, heads = 32, kv_heads = 8, head_dim = 64, vocab = 128256, rows = 1024;
  std::string json_path, device_name = "cpu";
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--tokens", tokens, "tokens in the micro-batch")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dim", dim, "model width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--ffn", ffn, "MLP width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "query heads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", kv_heads, "key/value heads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--head-dim", head_dim, "head width (even)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "vocabulary (the loss rows)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rows", rows, "rows of a loss chunk")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "samples (the median is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--inner", inner, "calls per sample")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "write the rows as JSON here");
  CLI11_PARSE(app, argc, argv);
  const at::Device device(device_name);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "fused_ops_bench: --device cuda, but libtorch sees no CUDA device\n");
    return 2;
  }
  if (head_dim % 2 != 0) {
    std::fprintf(stderr, "fused_ops_bench: --head-dim %lld is odd (rotary turns pairs)\n",
                 static_cast<long long>(head_dim));
    return 2;
  }
  const auto options = at::TensorOptions().dtype(at::kBFloat16).device(device);
  const double element = 2.0;  // bytes of bf16
  torch::manual_seed(0);
  std::vector<Row> table;
  const auto both_paths = [&](const std::string& operation, double bytes, const std::function<void(bool)>& step) {
    for (const bool fused : {true, false}) {
      table.push_back({operation, fused ? "fused" : "composed",
                       fsdp_bench::median_seconds(device, repeats, inner, [&] { step(fused); }), bytes});
    }
  };

  {  // SwiGLU: forward reads gate and up, writes the product; backward reads dy, gate, up, writes two.
    Leaves leaves;
    const at::Tensor gate = leaves.add(at::randn({tokens, ffn}, options)),
                     up = leaves.add(at::randn({tokens, ffn}, options));
    const at::Tensor dy = at::randn({tokens, ffn}, options);
    both_paths("swiglu, forward and backward", 8.0 * element * tokens * ffn, [&](bool fused) {
      (fused ? fsdp::models::swiglu(gate, up) : fsdp::models::swiglu_reference(gate, up)).backward(dy);
      leaves.drop_gradients();
    });
  }
  {  // Rotary on q [b, t, heads, hd] as the projection lays it out: read and write, each way.
    Leaves leaves;
    const int64_t t = std::min<int64_t>(tokens, 2048), b = std::max<int64_t>(1, tokens / t);
    auto [cos, sin] = fsdp::models::rotary_tables(t, head_dim, 500000.0);
    cos = cos.to(device);
    sin = sin.to(device);
    const at::Tensor q = leaves.add(at::randn({b, t, heads, head_dim}, options));
    const at::Tensor dy = at::randn({b, t, heads, head_dim}, options);
    both_paths("rotary (q), forward and backward", 4.0 * element * q.numel(), [&](bool fused) {
      (fused ? fsdp::models::rotary(q, cos, sin) : fsdp::models::rotary_reference(q, cos, sin)).backward(dy);
      leaves.drop_gradients();
    });
  }
  {  // Residual add + RMSNorm: forward reads x, delta, writes the sum and its norm; backward reads
     // both incoming gradients and the sum, writes one gradient (x's and delta's are the same).
    Leaves leaves;
    const at::Tensor x = leaves.add(at::randn({tokens, dim}, options)),
                     delta = leaves.add(at::randn({tokens, dim}, options));
    const at::Tensor weight = leaves.add(at::ones({dim}, options));
    const at::Tensor g_sum = at::randn({tokens, dim}, options), g_normed = at::randn({tokens, dim}, options);
    both_paths("add + rms_norm, forward and backward", 8.0 * element * tokens * dim, [&](bool fused) {
      const auto out = fused ? fsdp::models::add_rms_norm(x, delta, weight, 1e-5)
                             : fsdp::models::add_rms_norm_reference(x, delta, weight, 1e-5);
      torch::autograd::backward({out.sum, out.normed}, {g_sum, g_normed});
      leaves.drop_gradients();
    });
  }
  // Linear layers reading one x as one GEMM where their weights lie back to back (stacked_linear.h,
  // as in an FSDP unit's buffer) or one GEMM each: compute-bound, so compare the ms; bytes count
  // each GEMM's operands and result once (forward: x, W, y; backward: dy, W, dx and dy, x, dW).
  // stacked(product [tokens, sum widths]) and separate(parts [tokens, width_i]) finish each way to
  // a [tokens, out_width] result that dy flows back through.
  using Finish = std::function<at::Tensor(const at::Tensor&, const std::vector<at::Tensor>&)>;
  const auto stacked_or_separate = [&](const std::string& operation, const std::vector<int64_t>& widths,
                                       const Finish& finish, int64_t out_width) {
    Leaves leaves;
    const at::Tensor x = leaves.add(at::randn({tokens, dim}, options));
    int64_t total = 0;
    for (int64_t w : widths) total += w;
    const at::Tensor buffer = at::randn({total * dim}, options) * 0.02;
    std::vector<at::Tensor> weights;
    for (int64_t offset = 0, i = 0; i < static_cast<int64_t>(widths.size()); offset += widths[i] * dim, ++i) {
      weights.push_back(leaves.add(buffer.narrow(0, offset, widths[i] * dim).view({widths[i], dim})));
    }
    const at::Tensor dy = at::randn({tokens, out_width}, options);
    const double bytes = element * 3.0 * (2.0 * tokens * dim + total * dim + tokens * total);
    for (const bool stacked : {true, false}) {
      const auto step = [&] {
        std::vector<at::Tensor> parts;
        at::Tensor product;
        if (stacked) {
          product = fsdp::models::stacked_linear(x, weights);
        } else {
          for (const at::Tensor& w : weights) parts.push_back(at::linear(x, w));
        }
        finish(product, parts).backward(dy);
        leaves.drop_gradients();
      };
      table.push_back({operation, stacked ? "stacked" : "separate",
                       fsdp_bench::median_seconds(device, repeats, inner, step), bytes});
    }
  };
  const int64_t q_width = heads * head_dim, kv_width = kv_heads * head_dim;
  // q, k, v as attention takes them: three [tokens, width] parts (split views of the one product),
  // here joined again so that one dy reaches all three.
  stacked_or_separate(
      "q, k, v projections, forward and backward", {q_width, kv_width, kv_width},
      [&](const at::Tensor& product, const std::vector<at::Tensor>& parts) {
        return at::cat(product.defined() ? product.split_with_sizes({q_width, kv_width, kv_width}, -1) : parts, -1);
      },
      q_width + 2 * kv_width);
  stacked_or_separate(
      "gate, up projections + swiglu, fwd and bwd", {ffn, ffn},
      [](const at::Tensor& product, const std::vector<at::Tensor>& parts) {
        return product.defined() ? fsdp::models::swiglu_stacked(product) : fsdp::models::swiglu(parts[0], parts[1]);
      },
      ffn);
  const at::Tensor logits = at::randn({rows, vocab}, options);
  if (fsdp::models::cross_entropy_rows_take(logits)) {  // the GPU's row kernel: read and overwrite
    const at::Tensor targets = at::randint(vocab, {rows}, at::TensorOptions().dtype(at::kLong).device(device));
    const at::Tensor row_loss = at::empty({rows}, at::TensorOptions().dtype(at::kFloat).device(device));
    // In place, call after call: each call's logits are the last one's gradients (bounded values:
    // the timing does not depend on them).
    at::Tensor z = logits.clone();
    table.push_back(
        {"loss rows (a chunk's logits), with gradient", "fused",
         fsdp_bench::median_seconds(device, repeats, inner,
                                    [&] { fsdp::models::cross_entropy_rows(z, targets, row_loss, 1.0, true); }),
         2.0 * element * rows * vocab});
  }
  {
    const at::Tensor source = at::randn({tokens, ffn}, options);
    at::Tensor target = at::empty_like(source);
    table.push_back({"copy (bandwidth)", "-",
                     fsdp_bench::median_seconds(device, repeats, inner, [&] { target.copy_(source); }),
                     2.0 * element * source.numel()});
  }

  std::printf("fused_ops_bench: %s, bf16, %lld tokens, dim %lld, MLP %lld, %lld heads of %lld; fused kernels %s\n",
              device_name.c_str(), static_cast<long long>(tokens), static_cast<long long>(dim),
              static_cast<long long>(ffn), static_cast<long long>(heads), static_cast<long long>(head_dim),
              fsdp::models::fused_kernels_compiled() ? "compiled" : "not compiled (composed on CUDA tensors)");
  std::printf("%-46s %-9s %10s %10s %8s\n", "operation", "path", "ms", "GB/s", "of copy");
  const double copy_rate = table.back().bytes / table.back().seconds;
  nlohmann::json json = {{"device", device_name},
                         {"tokens", tokens},
                         {"dim", dim},
                         {"ffn", ffn},
                         {"heads", heads},
                         {"head_dim", head_dim},
                         {"vocab", vocab},
                         {"rows", rows},
                         {"rows_table", nlohmann::json::array()}};
  for (const Row& row : table) {
    const double rate = row.bytes / row.seconds;
    std::printf("%-46s %-9s %10.3f %10.1f %7.2fx\n", row.operation.c_str(), row.path.c_str(), row.seconds * 1e3,
                rate / 1e9, rate / copy_rate);
    json["rows_table"].push_back({{"operation", row.operation},
                                  {"path", row.path},
                                  {"seconds", row.seconds},
                                  {"bytes", row.bytes},
                                  {"gb_per_s", rate / 1e9},
                                  {"of_copy", rate / copy_rate}});
  }
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << json.dump(2) << "\n";
    if (!file.good()) {
      std::fprintf(stderr, "fused_ops_bench: could not write the JSON to '%s'\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
