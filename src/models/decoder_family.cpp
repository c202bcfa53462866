// The parts of the decoder families' specs they share (decoder_family.h): the [model] fields and
// the config.json keys of Llama's decoder.
#include "decoder_family.h"

namespace fsdp::models {

std::vector<ModelField> decoder_fields(LlamaConfig& c) {
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

ModelField head_dim_field(LlamaConfig& c) {
  return field("head_dim", c.head_dim, "width of each attention head; 0 = dim / heads");
}

ModelField sliding_window_field(LlamaConfig& c) {
  return field("sliding_window", c.sliding_window,
               "attention sees the latest this many positions, itself included; 0 = all earlier ones");
}

void read_decoder_hf_config(const HfConfigReader& r, LlamaConfig& c) {
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
  // head_dim: 0 where it is dim / heads, so that a config reads back as it was written.
  c.head_dim = r.has("head_dim") && c.heads > 0 && r.integer("head_dim") * c.heads != c.dim ? r.integer("head_dim") : 0;
  r.require_value("hidden_act", "silu", "the MLP here is SwiGLU");
}

nlohmann::json decoder_hf_config(const LlamaConfig& l) {
  nlohmann::json out = nlohmann::json::object();
  out["vocab_size"] = l.vocab;
  out["hidden_size"] = l.dim;
  out["intermediate_size"] = l.ffn_hidden;
  out["num_hidden_layers"] = l.layers;
  out["num_attention_heads"] = l.heads;
  out["num_key_value_heads"] = l.kv_heads;
  out["head_dim"] = l.head_size();
  out["max_position_embeddings"] = l.context;
  out["rms_norm_eps"] = l.norm_eps;
  out["rope_theta"] = l.rope_theta;
  out["tie_word_embeddings"] = l.tie_embeddings;
  out["hidden_act"] = "silu";
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

void refuse_layer_sliding_window(const HfConfigReader& r) {
  if (r.boolean_or("use_sliding_window", false)) {
    r.fail(
        "use_sliding_window true (sliding-window attention on the layers from max_window_layers on) is not "
        "supported: every layer here attends to all earlier positions");
  }
  if (!r.has("layer_types")) return;
  const nlohmann::json& types = r.json().at("layer_types");
  if (!types.is_array()) r.fail("layer_types must be a list, got " + types.dump());
  for (const auto& type : types) {
    if (type != "full_attention")
      r.fail("layer_types holds " + type.dump() + ": only \"full_attention\" layers are supported");
  }
}

}  // namespace fsdp::models
