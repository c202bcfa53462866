// fsdp_nf4: fsdp.cpp's NF4 format (shard/nf4.h) on safetensors files, for tests/hf/check_nf4.py,
// which compares it with bitsandbytes byte for byte.
//   fsdp_nf4 quantize IN OUT [--blocksize B] [--no-double-quant]
//     every tensor W of IN -> W.packed (uint8), W.absmax (fp32, or uint8 with double quantization),
//     W.offset, W.nested_absmax, W.nested_map (double quantization), W.dequantized (W's dtype)
//   fsdp_nf4 dequantize IN OUT
//     IN holds a weight as bitsandbytes stores it (W.packed, W.absmax, W.shape int64, and with
//     double quantization W.offset, W.nested_absmax, W.nested_map); OUT: W.dequantized (fp32)
#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/shard/nf4.h"

namespace {

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

Tensors quantize(const fsdp::checkpoint::SafetensorsFile& in, int64_t blocksize, bool double_quant) {
  Tensors out;
  for (const auto& info : in.tensors()) {
    const fsdp::shard::Nf4Weight weight = fsdp::shard::quantize_nf4(in.read(info.name), blocksize, double_quant);
    out.emplace_back(info.name + ".packed", weight.packed);
    out.emplace_back(info.name + ".absmax", weight.absmax);
    if (double_quant) {
      out.emplace_back(info.name + ".offset", at::scalar_tensor(weight.offset, at::kFloat).reshape({1}));
      out.emplace_back(info.name + ".nested_absmax", weight.nested_absmax);
      out.emplace_back(info.name + ".nested_map", weight.nested_map);
    }
    out.emplace_back(info.name + ".dequantized", fsdp::shard::dequantize_nf4(weight, info.dtype).contiguous());
  }
  return out;
}

Tensors dequantize(const fsdp::checkpoint::SafetensorsFile& in, int64_t blocksize) {
  Tensors out;
  std::set<std::string> weights;
  for (const auto& info : in.tensors()) {
    const std::string suffix = ".packed";
    if (info.name.size() > suffix.size() &&
        info.name.compare(info.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      weights.insert(info.name.substr(0, info.name.size() - suffix.size()));
    }
  }
  for (const std::string& name : weights) {
    fsdp::shard::Nf4Weight weight;
    const at::Tensor shape = in.read(name + ".shape");
    weight.shape.assign(shape.data_ptr<int64_t>(), shape.data_ptr<int64_t>() + shape.numel());
    weight.blocksize = blocksize;
    weight.packed = in.read(name + ".packed").reshape(-1);
    weight.absmax = in.read(name + ".absmax").reshape(-1);
    weight.double_quant = in.contains(name + ".nested_absmax");
    if (weight.double_quant) {
      weight.offset = in.read(name + ".offset").reshape(-1)[0].item<float>();
      weight.nested_absmax = in.read(name + ".nested_absmax").reshape(-1);
      weight.nested_map = in.read(name + ".nested_map").reshape(-1);
    }
    out.emplace_back(name + ".dequantized", fsdp::shard::dequantize_nf4(weight, at::kFloat).contiguous());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(
        stderr,
        "usage: fsdp_nf4 quantize|dequantize IN.safetensors OUT.safetensors [--blocksize B] [--no-double-quant]\n");
    return 2;
  }
  const std::string mode = argv[1];
  int64_t blocksize = 64;
  bool double_quant = true;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--blocksize") == 0 && i + 1 < argc) {
      blocksize = std::stoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--no-double-quant") == 0) {
      double_quant = false;
    } else {
      std::fprintf(stderr, "fsdp_nf4: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  try {
    const fsdp::checkpoint::SafetensorsFile in(argv[2]);
    if (mode == "quantize") {
      fsdp::checkpoint::write_safetensors(argv[3], quantize(in, blocksize, double_quant));
    } else if (mode == "dequantize") {
      fsdp::checkpoint::write_safetensors(argv[3], dequantize(in, blocksize));
    } else {
      std::fprintf(stderr, "fsdp_nf4: mode '%s' (expected quantize or dequantize)\n", mode.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_nf4: %s\n", e.what());
    return 1;
  }
  return 0;
}
