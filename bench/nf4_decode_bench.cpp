// nf4_decode_bench: how fast a QLoRA unit's gathered NF4 bytes become its compute-dtype weights
// (shard/nf4_storage.h's decode_nf4_storage), against the composed decode it replaces (nf4.h's
// nf4_absmax_from_codes and nf4_values, a dozen kernels with int64 and fp32 temporaries) and, for
// the device's bandwidth, a plain copy of the decoded weights. Default shapes: one block of Llama
// 3.2 1B (q, k, v, o, gate, up, down; two RMSNorm weights), bf16 base, double quantization, decoded
// to bf16. Prints a table, writes JSON; bytes moved = codes + absmax read + weights written.
//   build/bench/nf4_decode_bench [--device cuda] [--repeats 9] [--json runs/bench/nf4_decode.json]
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
#include "fsdp/shard/flat_param.h"
#include "fsdp/shard/nf4.h"
#include "fsdp/shard/nf4_storage.h"

int main(int argc, char** argv) {
  CLI::App app{"nf4_decode_bench: decoding a QLoRA unit's NF4 bytes, against the composed decode and a copy"};
  int repeats = 9, inner = 10, threads = 0;
  int64_t dim = 2048, kv_dim = 512, ffn = 8192;
  std::string json_path, device_name = "cpu";
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dim", dim, "model width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--kv-dim", kv_dim, "width of k and v (kv heads x head dim)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--ffn", ffn, "MLP width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "samples (the median is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--inner", inner, "decodes per sample")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "intra-op threads on the CPU (0: libtorch's default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_path, "write the rows as JSON here");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) torch::set_num_threads(threads);
  const at::Device device(device_name);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "nf4_decode_bench: --device cuda, but libtorch sees no CUDA device\n");
    return 2;
  }

  // One Llama block: names, shapes, NF4 or not (the norms stay in the base dtype).
  const std::vector<std::pair<std::vector<int64_t>, bool>> shapes = {
      {{dim, dim}, true}, {{kv_dim, dim}, true}, {{kv_dim, dim}, true}, {{dim, dim}, true}, {{ffn, dim}, true},
      {{ffn, dim}, true}, {{dim, ffn}, true},    {{dim}, false},        {{dim}, false}};
  std::vector<fsdp::shard::FlatEntry> entries;
  std::vector<bool> nf4;
  int64_t nf4_elements = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t numel = 1;
    for (int64_t d : shapes[i].first) numel *= d;
    entries.push_back(fsdp::shard::FlatEntry{"w" + std::to_string(i), {}, shapes[i].first, 0, numel});
    nf4.push_back(shapes[i].second);
    if (shapes[i].second) nf4_elements += numel;
  }
  const auto layout = fsdp::shard::FlatLayout::make(entries, 1);
  torch::manual_seed(0);
  const at::Tensor values = torch::randn({layout.padded_numel}) * 0.02;
  const auto storage = fsdp::shard::Nf4StorageLayout::make(layout, nf4, 1, /*double_quant=*/true, at::kBFloat16);
  const at::Tensor bytes = fsdp::shard::encode_nf4_storage(storage, layout, values).to(device);
  at::Tensor out = at::empty({layout.padded_numel}, at::TensorOptions().dtype(at::kBFloat16).device(device));

  // Bytes each decode moves: the storage read once, the bf16 weights written once.
  const double moved = static_cast<double>(storage.bytes) + 2.0 * static_cast<double>(layout.numel);
  struct Row {
    std::string path;
    double seconds, bytes;
  };
  std::vector<Row> rows;
  rows.push_back({device.is_cuda() && fsdp::shard::nf4_decode_kernel_compiled()
                      ? "decode_nf4_storage (fsdp.cpp's kernel)"
                      : "decode_nf4_storage",
                  fsdp_bench::median_seconds(device, repeats, inner,
                                             [&] { fsdp::shard::decode_nf4_storage(storage, layout, bytes, out); }),
                  moved});
  auto part = [&](const fsdp::shard::Nf4Part& p, at::ScalarType dtype) {
    return bytes.narrow(0, p.offset, p.bytes).view(dtype);
  };
  rows.push_back({"composed (nf4_absmax_from_codes + nf4_values)",
                  fsdp_bench::median_seconds(
                      device, repeats, inner,
                      [&] {
                        for (size_t i = 0; i < entries.size(); ++i) {
                          const auto& place = storage.entries[i];
                          at::Tensor target = out.narrow(0, layout.entries[i].offset, entries[i].numel);
                          if (!place.nf4) {
                            target.copy_(part(place.raw, at::kBFloat16));
                            continue;
                          }
                          const at::Tensor absmax = fsdp::shard::nf4_absmax_from_codes(
                              part(place.absmax, at::kByte), part(place.nested_absmax, at::kFloat),
                              part(place.offset, at::kFloat));
                          target.copy_(fsdp::shard::nf4_values(part(place.codes, at::kByte), absmax, entries[i].numel,
                                                               storage.blocksize, at::kBFloat16));
                        }
                      }),
                  moved});
  const at::Tensor source = out.clone();
  rows.push_back({"copy of the bf16 weights (bandwidth)",
                  fsdp_bench::median_seconds(device, repeats, inner, [&] { out.copy_(source); }),
                  4.0 * static_cast<double>(layout.numel)});

  std::printf("nf4_decode_bench: one block of %lld NF4 weights (+ %lld other), %s, storage %.1f MB\n",
              static_cast<long long>(nf4_elements), static_cast<long long>(layout.numel - nf4_elements),
              device_name.c_str(), storage.bytes / 1e6);
  std::printf("%-48s %10s %10s %8s\n", "path", "ms", "GB/s", "of copy");
  const double copy_rate = rows.back().bytes / rows.back().seconds;
  nlohmann::json json = {{"device", device_name},
                         {"dim", dim},
                         {"kv_dim", kv_dim},
                         {"ffn", ffn},
                         {"nf4_elements", nf4_elements},
                         {"storage_bytes", storage.bytes},
                         {"rows", nlohmann::json::array()}};
  for (const Row& row : rows) {
    const double rate = row.bytes / row.seconds;
    std::printf("%-48s %10.3f %10.1f %7.2fx\n", row.path.c_str(), row.seconds * 1e3, rate / 1e9, rate / copy_rate);
    json["rows"].push_back(
        {{"path", row.path}, {"seconds", row.seconds}, {"bytes", row.bytes}, {"gb_per_s", rate / 1e9}});
  }
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << json.dump(2) << "\n";
    if (!file.good()) {
      std::fprintf(stderr, "nf4_decode_bench: could not write the JSON to '%s'\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
