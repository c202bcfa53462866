// attention_bench: forward + backward of fsdp::models::attention on each path (fused, fused_fp32,
// math; models/attention.h) and dtype, for the attention shapes of the configs in configs/ and a
// few more, on this machine's CPU (or a GPU with --device cuda). Prints a table, writes JSON. What
// train.attention = "auto" is chosen from (docs/benchmarks.md). Then packed rows (data.packing):
// attention within each example by a block-diagonal mask or example by example, and the padded rows.
//   build/bench/attention_bench [--threads 1] [--repeats 9] [--longest 2048] [--json runs/bench/attention.json]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include "fsdp/models/attention.h"

namespace {

struct Shape {
  std::string name;  // which model runs it
  int64_t batch, heads, kv_heads, t, head_dim;
  bool causal;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attention_bench: the attention paths' forward + backward time per dtype and shape"};
  int threads = 1, repeats = 9;
  int64_t longest = 2048;
  std::string json_path, device_name = "cpu";
  app.add_option("--threads", threads, "intra-op threads (a rank of a 2-rank job on 2 cores has 1)")
      ->capture_default_str();
  app.add_option("--repeats", repeats, "timed repetitions per path (the median is reported)")->capture_default_str();
  app.add_option("--longest", longest, "leave out shapes with longer sequences (the smoke test: 160)")
      ->capture_default_str();
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str();
  app.add_option("--json", json_path, "write the rows as JSON here");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);
  const at::Device device(device_name);
  // Per rank at 2 ranks: ViT Fashion-MNIST 64 images of 17 tokens (4 heads of 32); the main job's
  // GPT 16 windows of 128 (4 of 32); llama-small 4 windows of 128 (8 heads over 4, 32); the
  // fine-tuning Llama 4 x 160 (4 over 2, 32); and longer sequences for the trend.
  const std::vector<Shape> shapes = {
      {"vit-fmnist (configs/vit-fashion-mnist.toml)", 64, 4, 4, 17, 32, false},
      {"gpt-tiny (configs/gpt-fortunes-tiny.toml)", 16, 4, 4, 128, 32, true},
      {"llama-small (configs/llama-fortunes-small.toml)", 4, 8, 4, 128, 32, true},
      {"llama-tiny (configs/llama-finetune-fortunes.toml)", 4, 4, 2, 160, 32, true},
      {"seq 512, hd 64", 2, 8, 8, 512, 64, true},
      {"seq 2048, hd 64", 1, 8, 8, 2048, 64, true},
  };
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-50s %-9s %10s %12s %10s  %s\n", "shape [b, heads, t, hd]", "dtype", "fused ms", "fused_fp32 ms",
              "math ms", "fastest");
  for (const Shape& s : shapes) {
    if (s.t > longest) continue;
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const auto timings = fsdp::models::time_attention_paths(s.batch, s.heads, s.kv_heads, s.t, s.head_dim, s.causal,
                                                              dtype, device, repeats);
      double fused = -1, fp32 = -1, math = -1;
      const fsdp::models::AttentionTiming* best = &timings.front();
      nlohmann::json row = {
          {"shape", s.name}, {"batch", s.batch},       {"heads", s.heads},   {"kv_heads", s.kv_heads},
          {"t", s.t},        {"head_dim", s.head_dim}, {"causal", s.causal}, {"dtype", c10::toString(dtype)}};
      for (const auto& timing : timings) {
        row[std::string(fsdp::enum_name(timing.path)) + "_seconds"] = timing.seconds;
        if (timing.path == fsdp::models::AttentionPath::Fused) fused = timing.seconds;
        if (timing.path == fsdp::models::AttentionPath::FusedFp32) fp32 = timing.seconds;
        if (timing.path == fsdp::models::AttentionPath::Math) math = timing.seconds;
        if (timing.seconds < best->seconds) best = &timing;
      }
      row["fastest"] = fsdp::enum_name(best->path);
      rows.push_back(row);
      char label[96];
      std::snprintf(label, sizeof(label), "%s [%lld, %lld, %lld, %lld]", s.name.substr(0, 24).c_str(),
                    static_cast<long long>(s.batch), static_cast<long long>(s.heads), static_cast<long long>(s.t),
                    static_cast<long long>(s.head_dim));
      auto ms = [](double v) { return v < 0 ? std::string("-") : std::to_string(v * 1e3).substr(0, 7); };
      std::printf("%-50s %-9s %10s %12s %10s  %s\n", label, c10::toString(dtype), ms(fused).c_str(), ms(fp32).c_str(),
                  ms(math).c_str(), fsdp::enum_name(best->path));
    }
  }
  // Packed rows (data.packing): the fine-tune job's micro-batch, 4 rows of 160 tokens holding about
  // 2.5 examples each (lengths 64, 48, 38 and padding), 4 heads over 2, fp32. Attention within
  // each example two ways, and the padded rows the same examples take one to a row.
  nlohmann::json packed_rows = nlohmann::json::array();
  {
    const int64_t rows_per_batch = 4, t = 160, heads = 4, kv_heads = 2, hd = 32;
    const std::vector<int64_t> lengths = {64, 48, 38, 10};  // the last: padding, an example of its own
    const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
    at::Tensor positions = at::empty({rows_per_batch, t}, at::kLong);
    for (int64_t r = 0, start = 0; r < rows_per_batch; ++r, start = 0) {
      for (int64_t n : lengths) positions[r].narrow(0, start, n).copy_(torch::arange(n, at::kLong)), start += n;
    }
    const at::Tensor allowed = fsdp::models::document_causal_mask(positions.to(device));
    auto time = [&](int64_t batch, int64_t length,
                    const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& run) {
      at::Tensor q = at::randn({batch, heads, length, hd}, options).requires_grad_(true);
      at::Tensor k = at::randn({batch, kv_heads, length, hd}, options).requires_grad_(true);
      at::Tensor v = at::randn({batch, kv_heads, length, hd}, options).requires_grad_(true);
      std::vector<double> seconds;
      for (int i = 0; i <= repeats; ++i) {
        const auto start = std::chrono::steady_clock::now();
        run(q, k, v).sum().backward();
        if (!device.is_cpu()) q.grad().cpu();
        if (i > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        q.mutable_grad() = k.mutable_grad() = v.mutable_grad() = at::Tensor();
      }
      std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
      return seconds[seconds.size() / 2];
    };
    std::vector<std::pair<std::string, double>> ways;
    for (auto path : {fsdp::models::AttentionPath::Fused, fsdp::models::AttentionPath::Math}) {
      fsdp::models::set_attention_path(at::kFloat, path);
      ways.emplace_back(std::string("block-diagonal mask, ") + fsdp::enum_name(path),
                        time(rows_per_batch, t, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                          return fsdp::models::attention(q, k, v, false, allowed);
                        }));
    }
    fsdp::models::set_attention_path(at::kFloat, fsdp::models::AttentionPath::Fused);
    ways.emplace_back("per example (causal, fused)",
                      time(rows_per_batch, t, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                        std::vector<at::Tensor> parts;
                        int64_t start = 0;
                        for (int64_t n : lengths) {
                          parts.push_back(fsdp::models::attention(q.narrow(2, start, n), k.narrow(2, start, n),
                                                                  v.narrow(2, start, n), true));
                          start += n;
                        }
                        return at::cat(parts, 2);
                      }));
    ways.emplace_back("padded: 12 rows, one example each",
                      time(3 * rows_per_batch, t, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                        return fsdp::models::attention(q, k, v, true);
                      }));
    std::printf("\npacked rows [4, 4 heads over 2, 160, 32] fp32, examples of 64 + 48 + 38 tokens a row:\n");
    for (const auto& [way, seconds] : ways) {
      std::printf("  %-40s %8.3f ms\n", way.c_str(), seconds * 1e3);
      packed_rows.push_back({{"way", way}, {"seconds", seconds}});
    }
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json{{"bench", "attention"},
                                               {"threads", threads},
                                               {"device", device_name},
                                               {"rows", rows},
                                               {"packed_rows", packed_rows}}
                                    .dump(1)
                             << "\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
