// Llama's family spec (Llama 3 and 3.1 / 3.2): its sizes, [model] fields and config.json; the rest
// is the decoder's (decoder_family.h).
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "decoder_family.h"
#include "shared_fields.h"

namespace fsdp::models {

std::vector<ModelField> llama_fields(LlamaConfig& c) { return decoder_fields(c); }

LlamaConfig llama_from_hf_config(const HfConfigReader& r) {
  LlamaConfig c;
  read_decoder_hf_config(r, c);
  r.require_value("attention_bias", false, "the Llama projections here have no biases");
  r.require_value("mlp_bias", false, "the Llama MLP here has no biases");
  if (c.head_dim != 0) {
    r.fail("head_dim " + std::to_string(c.head_dim) +
           " differs from hidden_size / num_attention_heads = " + std::to_string(c.dim / c.heads) + " (not supported)");
  }
  return c;
}

nlohmann::json llama_hf_config(const LlamaConfig& l) {
  nlohmann::json out = decoder_hf_config(l);
  out["model_type"] = "llama";
  out["attention_bias"] = false;
  out["mlp_bias"] = false;
  return out;
}

LlamaConfig llama_shape(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                        int64_t context, double theta, bool tied) {
  return decoder_shape<LlamaConfig>(layers, dim, heads, kv_heads, ffn, vocab, context, theta, tied);
}

namespace {

class LlamaFamily final : public DecoderFamily<LlamaConfig> {
 public:
  const char* name() const override { return "llama"; }
  const char* display_name() const override { return "Llama"; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    return {
        {"llama-test", llama_shape(2, 32, 4, 2, 64, 256, 64, 10000.0, false)},
        {"llama-tiny", llama_shape(4, 128, 4, 2, 352, 256, 256, 10000.0, false)},
        {"llama-small", llama_shape(8, 256, 8, 4, 688, 256, 512, 10000.0, false)},
        // Published Llama 3 shapes (Meta's params.json / Hugging Face configs).
        {"llama3-1b", llama_shape(16, 2048, 32, 8, 8192, 128256, 8192, 500000.0, true)},
        {"llama3-8b", llama_shape(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0, false)},
        {"llama3-70b", llama_shape(80, 8192, 64, 8, 28672, 128256, 8192, 500000.0, false)},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override { return llama_fields(of(config)); }

  std::vector<std::string> hf_model_types() const override { return {"llama"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override { return llama_from_hf_config(r); }
  void write_hf_config(const ModelConfig& config, const nlohmann::json&, nlohmann::json& out) const override {
    out["architectures"] = {"LlamaForCausalLM"};
    out.update(llama_hf_config(of(config)));
  }
};

}  // namespace

const ModelFamily& LlamaConfig::family() {
  static const LlamaFamily family;
  return family;
}

}  // namespace fsdp::models
