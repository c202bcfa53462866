// The other files of a model directory a user downloads: the first byte of the input picks the
// reader, the rest is the file.
//   0: a bitsandbytes quant_state (the JSON beside an NF4 weight), read with well-formed parts
//   1: config.json (read_hf_config)
//   2: adapter_config.json (read_peft_adapter_config)
//   3: model.safetensors.index.json (its weight_map's paths must stay in the directory)
//   4: GPT-2's vocab.json and merges.txt, split at the first NUL byte; then a text is encoded
// Malformed input must throw, never crash or hang.
#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include "bnb_4bit_weight.h"
#include "fsdp/checkpoint/hf_model_dir.h"
#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/peft_adapter.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/shard/nf4.h"

namespace {

// A directory of this process's own, in /dev/shm (else /tmp).
const std::string& scratch_dir() {
  static const std::string dir = [] {
    const std::string d = std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/fsdp_fuzz_model_" +
                          std::to_string(::getpid());
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  return dir;
}

std::string put(const std::string& name, const std::string& text) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

void quant_state(const std::string& text) {
  std::map<std::string, at::Tensor> tensors;
  const std::string name = "w";
  tensors[name] = at::zeros({128, 1}, at::kByte);
  tensors[name + ".absmax"] = at::zeros({4}, at::kByte);
  tensors[name + ".quant_map"] =
      at::tensor(std::vector<float>(fsdp::shard::nf4_code().begin(), fsdp::shard::nf4_code().end()));
  tensors[name + ".nested_absmax"] = at::ones({1}, at::kFloat);
  tensors[name + ".nested_quant_map"] = fsdp::shard::dynamic_map_signed();
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  if (!text.empty()) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  tensors[name + ".quant_state.bitsandbytes__nf4"] = bytes;
  auto weight = fsdp::checkpoint::read_bnb_4bit(
      "fuzz", name, {4, 64}, [&](const std::string& t) { return tensors.count(t) > 0; },
      [&](const std::string& t) { return tensors.at(t); });
  if (weight) (void)fsdp::shard::dequantize_nf4(weight->weight, at::kFloat);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 5) {
      case 0: quant_state(text); break;
      case 1: (void)fsdp::checkpoint::read_hf_config(put("config.json", text)); break;
      case 2:
        put("adapter_config.json", text);
        (void)fsdp::checkpoint::read_peft_adapter_config(scratch_dir());
        break;
      case 3:
        put("model.safetensors.index.json", text);
        (void)fsdp::checkpoint::stored_weights_dtype(scratch_dir());
        break;
      case 4: {
        const size_t split = text.find('\0');
        const std::string vocab = put("vocab.json", text.substr(0, split));
        const std::string merges = put("merges.txt", split == std::string::npos ? "" : text.substr(split + 1));
        fsdp::data::Gpt2BpeTokenizer tokenizer(vocab, merges);
        (void)tokenizer.decode(tokenizer.encode("Hello, world! <|endoftext|> caf\xc3\xa9 12345"));
        break;
      }
    }
  } catch (const std::exception&) {
  }
  ::unlink((scratch_dir() + "/model.safetensors.index.json").c_str());  // case 3 only, each time
  return 0;
}
