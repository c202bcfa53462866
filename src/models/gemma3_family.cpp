// Gemma 3's family spec (the text model, Gemma3ForCausalLM): its sizes, [model] fields, units,
// config.json and planner terms.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "fsdp/models/model_family.h"
#include "language_model_entry_points.h"
#include "plan_formulas.h"

namespace fsdp::models {

namespace {

Gemma3Config gemma3_shape(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t ffn,
                          int64_t vocab, int64_t context, int64_t window, int64_t query_pre_attn_scalar,
                          double linear_factor) {
  Gemma3Config c;
  c.layers = layers;
  c.dim = dim;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.ffn_hidden = ffn;
  c.vocab = vocab;
  c.context = context;
  c.sliding_window = window;
  c.query_pre_attn_scalar = query_pre_attn_scalar;
  c.rope_linear_factor = linear_factor;
  return c;
}

// The global layers' rope: tf5's rope_parameters.full_attention, or the hub's rope_theta and
// rope_scaling; the local layers': rope_parameters.sliding_attention or rope_local_base_freq. Types
// "default" and "linear" (the 4B-27B models' factor 8 on the global layers).
void read_gemma_rope(const HfConfigReader& r, Gemma3Config& c) {
  c.rope_theta = r.number_or("rope_theta", c.rope_theta);
  c.rope_local_theta = r.number_or("rope_local_base_freq", c.rope_local_theta);
  auto read_type = [&](const nlohmann::json& rope, const std::string& where, double& theta, double* factor) {
    if (!rope.is_object()) r.fail(where + " must be an object, got " + rope.dump());
    HfConfigReader inner(rope, r.file() + " (" + where + ")");
    theta = inner.number_or("rope_theta", theta);
    const std::string type = inner.string_or("rope_type", inner.string_or("type", "default"));
    if (type == "default") return;
    if (type != "linear" || factor == nullptr)
      r.fail(where + ".rope_type '" + type + "' is not supported (supported: default" + (factor ? ", linear)" : ")"));
    *factor = inner.number_or("factor", 1.0);
  };
  if (r.has("rope_scaling"))
    read_type(r.json().at("rope_scaling"), "rope_scaling", c.rope_theta, &c.rope_linear_factor);
  if (r.has("rope_parameters")) {
    const nlohmann::json& rope = r.json().at("rope_parameters");
    if (!rope.is_object()) r.fail("rope_parameters must be an object, got " + rope.dump());
    if (rope.contains("full_attention") && !rope.at("full_attention").is_null())
      read_type(rope.at("full_attention"), "rope_parameters.full_attention", c.rope_theta, &c.rope_linear_factor);
    if (rope.contains("sliding_attention") && !rope.at("sliding_attention").is_null())
      read_type(rope.at("sliding_attention"), "rope_parameters.sliding_attention", c.rope_local_theta, nullptr);
  }
}

Gemma3Config gemma3_from_hf_config(const HfConfigReader& r) {
  Gemma3Config c;
  c.vocab = r.integer("vocab_size");
  c.dim = r.integer("hidden_size");
  c.ffn_hidden = r.integer("intermediate_size");
  c.layers = r.integer("num_hidden_layers");
  c.heads = r.integer("num_attention_heads");
  c.kv_heads = r.integer_or("num_key_value_heads", c.heads);
  c.head_dim = r.integer_or("head_dim", 256);
  c.context = r.integer_or("max_position_embeddings", 131072);
  c.norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.query_pre_attn_scalar = r.integer_or("query_pre_attn_scalar", 256);
  c.sliding_window = r.integer_or("sliding_window", 4096);
  c.sliding_window_pattern = r.integer_or("sliding_window_pattern", 6);
  read_gemma_rope(r, c);
  r.require_value("hidden_activation", "gelu_pytorch_tanh",
                  "the Gemma 3 MLP here is GeGLU with tanh-approximated GELU");
  r.require_value("tie_word_embeddings", true, "the Gemma 3 head here is the embedding");
  r.require_value("attention_bias", false, "the Gemma 3 projections here have no biases");
  r.require_value("final_logit_softcapping", nullptr, "Gemma 3 has none (Gemma 2's soft-capping is not implemented)");
  r.require_value("attn_logit_softcapping", nullptr, "Gemma 3 has none (Gemma 2's soft-capping is not implemented)");
  r.require_value("use_bidirectional_attention", false, "attention here is causal");
  if (r.has("layer_types")) {
    // transformers writes the layer types out; they must be the pattern's (every k-th global).
    const nlohmann::json& types = r.json().at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.layers)
      r.fail("layer_types must list num_hidden_layers entries, got " + types.dump());
    int64_t first_global = 0;
    while (first_global < c.layers && types[first_global] == "sliding_attention") ++first_global;
    if (first_global < c.layers) c.sliding_window_pattern = first_global + 1;
    for (int64_t i = 0; i < c.layers; ++i) {
      const char* expected = c.is_global_layer(i) ? "full_attention" : "sliding_attention";
      if (types[i] != expected) {
        r.fail("layer_types[" + std::to_string(i) + "] is " + types[i].dump() + ": only every " +
               std::to_string(c.sliding_window_pattern) + "-th layer global (sliding_window_pattern) is supported");
      }
    }
  }
  return c;
}

class Gemma3Family final : public FamilyOf<Gemma3Config> {
 public:
  const char* name() const override { return "gemma3"; }
  const char* display_name() const override { return "Gemma 3"; }
  ModelTask task() const override { return ModelTask::Language; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    // gemma3-test: three layers (local, global, local), a window of 8 under 16-token rows, heads
    // 16 wide beside 32 / 4, query_pre_attn_scalar 24 (not head_dim), linear rope factor 2.
    Gemma3Config test = gemma3_shape(3, 32, 4, 2, 16, 64, 256, 64, 8, 24, 2.0);
    test.sliding_window_pattern = 2;
    return {
        {"gemma3-test", test},
        // Gemma 3's published text shapes (the hub's config.json of google/gemma-3-*).
        {"gemma3-1b", gemma3_shape(26, 1152, 4, 1, 256, 6912, 262144, 32768, 512, 256, 1.0)},
        {"gemma3-4b", gemma3_shape(34, 2560, 8, 4, 256, 10240, 262208, 131072, 1024, 256, 8.0)},
        {"gemma3-12b", gemma3_shape(48, 3840, 16, 8, 256, 15360, 262208, 131072, 1024, 256, 8.0)},
        {"gemma3-27b", gemma3_shape(62, 5376, 32, 16, 128, 21504, 262208, 131072, 1024, 168, 8.0)},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override {
    Gemma3Config& c = of(config);
    ModelField context = field("context", c.context, "longest sequence");
    context.free_beside_hf_config = true;
    return {
        field("vocab", c.vocab, "embedding rows; 0 = the tokenizer's, else at least it"),
        context,
        field("dim", c.dim, "width of the residual stream"),
        field("heads", c.heads, "attention heads"),
        field("kv_heads", c.kv_heads, "key/value heads (grouped-query attention)"),
        field("head_dim", c.head_dim, "width of each attention head"),
        field("layers", c.layers, "transformer blocks"),
        field("ffn_hidden", c.ffn_hidden, "GeGLU width"),
        field("norm_eps", c.norm_eps, "epsilon of the norms (LayerNorm, RMSNorm)"),
        field("query_pre_attn_scalar", c.query_pre_attn_scalar, "attention scores are divided by its square root"),
        field("sliding_window", c.sliding_window,
              "attention sees the latest this many positions, itself included; 0 = all earlier ones"),
        field("sliding_window_pattern", c.sliding_window_pattern,
              "every this-many-th layer is global (full attention)"),
        field("rope_theta", c.rope_theta, "rotary base"),
        field("rope_local_theta", c.rope_local_theta, "rotary base of the local (sliding-window) layers"),
        field("rope_linear_factor", c.rope_linear_factor, "linear rope scaling of the global layers; 1 = none"),
    };
  }
  BuiltModel build(const ModelConfig& config) const override {
    return language_model_entry_points(std::make_shared<Gemma3Impl>(of(config)));
  }
  int64_t vocab_size(const ModelConfig& config) const override { return of(config).vocab; }
  int64_t text_context(const ModelConfig& config) const override { return of(config).context; }
  double flops_per_sample(const ModelConfig& config, int64_t seq) const override {
    return of(config).flops_per_token(seq);
  }
  void take_data_vocab(ModelConfig& config, int64_t rows) const override { of(config).vocab = rows; }
  int64_t plan_sequence(const ModelConfig& config) const override {
    return std::min<int64_t>(of(config).context, 4096);
  }
  // Most layers are local: their sliding window masks a sample longer than it.
  std::optional<AttentionCall> attention_call(const ModelConfig& config, int64_t tokens) const override {
    const Gemma3Config& c = of(config);
    AttentionCall call;
    call.heads = c.heads;
    call.kv_heads = c.kv_heads;
    call.head_dim = c.head_dim;
    call.tokens = tokens;
    call.masked = tokens > c.sliding_window;
    return call;
  }
  std::vector<std::string> block_type_names(const ModelConfig&) const override { return {"Gemma3Block"}; }
  std::vector<std::string> embedding_and_head_paths(const ModelConfig&) const override { return {"embed_tokens"}; }
  LoraSpec* lora(ModelConfig& config) const override { return &of(config).lora; }
  std::vector<std::string> linear_layers(const ModelConfig&) const override { return Gemma3Config::linear_layers(); }
  int64_t linear_weight_count(const ModelConfig& config) const override { return of(config).linear_weight_count(); }

  // Gemma3ForCausalLM: the body under "model.", the head tied (not in the files).
  std::vector<std::string> hf_model_types() const override { return {"gemma3_text"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override { return gemma3_from_hf_config(r); }
  void write_hf_config(const ModelConfig& config, const nlohmann::json&, nlohmann::json& out) const override {
    const Gemma3Config& c = of(config);
    out["architectures"] = {"Gemma3ForCausalLM"};
    out["model_type"] = "gemma3_text";
    out["vocab_size"] = c.vocab;
    out["hidden_size"] = c.dim;
    out["intermediate_size"] = c.ffn_hidden;
    out["num_hidden_layers"] = c.layers;
    out["num_attention_heads"] = c.heads;
    out["num_key_value_heads"] = c.kv_heads;
    out["head_dim"] = c.head_dim;
    out["max_position_embeddings"] = c.context;
    out["rms_norm_eps"] = c.norm_eps;
    out["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
    out["sliding_window"] = c.sliding_window;
    out["sliding_window_pattern"] = c.sliding_window_pattern;
    nlohmann::json types = nlohmann::json::array();
    for (int64_t i = 0; i < c.layers; ++i)
      types.push_back(c.is_global_layer(i) ? "full_attention" : "sliding_attention");
    out["layer_types"] = types;
    nlohmann::json global = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
    if (c.rope_linear_factor != 1.0)
      global = {{"rope_type", "linear"}, {"rope_theta", c.rope_theta}, {"factor", c.rope_linear_factor}};
    out["rope_parameters"] = {{"full_attention", global},
                              {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", c.rope_local_theta}}}};
    out["hidden_activation"] = "gelu_pytorch_tanh";
    out["tie_word_embeddings"] = true;
    out["attention_bias"] = false;
    out["final_logit_softcapping"] = nullptr;
    out["attn_logit_softcapping"] = nullptr;
  }
  std::string hf_name(const ModelConfig&, const std::string& name) const override { return "model." + name; }

  PlanUnits plan_units(const ModelConfig& config) const override {
    const Gemma3Config& c = of(config);
    const int64_t block = one_block_params(c);
    return {c.layers, block, c.layers * block, c.vocab * c.dim, 0, true};
  }
  int64_t plan_adapter_params(const ModelConfig& config) const override { return of(config).lora_parameter_count(); }
  // A block for one sample of t tokens. Each of the six RMSNorms (composed, in fp32) keeps its
  // input in fp32 and its fp32 normalised product (8 bytes a channel); the two whose output a
  // projection reads, that output in the compute dtype too (input_layernorm, pre_feedforward: 2 x
  // (8 + c) d; the two after the attention and the MLP: 2 x 8 d; q_norm and k_norm: 8 (q + kv)).
  // The attention (attention_activation_bytes: q scaled after rotary, k, v, the output);
  // the GeGLU's gate, GELU(gate), up and their product (4 ffn). A local layer's softmax terms are
  // those of its window, counted as a global one's. Measured against gemma3-test's block, every
  // way it computes, in tests/unit/block_activation_tests.cpp.
  int64_t plan_activation_bytes(const ModelConfig& config, const ActivationSettings& s) const override {
    const Gemma3Config& c = of(config);
    const int64_t t = s.seq_len, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim, b = s.compute_bytes;
    const int64_t norms = (2 * (8 + b) + 2 * 8) * c.dim + 8 * (q + kv);
    const int64_t block = t * (norms + 4 * b * c.ffn_hidden) + attention_activation_bytes(c.heads, q, kv, t, s);
    const int64_t head = language_head_activation_bytes(c.dim, c.vocab, s.micro_batch * t, s);
    return block_stack_activation_bytes(c.layers, c.dim, t, block, head, s);
  }
  int64_t largest_module_params(const ModelConfig& config) const override {
    const Gemma3Config& c = of(config);
    return std::max(c.vocab * c.dim, c.dim * c.ffn_hidden);
  }
};

}  // namespace

const ModelFamily& Gemma3Config::family() {
  static const Gemma3Family family;
  return family;
}

}  // namespace fsdp::models
