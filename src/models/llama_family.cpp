// Llama's family spec (Llama 3 and 3.1 / 3.2): its sizes, [model] fields, units and entry points.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "fsdp/models/model_family.h"
#include "language_model_entry_points.h"
#include "plan_formulas.h"
#include "shared_fields.h"

namespace fsdp::models {

std::vector<ModelField> llama_fields(LlamaConfig& c) {
  ModelField context = field("context", c.context, "longest sequence");
  context.free_beside_hf_config = true;  // a fine-tune may train on shorter rows than config.json allows
  ModelField scaling =
      field("rope_scaling", c.rope_scaling.enabled, "llama3 (Llama 3.1's long-context frequency scaling) | none");
  scaling.on_word = "llama3";
  scaling.off_word = "none";
  std::vector<ModelField> fields = {
      field("vocab", c.vocab, "embedding rows; 0 = the tokenizer's, else at least it"),
      context,
      field("dim", c.dim, "width of the residual stream"),
      field("heads", c.heads, "attention heads"),
      field("kv_heads", c.kv_heads, "key/value heads (grouped-query attention)"),
      field("layers", c.layers, "transformer blocks"),
      field("ffn_hidden", c.ffn_hidden, "SwiGLU width"),
      field("norm_eps", c.norm_eps, "epsilon of the norms (LayerNorm, RMSNorm)"),
      field("tie_embeddings", c.tie_embeddings, "output head tied to the token embedding"),
      field("rope_theta", c.rope_theta, "rotary base"),
      scaling,
  };
  for (ModelField scaled :
       {field("rope_scaling_factor", c.rope_scaling.factor, "llama3 scaling: factor"),
        field("rope_low_freq_factor", c.rope_scaling.low_freq_factor, "llama3 scaling: low_freq_factor"),
        field("rope_high_freq_factor", c.rope_scaling.high_freq_factor, "llama3 scaling: high_freq_factor"),
        field("rope_original_context", c.rope_scaling.original_context,
              "llama3 scaling: original_max_position_embeddings")}) {
    scaled.written = c.rope_scaling.enabled;
    fields.push_back(scaled);
  }
  return fields;
}

namespace {

// Two spellings: the hub's "rope_scaling" (transformers 4) and transformers 5's "rope_parameters",
// which also carries rope_theta. "type" is the older name of "rope_type".
RopeScaling read_rope_scaling(const HfConfigReader& r) {
  RopeScaling scaling;
  const char* key = r.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (!r.has(key)) return scaling;
  const nlohmann::json& rope = r.json().at(key);
  if (!rope.is_object()) r.fail(std::string(key) + " must be an object, got " + rope.dump());
  HfConfigReader inner(rope, r.file() + " (" + key + ")");
  const std::string type = inner.string_or("rope_type", inner.string_or("type", "default"));
  if (type == "default") return scaling;
  if (type != "llama3")
    r.fail(std::string(key) + ".rope_type '" + type + "' is not supported (supported: default, llama3)");
  scaling.enabled = true;
  scaling.factor = inner.number_or("factor", scaling.factor);
  scaling.low_freq_factor = inner.number_or("low_freq_factor", scaling.low_freq_factor);
  scaling.high_freq_factor = inner.number_or("high_freq_factor", scaling.high_freq_factor);
  scaling.original_context = inner.integer_or("original_max_position_embeddings", scaling.original_context);
  return scaling;
}

}  // namespace

LlamaConfig llama_from_hf_config(const HfConfigReader& r) {
  LlamaConfig c;
  c.vocab = r.integer("vocab_size");
  c.dim = r.integer("hidden_size");
  c.ffn_hidden = r.integer("intermediate_size");
  c.layers = r.integer("num_hidden_layers");
  c.heads = r.integer("num_attention_heads");
  c.kv_heads = r.integer_or("num_key_value_heads", c.heads);
  c.context = r.integer_or("max_position_embeddings", 2048);
  c.norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  double theta = r.number_or("rope_theta", 10000.0);
  if (r.json().contains("rope_parameters") && r.json().at("rope_parameters").is_object()) {
    theta =
        HfConfigReader(r.json().at("rope_parameters"), r.file() + " (rope_parameters)").number_or("rope_theta", theta);
  }
  c.rope_theta = theta;
  c.rope_scaling = read_rope_scaling(r);
  r.require_value("hidden_act", "silu", "the Llama MLP here is SwiGLU");
  r.require_value("attention_bias", false, "the Llama projections here have no biases");
  r.require_value("mlp_bias", false, "the Llama MLP here has no biases");
  if (r.has("head_dim") && c.heads > 0 && r.integer("head_dim") * c.heads != c.dim) {
    r.fail("head_dim " + std::to_string(r.integer("head_dim")) +
           " differs from hidden_size / num_attention_heads = " + std::to_string(c.dim / c.heads) + " (not supported)");
  }
  return c;
}

nlohmann::json llama_hf_config(const LlamaConfig& l) {
  nlohmann::json out = nlohmann::json::object();
  out["model_type"] = "llama";
  out["vocab_size"] = l.vocab;
  out["hidden_size"] = l.dim;
  out["intermediate_size"] = l.ffn_hidden;
  out["num_hidden_layers"] = l.layers;
  out["num_attention_heads"] = l.heads;
  out["num_key_value_heads"] = l.kv_heads;
  out["head_dim"] = l.dim / l.heads;
  out["max_position_embeddings"] = l.context;
  out["rms_norm_eps"] = l.norm_eps;
  out["rope_theta"] = l.rope_theta;
  out["tie_word_embeddings"] = l.tie_embeddings;
  out["hidden_act"] = "silu";
  out["attention_bias"] = false;
  out["mlp_bias"] = false;
  if (l.rope_scaling.enabled) {
    // The hub's spelling, which transformers 4 and 5 both read.
    out["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", l.rope_scaling.factor},
                           {"low_freq_factor", l.rope_scaling.low_freq_factor},
                           {"high_freq_factor", l.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", l.rope_scaling.original_context}};
  } else {
    out["rope_scaling"] = nullptr;
  }
  return out;
}

LlamaConfig llama_shape(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                        int64_t context, double theta, bool tied) {
  LlamaConfig c;
  c.layers = layers;
  c.dim = dim;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn_hidden = ffn;
  c.vocab = vocab;
  c.context = context;
  c.rope_theta = theta;
  c.tie_embeddings = tied;
  return c;
}

namespace {

class LlamaFamily final : public FamilyOf<LlamaConfig> {
 public:
  const char* name() const override { return "llama"; }
  const char* display_name() const override { return "Llama"; }
  ModelTask task() const override { return ModelTask::Language; }
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
  BuiltModel build(const ModelConfig& config) const override {
    return language_model_entry_points(std::make_shared<LlamaImpl>(of(config)));
  }
  int64_t vocab_size(const ModelConfig& config) const override { return of(config).vocab; }
  int64_t text_context(const ModelConfig& config) const override { return of(config).context; }
  double flops_per_sample(const ModelConfig& config, int64_t seq) const override {
    return of(config).flops_per_token(seq);
  }
  void take_data_vocab(ModelConfig& config, int64_t rows) const override { of(config).vocab = rows; }
  // Fine-tuning rows rarely reach Llama 3's 8192 positions.
  int64_t plan_sequence(const ModelConfig& config) const override {
    return std::min<int64_t>(of(config).context, 4096);
  }
  std::vector<std::string> block_type_names(const ModelConfig&) const override { return {"LlamaBlock"}; }
  // A tied embedding and head is one module called twice, so one path.
  std::vector<std::string> embedding_and_head_paths(const ModelConfig& config) const override {
    if (of(config).tie_embeddings) return {"embed_tokens"};
    return {"embed_tokens", "lm_head"};
  }
  LoraSpec* lora(ModelConfig& config) const override { return &of(config).lora; }
  std::vector<std::string> linear_layers(const ModelConfig&) const override { return LlamaConfig::linear_layers(); }
  int64_t linear_weight_count(const ModelConfig& config) const override { return of(config).linear_weight_count(); }

  // LlamaForCausalLM: the body under "model.", the head beside it.
  std::vector<std::string> hf_model_types() const override { return {"llama"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override { return llama_from_hf_config(r); }
  void write_hf_config(const ModelConfig& config, const nlohmann::json&, nlohmann::json& out) const override {
    out["architectures"] = {"LlamaForCausalLM"};
    out.update(llama_hf_config(of(config)));
  }
  std::string hf_name(const ModelConfig&, const std::string& name) const override {
    return name.rfind("lm_head", 0) == 0 ? name : "model." + name;
  }
  bool hf_unread_buffer(const std::string& name) const override {
    const std::string inv_freq = ".rotary_emb.inv_freq";
    return name.size() >= inv_freq.size() &&
           name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
  }

  PlanUnits plan_units(const ModelConfig& config) const override {
    const LlamaConfig& c = of(config);
    LlamaConfig fewer = c;
    fewer.layers = c.layers - 1;
    const int64_t block = c.layers > 0 ? c.parameter_count() - fewer.parameter_count() : 0;
    return {c.layers,        block, c.layers * block, c.vocab * c.dim, c.tie_embeddings ? 0 : c.vocab * c.dim,
            c.tie_embeddings};
  }
  int64_t plan_adapter_params(const ModelConfig& config) const override { return of(config).lora_parameter_count(); }
  // A block for one sample of t tokens: each RMSNorm keeps its input and output (composed: an fp32
  // copy of the input and the normalised output, 2 d; fused: the input and 1/rms per row, 1 d), q
  // and k after rotary (rotary keeps only its tables), keys and values repeated to every query
  // head, the attention output, the SwiGLU's gate and up (the fused op's closed-form backward
  // needs no SiLU(gate); the composed one keeps it too) and their product (3 or 4 ffn).
  int64_t plan_activation_bytes(const ModelConfig& config, const ActivationSettings& s) const override {
    const LlamaConfig& c = of(config);
    const int64_t t = s.seq_len, kv = c.kv_heads * (c.dim / c.heads), norms = s.fused_ops ? 2 : 4;
    const int64_t block = s.compute_bytes * t * ((5 + norms) * c.dim + kv + (s.fused_ops ? 3 : 4) * c.ffn_hidden) +
                          attention_softmax_bytes(c.heads, t, s.compute_bytes, s.fused_attention);
    const int64_t head = language_head_activation_bytes(c.dim, c.vocab, s.micro_batch * t, s);
    return block_stack_activation_bytes(c.layers, c.dim, t, block, head, s);
  }
  int64_t largest_module_params(const ModelConfig& config) const override {
    const LlamaConfig& c = of(config);
    return std::max(c.vocab * c.dim, c.dim * c.ffn_hidden);
  }
};

}  // namespace

const ModelFamily& LlamaConfig::family() {
  static const LlamaFamily family;
  return family;
}

}  // namespace fsdp::models
