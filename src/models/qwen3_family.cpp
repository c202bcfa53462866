// Qwen3's family spec (the dense models): its sizes, [model] fields and config.json; the rest is
// the decoder's (decoder_family.h).
#include <nlohmann/json.hpp>

#include "decoder_family.h"

namespace fsdp::models {

namespace {

Qwen3Config qwen3_shape(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t ffn,
                        int64_t vocab, int64_t context, bool tied) {
  Qwen3Config c = decoder_shape<Qwen3Config>(layers, dim, heads, kv_heads, ffn, vocab, context, 1000000.0, tied);
  c.head_dim = head_dim;
  return c;
}

class Qwen3Family final : public DecoderFamily<Qwen3Config> {
 public:
  const char* name() const override { return "qwen3"; }
  const char* display_name() const override { return "Qwen3"; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    // qwen3-test's heads are 16 wide beside a 32-wide stream of 4 heads, as the real ones are
    // 128 wide beside, e.g., 1024 and 16.
    return {
        {"qwen3-test", qwen3_shape(2, 32, 4, 2, 16, 64, 256, 64, false)},
        // Published Qwen3 shapes (the hub's config.json of Qwen/Qwen3-*).
        {"qwen3-0.6b", qwen3_shape(28, 1024, 16, 8, 128, 3072, 151936, 40960, true)},
        {"qwen3-1.7b", qwen3_shape(28, 2048, 16, 8, 128, 6144, 151936, 40960, true)},
        {"qwen3-4b", qwen3_shape(36, 2560, 32, 8, 128, 9728, 151936, 40960, true)},
        {"qwen3-8b", qwen3_shape(36, 4096, 32, 8, 128, 12288, 151936, 40960, false)},
        {"qwen3-14b", qwen3_shape(40, 5120, 40, 8, 128, 17408, 151936, 40960, false)},
        {"qwen3-32b", qwen3_shape(64, 5120, 64, 8, 128, 25600, 151936, 40960, false)},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override {
    std::vector<ModelField> fields = decoder_fields(of(config));
    fields.push_back(head_dim_field(of(config)));
    return fields;
  }

  std::vector<std::string> hf_model_types() const override { return {"qwen3"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override {
    Qwen3Config c;
    c.head_dim = 0;  // Qwen3Config's own default (128) where config.json gives none
    read_decoder_hf_config(r, c);
    if (!r.has("head_dim") && c.heads > 0 && 128 * c.heads != c.dim) c.head_dim = 128;
    r.require_value("attention_bias", false, "the Qwen3 projections here have no biases");
    refuse_layer_sliding_window(r);
    return c;
  }
  void write_hf_config(const ModelConfig& config, const nlohmann::json&, nlohmann::json& out) const override {
    out["architectures"] = {"Qwen3ForCausalLM"};
    out.update(decoder_hf_config(of(config)));
    out["model_type"] = "qwen3";
    out["attention_bias"] = false;
    out["use_sliding_window"] = false;
    out["sliding_window"] = nullptr;
    out["max_window_layers"] = of(config).layers;
  }
};

}  // namespace

const ModelFamily& Qwen3Config::family() {
  static const Qwen3Family family;
  return family;
}

}  // namespace fsdp::models
