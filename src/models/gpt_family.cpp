// GPT-2's family spec: its sizes, [model] fields, units and entry points (model_family.h).
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "fsdp/models/hf_config_reader.h"
#include "fsdp/models/model_family.h"
#include "language_model_entry_points.h"
#include "plan_formulas.h"

namespace fsdp::models {

namespace {

GptConfig gpt(int64_t layers, int64_t dim, int64_t heads, int64_t vocab, int64_t context) {
  GptConfig c;
  c.layers = layers;
  c.dim = dim;
  c.heads = heads;
  c.vocab = vocab;
  c.context = context;
  return c;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class GptFamily final : public FamilyOf<GptConfig> {
 public:
  const char* name() const override { return "gpt"; }
  const char* display_name() const override { return "GPT-2"; }
  ModelTask task() const override { return ModelTask::Language; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    return {
        // Small sizes for tests and this CPU machine (byte vocabulary).
        {"gpt-test", gpt(2, 32, 2, 256, 64)},
        {"gpt-tiny", gpt(4, 128, 4, 256, 256)},
        {"gpt-mini", gpt(6, 256, 8, 256, 512)},
        // Published GPT-2 shapes (Radford et al. 2019; Hugging Face configs).
        {"gpt2", gpt(12, 768, 12, 50257, 1024)},
        {"gpt2-medium", gpt(24, 1024, 16, 50257, 1024)},
        {"gpt2-large", gpt(36, 1280, 20, 50257, 1024)},
        {"gpt2-xl", gpt(48, 1600, 25, 50257, 1024)},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override {
    GptConfig& c = of(config);
    ModelField dropout = field("dropout", c.dropout, "dropout after attention, MLP and embeddings (0: off)");
    dropout.free_beside_hf_config = true;
    return {
        field("vocab", c.vocab, "embedding rows; 0 = the tokenizer's, else at least it"),
        field("context", c.context, "longest sequence (GPT-2: rows of the position embedding)"),
        field("dim", c.dim, "width of the residual stream"),
        field("heads", c.heads, "attention heads"),
        field("layers", c.layers, "transformer blocks"),
        field("mlp_hidden", c.mlp_hidden, "MLP width (GPT: 0 = 4 x dim)"),
        dropout,
        field("qkv_bias", c.qkv_bias, "biases on the Linear layers"),
        field("norm_eps", c.norm_eps, "epsilon of the norms (LayerNorm, RMSNorm)"),
    };
  }
  BuiltModel build(const ModelConfig& config) const override {
    return language_model_entry_points(std::make_shared<GptImpl>(of(config)));
  }
  int64_t vocab_size(const ModelConfig& config) const override { return of(config).vocab; }
  int64_t text_context(const ModelConfig& config) const override { return of(config).context; }
  double flops_per_sample(const ModelConfig& config, int64_t seq) const override {
    return of(config).flops_per_token(seq);
  }
  void take_data_vocab(ModelConfig& config, int64_t rows) const override { of(config).vocab = rows; }
  std::optional<AttentionCall> attention_call(const ModelConfig& config, int64_t tokens) const override {
    const GptConfig& c = of(config);
    AttentionCall call;
    call.heads = call.kv_heads = c.heads;
    call.head_dim = c.dim / c.heads;
    call.tokens = tokens;
    return call;
  }
  // GPT-2 was trained on 1024-token rows.
  int64_t plan_sequence(const ModelConfig& config) const override {
    return std::min<int64_t>(of(config).context, 1024);
  }
  std::vector<std::string> block_type_names(const ModelConfig&) const override { return {"GptBlock"}; }
  // The tied embedding and head: one module called twice.
  std::vector<std::string> embedding_and_head_paths(const ModelConfig&) const override { return {"wte"}; }
  LoraSpec* lora(ModelConfig& config) const override { return &of(config).lora; }
  std::vector<std::string> linear_layers(const ModelConfig&) const override { return GptConfig::linear_layers(); }
  int64_t linear_weight_count(const ModelConfig& config) const override { return of(config).linear_weight_count(); }

  // GPT2LMHeadModel: its names are ours; its Conv1D layers store [in, out].
  std::vector<std::string> hf_model_types() const override { return {"gpt2"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override {
    GptConfig c;
    c.vocab = r.integer("vocab_size");
    c.dim = r.integer("n_embd");
    c.layers = r.integer("n_layer");
    c.heads = r.integer("n_head");
    c.context = r.integer_or("n_positions", 1024);
    c.dropout = 0.0;  // fine-tuning; attn_pdrop and friends are pretraining's (model.dropout sets it)
    c.qkv_bias = true;
    // n_inner null (or absent) is 4 x n_embd, as transformers reads it.
    c.mlp_hidden = r.integer_or("n_inner", 0);
    if (c.mlp_hidden < 0) r.fail("n_inner must be positive or null, got " + std::to_string(c.mlp_hidden));
    r.require_value("activation_function", "gelu_new", "the GPT-2 MLP here uses GELU's tanh approximation");
    c.norm_eps = r.number_or("layer_norm_epsilon", 1e-5);
    if (!(c.norm_eps > 0.0)) r.fail("layer_norm_epsilon must be positive, got " + std::to_string(c.norm_eps));
    r.require_value("scale_attn_weights", true, "attention scores here are scaled by 1/sqrt(head_dim)");
    r.require_value("scale_attn_by_inverse_layer_idx", false, "not implemented");
    r.require_value("add_cross_attention", false, "a decoder-only GPT-2 here");
    r.require_value("tie_word_embeddings", true, "the GPT-2 head here is tied to wte");
    return c;
  }
  void write_hf_config(const ModelConfig& config, const nlohmann::json&, nlohmann::json& out) const override {
    const GptConfig& g = of(config);
    if (!g.qkv_bias) throw std::invalid_argument("hf_config_json: GPT-2 without biases has no Hugging Face config");
    out["architectures"] = {"GPT2LMHeadModel"};
    out["model_type"] = "gpt2";
    out["vocab_size"] = g.vocab;
    out["n_embd"] = g.dim;
    out["n_layer"] = g.layers;
    out["n_head"] = g.heads;
    out["n_positions"] = g.context;
    if (g.mlp_hidden > 0) out["n_inner"] = g.mlp_hidden;
    else out["n_inner"] = nullptr;
    out["activation_function"] = "gelu_new";
    out["layer_norm_epsilon"] = g.norm_eps;
    out["attn_pdrop"] = g.dropout;
    out["embd_pdrop"] = g.dropout;
    out["resid_pdrop"] = g.dropout;
    out["tie_word_embeddings"] = true;
  }
  bool hf_transposed(const ModelConfig&, const std::string& name) const override {
    return ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_proj.weight") ||
           ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_proj.weight");
  }
  // GPT2LMHeadModel.save_pretrained prefixes the body with "transformer."; the hub's gpt2 files
  // do not. Both load.
  std::vector<std::string> hf_other_names(const ModelConfig&, const std::string& hf) const override {
    return {"transformer." + hf};
  }
  bool hf_unread_buffer(const std::string& name) const override {
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
  }
  std::string peft_body_prefix() const override { return "transformer."; }
  bool peft_fan_in_fan_out() const override { return true; }  // the Conv1D layers store their weights transposed

  // One tied unit: the embedding is the head.
  PlanUnits plan_units(const ModelConfig& config) const override {
    const GptConfig& c = of(config);
    const int64_t block = one_block_params(c);
    return {c.layers, block, c.layers * block, c.vocab * c.dim, 0, true};
  }
  int64_t plan_adapter_params(const ModelConfig& config) const override { return of(config).lora_parameter_count(); }
  int64_t plan_activation_bytes(const ModelConfig& config, const ActivationSettings& s) const override {
    const GptConfig& c = of(config);
    const int64_t block = layer_norm_block_activation_bytes(c.dim, c.heads, c.mlp_width(), s.seq_len, s);
    const int64_t head = language_head_activation_bytes(c.dim, c.vocab, s.micro_batch * s.seq_len, s);
    return block_stack_activation_bytes(c.layers, c.dim, s.seq_len, block, head, s);
  }
  int64_t largest_module_params(const ModelConfig& config) const override {
    const GptConfig& c = of(config);
    return std::max(c.vocab * c.dim, c.dim * c.mlp_width() + c.mlp_width());
  }
};

}  // namespace

const ModelFamily& GptConfig::family() {
  static const GptFamily family;
  return family;
}

}  // namespace fsdp::models
