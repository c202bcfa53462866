#include "fsdp/checkpoint/hf_model_dir.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

// Typed reads from one config.json, every failure naming the file and the key.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& json, std::string file) : json_(json), file_(std::move(file)) {}

  bool has(const char* key) const { return json_.contains(key) && !json_.at(key).is_null(); }

  int64_t integer(const char* key) const {
    const auto& value = required(key);
    if (!value.is_number_integer()) fail(std::string(key) + " must be an integer, got " + value.dump());
    return value.get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const auto& value = json_.at(key);
    if (!value.is_number()) fail(std::string(key) + " must be a number, got " + value.dump());
    return value.get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const auto& value = json_.at(key);
    if (!value.is_boolean()) fail(std::string(key) + " must be true or false, got " + value.dump());
    return value.get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const auto& value = json_.at(key);
    if (!value.is_string()) fail(std::string(key) + " must be a string, got " + value.dump());
    return value.get<std::string>();
  }
  // A key whose only supported value is `expected` (where present).
  void require_value(const char* key, const nlohmann::json& expected, const std::string& why) const {
    if (has(key) && json_.at(key) != expected) {
      fail(std::string(key) + " = " + json_.at(key).dump() + " is not supported (" + why + ")");
    }
  }
  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(file_ + ": " + what); }
  const std::string& file() const { return file_; }

 private:
  const nlohmann::json& required(const char* key) const {
    if (!has(key)) fail(std::string("missing key '") + key + "'");
    return json_.at(key);
  }
  const nlohmann::json& json_;
  std::string file_;
};

models::RopeScaling read_rope_scaling(const ConfigReader& reader, const nlohmann::json& json) {
  // Two spellings: the hub's "rope_scaling" (transformers 4) and transformers 5's "rope_parameters",
  // which also carries rope_theta. "type" is the older name of "rope_type".
  models::RopeScaling scaling;
  const char* key = json.contains("rope_scaling") && !json.at("rope_scaling").is_null() ? "rope_scaling" : "rope_parameters";
  if (!json.contains(key) || json.at(key).is_null()) return scaling;
  const nlohmann::json& rope = json.at(key);
  if (!rope.is_object()) reader.fail(std::string(key) + " must be an object, got " + rope.dump());
  ConfigReader inner(rope, reader.file() + " (" + key + ")");
  const std::string type = inner.string_or("rope_type", inner.string_or("type", "default"));
  if (type == "default") return scaling;
  if (type != "llama3") {
    reader.fail(std::string(key) + ".rope_type '" + type + "' is not supported (supported: default, llama3)");
  }
  scaling.enabled = true;
  scaling.factor = inner.number_or("factor", scaling.factor);
  scaling.low_freq_factor = inner.number_or("low_freq_factor", scaling.low_freq_factor);
  scaling.high_freq_factor = inner.number_or("high_freq_factor", scaling.high_freq_factor);
  scaling.original_context = inner.integer_or("original_max_position_embeddings", scaling.original_context);
  return scaling;
}

models::LlamaConfig read_llama(const ConfigReader& r, const nlohmann::json& json) {
  models::LlamaConfig c;
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
  if (json.contains("rope_parameters") && json.at("rope_parameters").is_object()) {
    theta = ConfigReader(json.at("rope_parameters"), r.file() + " (rope_parameters)").number_or("rope_theta", theta);
  }
  c.rope_theta = theta;
  c.rope_scaling = read_rope_scaling(r, json);
  r.require_value("hidden_act", "silu", "the Llama MLP here is SwiGLU");
  r.require_value("attention_bias", false, "the Llama projections here have no biases");
  r.require_value("mlp_bias", false, "the Llama MLP here has no biases");
  if (r.has("head_dim") && c.heads > 0 && r.integer("head_dim") * c.heads != c.dim) {
    r.fail("head_dim " + std::to_string(r.integer("head_dim")) + " differs from hidden_size / num_attention_heads = " +
           std::to_string(c.dim / c.heads) + " (not supported)");
  }
  return c;
}

models::GptConfig read_gpt2(const ConfigReader& r) {
  models::GptConfig c;
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

// CLIPModel's config: text_config and vision_config, each read with transformers' defaults for
// the keys a save may leave out (CLIPTextConfig, CLIPVisionConfig: OpenAI's ViT-B/32).
models::ClipConfig read_clip(const ConfigReader& r, const nlohmann::json& json) {
  auto section = [&](const char* key) {
    if (!json.contains(key) || json.at(key).is_null()) return nlohmann::json::object();
    if (!json.at(key).is_object()) r.fail(std::string(key) + " must be an object, got " + json.at(key).dump());
    return json.at(key);
  };
  const nlohmann::json text_json = section("text_config"), vision_json = section("vision_config");
  const ConfigReader text(text_json, r.file() + " (text_config)"), vision(vision_json, r.file() + " (vision_config)");
  models::ClipConfig c;
  c.projection_dim = r.integer_or("projection_dim", 512);
  c.vocab = text.integer_or("vocab_size", 49408);
  c.context = text.integer_or("max_position_embeddings", 77);
  c.eos_token = text.integer_or("eos_token_id", 49407);
  c.text = {text.integer_or("hidden_size", 512), text.integer_or("num_attention_heads", 8), text.integer_or("num_hidden_layers", 12),
            text.integer_or("intermediate_size", 2048)};
  c.vision = {vision.integer_or("hidden_size", 768), vision.integer_or("num_attention_heads", 12),
              vision.integer_or("num_hidden_layers", 12), vision.integer_or("intermediate_size", 3072)};
  c.image_size = vision.integer_or("image_size", 224);
  c.patch = vision.integer_or("patch_size", 32);
  c.channels = vision.integer_or("num_channels", 3);
  c.norm_eps = text.number_or("layer_norm_eps", 1e-5);
  if (vision.number_or("layer_norm_eps", 1e-5) != c.norm_eps) {
    vision.fail("layer_norm_eps " + std::to_string(vision.number_or("layer_norm_eps", 1e-5)) + " differs from the text tower's " +
                std::to_string(c.norm_eps) + " (one epsilon for both towers here)");
  }
  text.require_value("hidden_act", "quick_gelu", "the CLIP MLP here is quick_gelu, OpenAI's");
  vision.require_value("hidden_act", "quick_gelu", "the CLIP MLP here is quick_gelu, OpenAI's");
  for (const ConfigReader* tower : {&text, &vision}) {
    if (tower->has("projection_dim") && tower->integer("projection_dim") != c.projection_dim) {
      tower->fail("projection_dim " + std::to_string(tower->integer("projection_dim")) + " differs from the model's " +
                  std::to_string(c.projection_dim));
    }
  }
  if (c.eos_token == 2) {
    text.fail("eos_token_id = 2 is transformers' legacy pooling at each caption's highest token id: not supported (set the "
              "tokenizer's real end-of-text id)");
  }
  return c;
}

// One of a composite config's sections (text_config, vision_config): {} when absent.
nlohmann::json config_section(const ConfigReader& r, const nlohmann::json& json, const char* key) {
  if (!json.contains(key) || json.at(key).is_null()) return nlohmann::json::object();
  if (!json.at(key).is_object()) r.fail(std::string(key) + " must be an object, got " + json.at(key).dump());
  return json.at(key);
}

// LlavaForConditionalGeneration's config: a Llama text_config, a CLIP vision_config (with
// CLIPVisionConfig's defaults), and the joint's keys. Variants we do not implement are named.
models::LlavaConfig read_llava(const ConfigReader& r, const nlohmann::json& json) {
  const nlohmann::json text_json = config_section(r, json, "text_config"), vision_json = config_section(r, json, "vision_config");
  const ConfigReader text(text_json, r.file() + " (text_config)"), vision(vision_json, r.file() + " (vision_config)");
  if (text_json.empty()) r.fail("missing key 'text_config' (the language model's config)");
  text.require_value("model_type", "llama", "the language model here is a Llama");
  vision.require_value("model_type", "clip_vision_model", "the image tower here is CLIP's");
  vision.require_value("hidden_act", "quick_gelu", "the CLIP MLP here is quick_gelu, OpenAI's");
  r.require_value("projector_hidden_act", "gelu", "the projector here is linear, exact gelu, linear");
  r.require_value("multimodal_projector_bias", true, "the projector here has biases");
  models::LlavaConfig c;
  c.text = read_llama(text, text_json);
  c.vision.vision = {vision.integer_or("hidden_size", 768), vision.integer_or("num_attention_heads", 12),
                     vision.integer_or("num_hidden_layers", 12), vision.integer_or("intermediate_size", 3072)};
  c.vision.image_size = vision.integer_or("image_size", 224);
  c.vision.patch = vision.integer_or("patch_size", 32);
  c.vision.channels = vision.integer_or("num_channels", 3);
  c.vision.norm_eps = vision.number_or("layer_norm_eps", 1e-5);
  c.image_token = r.has("image_token_index") ? r.integer("image_token_index") : r.integer_or("image_token_id", 32000);
  if (r.has("vision_feature_layer") && !json.at("vision_feature_layer").is_number_integer()) {
    r.fail("vision_feature_layer = " + json.at("vision_feature_layer").dump() + " is not supported (one layer, an integer: features "
           "of several layers concatenated are not implemented)");
  }
  c.vision_feature_layer = r.integer_or("vision_feature_layer", -2);
  const std::string strategy = r.string_or("vision_feature_select_strategy", "default");
  if (strategy != "default" && strategy != "full") {
    r.fail("vision_feature_select_strategy '" + strategy + "' is not supported (default, full)");
  }
  c.keep_class_token = strategy == "full";
  return c;
}

}  // namespace

bool is_hf_model_dir(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error) && fs::exists(fs::path(path) / "config.json", error);
}

models::ModelConfig read_hf_config(const std::string& dir_or_file) {
  std::error_code error;
  const std::string file = fs::is_directory(dir_or_file, error) ? (fs::path(dir_or_file) / "config.json").string() : dir_or_file;
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot read model config '" + file + "'");
  nlohmann::json json;
  try {
    in >> json;
  } catch (const std::exception& e) {
    throw std::runtime_error("model config '" + file + "' is not valid JSON: " + e.what());
  }
  if (!json.is_object()) throw std::runtime_error("model config '" + file + "' is not a JSON object");
  ConfigReader reader(json, file);
  const std::string type = reader.string_or("model_type", "");
  models::ModelConfig model;
  if (type == "llama") {
    model = read_llama(reader, json);
  } else if (type == "gpt2") {
    model = read_gpt2(reader);
  } else if (type == "clip") {
    model = read_clip(reader, json);
  } else if (type == "llava") {
    model = read_llava(reader, json);
  } else {
    reader.fail(type.empty() ? "no model_type" : "model_type '" + type + "' is not supported (supported: llama, gpt2, clip, llava)");
  }
  try {
    models::validate(model);
  } catch (const std::invalid_argument& e) {
    reader.fail(e.what());
  }
  return model;
}

namespace {

// The source config.json as JSON, or null when there is none to read.
nlohmann::json read_source_config(const std::string& path) {
  if (path.empty()) return nullptr;
  std::ifstream in(path);
  if (!in) return nullptr;
  try {
    nlohmann::json json;
    in >> json;
    return json;
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace

namespace {

// A Llama's config keys (LlamaForCausalLM's, and LLaVA's text_config).
nlohmann::json llama_config_json(const models::LlamaConfig& config) {
  const models::LlamaConfig* l = &config;
  nlohmann::json out = nlohmann::json::object();
  out["model_type"] = "llama";
  out["vocab_size"] = l->vocab;
  out["hidden_size"] = l->dim;
  out["intermediate_size"] = l->ffn_hidden;
  out["num_hidden_layers"] = l->layers;
  out["num_attention_heads"] = l->heads;
  out["num_key_value_heads"] = l->kv_heads;
  out["head_dim"] = l->dim / l->heads;
  out["max_position_embeddings"] = l->context;
  out["rms_norm_eps"] = l->norm_eps;
  out["rope_theta"] = l->rope_theta;
  out["tie_word_embeddings"] = l->tie_embeddings;
  out["hidden_act"] = "silu";
  out["attention_bias"] = false;
  out["mlp_bias"] = false;
  if (l->rope_scaling.enabled) {
    // The hub's spelling, which transformers 4 and 5 both read.
    out["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", l->rope_scaling.factor},
                           {"low_freq_factor", l->rope_scaling.low_freq_factor},
                           {"high_freq_factor", l->rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", l->rope_scaling.original_context}};
  } else {
    out["rope_scaling"] = nullptr;
  }
  return out;
}

// A CLIP image tower's config keys (CLIPModel's and LLaVA's vision_config).
nlohmann::json clip_vision_config_json(const models::ClipConfig& k, bool with_projection) {
  nlohmann::json out = {{"model_type", "clip_vision_model"},
                        {"image_size", k.image_size},
                        {"patch_size", k.patch},
                        {"num_channels", k.channels},
                        {"hidden_size", k.vision.dim},
                        {"num_attention_heads", k.vision.heads},
                        {"num_hidden_layers", k.vision.layers},
                        {"intermediate_size", k.vision.mlp_hidden},
                        {"hidden_act", "quick_gelu"},
                        {"layer_norm_eps", k.norm_eps}};
  if (with_projection) out["projection_dim"] = k.projection_dim;
  return out;
}

}  // namespace

std::string hf_config_text(const models::ModelConfig& model, const std::string& source_config, const std::string& torch_dtype) {
  const nlohmann::json source = read_source_config(source_config);
  nlohmann::json out = nlohmann::json::object();
  // Keys that describe the tokenizer's ids, not the network: kept from the model's origin.
  if (source.is_object()) {
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (source.contains(key)) out[key] = source.at(key);
    }
  }
  if (const auto* l = std::get_if<models::LlamaConfig>(&model)) {
    out["architectures"] = {"LlamaForCausalLM"};
    out.update(llama_config_json(*l));
  } else if (const auto* g = std::get_if<models::GptConfig>(&model)) {
    out["architectures"] = {"GPT2LMHeadModel"};
    out["model_type"] = "gpt2";
    out["vocab_size"] = g->vocab;
    out["n_embd"] = g->dim;
    out["n_layer"] = g->layers;
    out["n_head"] = g->heads;
    out["n_positions"] = g->context;
    if (g->mlp_hidden > 0) out["n_inner"] = g->mlp_hidden;
    else out["n_inner"] = nullptr;
    out["activation_function"] = "gelu_new";
    out["layer_norm_epsilon"] = g->norm_eps;
    out["attn_pdrop"] = g->dropout;
    out["embd_pdrop"] = g->dropout;
    out["resid_pdrop"] = g->dropout;
    out["tie_word_embeddings"] = true;
    if (!g->qkv_bias) throw std::invalid_argument("hf_config_json: GPT-2 without biases has no Hugging Face config");
  } else if (const auto* k = std::get_if<models::ClipConfig>(&model)) {
    out.erase("bos_token_id");  // CLIPModel keeps the token ids in text_config
    out.erase("eos_token_id");
    out.erase("pad_token_id");
    out["architectures"] = {"CLIPModel"};
    out["model_type"] = "clip";
    out["projection_dim"] = k->projection_dim;
    out["logit_scale_init_value"] = 2.6592;
    nlohmann::json text = {{"model_type", "clip_text_model"},
                           {"vocab_size", k->vocab},
                           {"max_position_embeddings", k->context},
                           {"eos_token_id", k->eos_token},
                           {"hidden_size", k->text.dim},
                           {"num_attention_heads", k->text.heads},
                           {"num_hidden_layers", k->text.layers},
                           {"intermediate_size", k->text.mlp_hidden},
                           {"projection_dim", k->projection_dim},
                           {"hidden_act", "quick_gelu"},
                           {"layer_norm_eps", k->norm_eps}};
    if (source.is_object() && source.contains("text_config") && source.at("text_config").is_object()) {
      for (const char* key : {"bos_token_id", "pad_token_id"}) {
        if (source.at("text_config").contains(key)) text[key] = source.at("text_config").at(key);
      }
    }
    out["text_config"] = text;
    out["vision_config"] = clip_vision_config_json(*k, /*with_projection=*/true);
  } else if (const auto* v = std::get_if<models::LlavaConfig>(&model)) {
    nlohmann::json text = llama_config_json(v->text);
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {  // LLaVA keeps them in text_config
      if (out.contains(key)) text[key] = out.at(key);
      if (source.is_object() && source.contains("text_config") && source.at("text_config").is_object() &&
          source.at("text_config").contains(key)) {
        text[key] = source.at("text_config").at(key);
      }
      out.erase(key);
    }
    out["architectures"] = {"LlavaForConditionalGeneration"};
    out["model_type"] = "llava";
    out["text_config"] = text;
    out["vision_config"] = clip_vision_config_json(v->vision, /*with_projection=*/false);
    out["image_token_index"] = v->image_token;
    out["image_seq_length"] = v->image_tokens();
    out["projector_hidden_act"] = "gelu";
    out["multimodal_projector_bias"] = true;
    out["vision_feature_layer"] = v->vision_feature_layer;
    out["vision_feature_select_strategy"] = v->keep_class_token ? "full" : "default";
    out["tie_word_embeddings"] = v->text.tie_embeddings;
  } else {
    throw std::invalid_argument(std::string("hf_config_json: no Hugging Face config for ") + models::family_name(model) + " models");
  }
  out["torch_dtype"] = torch_dtype;
  return out.dump(2) + "\n";
}

std::string hf_generation_config_text(const std::string& source_config, int64_t bos_token_id, int64_t eos_token_id,
                                      const std::vector<int64_t>& extra_eos) {
  const nlohmann::json source = read_source_config(source_config);
  nlohmann::json out = {{"_from_model_config", true}};
  if (source.is_object() && source.contains("bos_token_id")) {
    out["bos_token_id"] = source.at("bos_token_id");
  } else if (bos_token_id >= 0) {
    out["bos_token_id"] = bos_token_id;
  }
  if (source.is_object() && source.contains("eos_token_id")) {
    out["eos_token_id"] = source.at("eos_token_id");
  } else if (eos_token_id >= 0) {
    out["eos_token_id"] = eos_token_id;
  }
  if (!extra_eos.empty()) {
    nlohmann::json ids = nlohmann::json::array();
    if (out.contains("eos_token_id")) {
      if (out["eos_token_id"].is_array()) ids = out["eos_token_id"];
      else ids.push_back(out["eos_token_id"]);
    }
    for (int64_t id : extra_eos) {
      if (std::find(ids.begin(), ids.end(), nlohmann::json(id)) == ids.end()) ids.push_back(id);
    }
    out["eos_token_id"] = ids;
  }
  return out.dump(2) + "\n";
}

std::vector<std::string> tokenizer_files_in(const std::string& dir) {
  std::vector<std::string> found;
  if (dir.empty()) return found;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"}) {
    const fs::path path = fs::path(dir) / name;
    std::error_code error;
    if (fs::is_regular_file(path, error)) found.push_back(path.string());
  }
  return found;
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary);
    out << text;
    out.flush();
    if (!out) {
      std::error_code ignored;
      fs::remove(temporary, ignored);
      throw std::runtime_error("cannot write '" + path + "'");
    }
  }
  fs::rename(temporary, path);
}

}  // namespace fsdp::checkpoint
