// Mistral's family spec: its sizes, [model] fields and config.json; the rest is the decoder's
// (decoder_family.h).
#include <nlohmann/json.hpp>

#include "decoder_family.h"

namespace fsdp::models {

namespace {

MistralConfig mistral_shape(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                            int64_t context, double theta, int64_t window) {
  MistralConfig c = decoder_shape<MistralConfig>(layers, dim, heads, kv_heads, ffn, vocab, context, theta, false);
  c.sliding_window = window;
  return c;
}

class MistralFamily final : public DecoderFamily<MistralConfig> {
 public:
  const char* name() const override { return "mistral"; }
  const char* display_name() const override { return "Mistral"; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    // mistral-test's window (8) is shorter than the rows the tests train on (16), so it matters.
    MistralConfig nemo = mistral_shape(40, 5120, 32, 8, 14336, 131072, 1024000, 1000000.0, 0);
    nemo.head_dim = 128;
    return {
        {"mistral-test", mistral_shape(2, 32, 4, 2, 64, 256, 64, 10000.0, 8)},
        // Published shapes (the hub's config.json of mistralai/*).
        {"mistral-7b", mistral_shape(32, 4096, 32, 8, 14336, 32000, 32768, 10000.0, 4096)},      // v0.1
        {"mistral-7b-v0.3", mistral_shape(32, 4096, 32, 8, 14336, 32768, 32768, 1000000.0, 0)},  // no window
        {"mistral-nemo-12b", nemo},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override {
    std::vector<ModelField> fields = decoder_fields(of(config));
    fields.push_back(head_dim_field(of(config)));
    fields.push_back(sliding_window_field(of(config)));
    return fields;
  }

  std::vector<std::string> hf_model_types() const override { return {"mistral"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override {
    MistralConfig c;
    read_decoder_hf_config(r, c);
    c.sliding_window = r.integer_or("sliding_window", 0);  // null: every earlier position
    r.require_value("attention_bias", false, "the Mistral projections here have no biases");
    return c;
  }
  void write_hf_config(const ModelConfig& config, const nlohmann::json&, nlohmann::json& out) const override {
    out["architectures"] = {"MistralForCausalLM"};
    out.update(decoder_hf_config(of(config)));
    out["model_type"] = "mistral";
    if (of(config).sliding_window > 0) {
      out["sliding_window"] = of(config).sliding_window;
    } else {
      out["sliding_window"] = nullptr;
    }
  }
};

}  // namespace

const ModelFamily& MistralConfig::family() {
  static const MistralFamily family;
  return family;
}

}  // namespace fsdp::models
