// Qwen2's family spec (Qwen2, Qwen2.5): its sizes, [model] fields and config.json; the rest is the
// decoder's (decoder_family.h).
#include <nlohmann/json.hpp>

#include "decoder_family.h"

namespace fsdp::models {

namespace {

Qwen2Config qwen2_shape(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                        int64_t context, bool tied) {
  return decoder_shape<Qwen2Config>(layers, dim, heads, kv_heads, ffn, vocab, context, 1000000.0, tied);
}

class Qwen2Family final : public DecoderFamily<Qwen2Config> {
 public:
  const char* name() const override { return "qwen2"; }
  const char* display_name() const override { return "Qwen2"; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    return {
        {"qwen2-test", qwen2_shape(2, 32, 4, 2, 64, 256, 64, false)},
        // Published Qwen2.5 shapes (the hub's config.json of Qwen/Qwen2.5-*; context as the base models').
        {"qwen2.5-0.5b", qwen2_shape(24, 896, 14, 2, 4864, 151936, 32768, true)},
        {"qwen2.5-1.5b", qwen2_shape(28, 1536, 12, 2, 8960, 151936, 131072, true)},
        {"qwen2.5-3b", qwen2_shape(36, 2048, 16, 2, 11008, 151936, 32768, true)},
        {"qwen2.5-7b", qwen2_shape(28, 3584, 28, 4, 18944, 152064, 131072, false)},
        {"qwen2.5-14b", qwen2_shape(48, 5120, 40, 8, 13824, 152064, 131072, false)},
        {"qwen2.5-32b", qwen2_shape(64, 5120, 40, 8, 27648, 152064, 131072, false)},
        {"qwen2.5-72b", qwen2_shape(80, 8192, 64, 8, 29568, 152064, 131072, false)},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override {
    std::vector<ModelField> fields = decoder_fields(of(config));
    fields.push_back(head_dim_field(of(config)));
    return fields;
  }

  std::vector<std::string> hf_model_types() const override { return {"qwen2"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override {
    Qwen2Config c;
    read_decoder_hf_config(r, c);
    refuse_layer_sliding_window(r);
    return c;
  }
  void write_hf_config(const ModelConfig& config, const nlohmann::json&, nlohmann::json& out) const override {
    out["architectures"] = {"Qwen2ForCausalLM"};
    out.update(decoder_hf_config(of(config)));
    out["model_type"] = "qwen2";
    out["use_sliding_window"] = false;
    out["sliding_window"] = nullptr;
    out["max_window_layers"] = of(config).layers;
  }
};

}  // namespace

const ModelFamily& Qwen2Config::family() {
  static const Qwen2Family family;
  return family;
}

}  // namespace fsdp::models
