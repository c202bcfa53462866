// LLaVA's family spec (a CLIP image tower read by a Llama): its sizes, [model] fields, units, LoRA
// (on the Llama) and entry points.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "fsdp/models/model_family.h"
#include "fsdp/nn/hooks.h"
#include "clip_plan_terms.h"
#include "plan_formulas.h"
#include "shared_fields.h"

namespace fsdp::models {

namespace {

ClipConfig image_tower(int64_t image, int64_t patch, int64_t channels, int64_t layers, int64_t dim, int64_t heads,
                       int64_t mlp) {
  ClipConfig c;
  c.image_size = image;
  c.patch = patch;
  c.channels = channels;
  c.vision = {dim, heads, layers, mlp};
  return c;
}

// LLaVA 1.5's language models: Llama 2's rotary base, untied.
LlamaConfig language_model(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                           int64_t context) {
  return llama_shape(layers, dim, heads, kv_heads, ffn, vocab, context, 10000.0, false);
}

LlavaConfig llava(ClipConfig vision, LlamaConfig text, int64_t image_token) {
  LlavaConfig c;
  c.vision = vision;
  c.text = text;
  c.image_token = image_token;
  return c;
}

// LlavaForConditionalGeneration's config: a Llama text_config, a CLIP vision_config (with
// CLIPVisionConfig's defaults), and the joint's keys. Variants not implemented here are named.
LlavaConfig llava_from_hf_config(const HfConfigReader& r) {
  const nlohmann::json text_json = r.section("text_config"), vision_json = r.section("vision_config");
  const HfConfigReader text(text_json, r.file() + " (text_config)"), vision(vision_json, r.file() + " (vision_config)");
  if (text_json.empty()) r.fail("missing key 'text_config' (the language model's config)");
  text.require_value("model_type", "llama", "the language model here is a Llama");
  vision.require_value("model_type", "clip_vision_model", "the image tower here is CLIP's");
  vision.require_value("hidden_act", "quick_gelu", "the CLIP MLP here is quick_gelu, OpenAI's");
  r.require_value("projector_hidden_act", "gelu", "the projector here is linear, exact gelu, linear");
  r.require_value("multimodal_projector_bias", true, "the projector here has biases");
  LlavaConfig c;
  c.text = llama_from_hf_config(text);
  c.vision.vision = {vision.integer_or("hidden_size", 768), vision.integer_or("num_attention_heads", 12),
                     vision.integer_or("num_hidden_layers", 12), vision.integer_or("intermediate_size", 3072)};
  c.vision.image_size = vision.integer_or("image_size", 224);
  c.vision.patch = vision.integer_or("patch_size", 32);
  c.vision.channels = vision.integer_or("num_channels", 3);
  c.vision.norm_eps = vision.number_or("layer_norm_eps", 1e-5);
  c.image_token = r.has("image_token_index") ? r.integer("image_token_index") : r.integer_or("image_token_id", 32000);
  if (r.has("vision_feature_layer") && !r.json().at("vision_feature_layer").is_number_integer()) {
    r.fail("vision_feature_layer = " + r.json().at("vision_feature_layer").dump() +
           " is not supported (one layer, an integer: features "
           "of several layers concatenated are not implemented)");
  }
  c.vision_feature_layer = r.integer_or("vision_feature_layer", -2);
  const std::string strategy = r.string_or("vision_feature_select_strategy", "default");
  if (strategy != "default" && strategy != "full")
    r.fail("vision_feature_select_strategy '" + strategy + "' is not supported (default, full)");
  c.keep_class_token = strategy == "full";
  return c;
}

class LlavaFamily final : public FamilyOf<LlavaConfig> {
 public:
  const char* name() const override { return "llava"; }
  const char* display_name() const override { return "LLaVA"; }
  ModelTask task() const override { return ModelTask::ImageText; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    return {
        // A test size and a Fashion-MNIST size: CLIP image towers on 28x28 greyscale and a Llama
        // over bytes, end-of-text 256 and the image token 257 (data/image_chat.h); and
        // llava-1.5-7b (CLIP ViT-L/14 at 336 pixels, Llama 2 7B's shape with 32064 tokens, the
        // image token 32000: the hub's llava-hf/llava-1.5-7b-hf config).
        {"llava-test", llava(image_tower(28, 7, 1, 2, 32, 2, 64), language_model(2, 32, 4, 2, 64, 258, 128), 257)},
        {"llava-fmnist",
         llava(image_tower(28, 7, 1, 6, 128, 4, 256), language_model(4, 128, 4, 2, 352, 258, 128), 257)},
        {"llava-1.5-7b", llava(image_tower(336, 14, 3, 24, 1024, 16, 4096),
                               language_model(32, 4096, 32, 32, 11008, 32064, 4096), 32000)},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override {
    LlavaConfig& c = of(config);
    std::vector<ModelField> fields = llama_fields(c.text);
    for (ModelField& f : fields) {
      if (f.key == "context") f.free_beside_hf_config = false;  // the image tokens count against it
    }
    for (ModelField& f : clip_image_tower_fields(c.vision)) fields.push_back(f);
    ModelField feature_layer = field(
        "vision_feature_layer", c.vision_feature_layer,
        "the image tower's hidden state read (0: its embeddings, k: block k's output; -2: the last block but one's)");
    feature_layer.may_be_negative = true;
    ModelField freeze =
        field("freeze_vision", c.freeze_vision, "the image tower gets no gradient (train the rest against it)");
    freeze.free_beside_hf_config = true;
    freeze.default_text = "false";
    for (ModelField f :
         {field("image_token", c.image_token, "the token each image feature replaces"), feature_layer,
          field("keep_class_token", c.keep_class_token,
                "the class token's feature is read too (transformers' strategy \"full\")"),
          field("vision_norm_eps", c.vision.norm_eps, "epsilon of the image tower's LayerNorms"), freeze}) {
      fields.push_back(f);
    }
    return fields;
  }
  BuiltModel build(const ModelConfig& config) const override {
    auto module = std::make_shared<LlavaImpl>(of(config));
    BuiltModel built;
    built.module = module;
    built.forward_function = [](const at::Tensor&, const at::Tensor&) -> at::Tensor {
      throw std::logic_error("llava: the model reads an image with its tokens (BuiltModel::image_text_logits)");
    };
    built.image_text_logits_function = [module](const at::Tensor& images, const at::Tensor& ids) {
      return fsdp::nn::call(module, images, ids);
    };
    built.image_text_loss_function = [module](const at::Tensor& images, const at::Tensor& ids,
                                              const at::Tensor& targets, const ChunkedLoss& chunks) {
      return fsdp::nn::call(module, images, ids, targets, chunks);
    };
    return built;
  }
  int64_t vocab_size(const ModelConfig& config) const override { return of(config).text.vocab; }
  int64_t text_context(const ModelConfig& config) const override { return of(config).text.context; }
  double flops_per_sample(const ModelConfig& config, int64_t seq) const override {
    return of(config).flops_per_example(seq);
  }
  ImageInput image_input(const ModelConfig& config) const override {
    const LlavaConfig& c = of(config);
    return {c.vision.image_size, c.vision.channels, c.image_tokens()};
  }
  int64_t image_token(const ModelConfig& config) const override { return of(config).image_token; }
  std::vector<std::string> block_type_names(const ModelConfig&) const override {
    return {kClipBlockType, "LlamaBlock"};
  }
  // The Llama's (under "language_model.") and the image tower's embeddings.
  std::vector<std::string> embedding_and_head_paths(const ModelConfig& config) const override {
    std::vector<std::string> paths = {"language_model.embed_tokens", "vision_tower.embeddings"};
    if (!of(config).text.tie_embeddings) paths.insert(paths.begin() + 1, "language_model.lm_head");
    return paths;
  }
  std::vector<std::string> tower_paths(const ModelConfig&) const override { return {"vision_tower"}; }
  std::vector<std::string> block_types_outside_towers(const ModelConfig&) const override { return {"LlamaBlock"}; }
  LoraSpec* lora(ModelConfig& config) const override { return &of(config).text.lora; }
  std::vector<std::string> linear_layers(const ModelConfig&) const override { return LlamaConfig::linear_layers(); }
  int64_t linear_weight_count(const ModelConfig& config) const override {
    return of(config).text.linear_weight_count();
  }

  // LlavaForConditionalGeneration (transformers 5's names and the hub's older ones).
  std::vector<std::string> hf_model_types() const override { return {"llava"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override { return llava_from_hf_config(r); }
  void write_hf_config(const ModelConfig& config, const nlohmann::json& source, nlohmann::json& out) const override {
    const LlavaConfig& v = of(config);
    nlohmann::json text = llama_hf_config(v.text);
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
    out["vision_config"] = clip_vision_hf_config(v.vision, /*with_projection=*/false);
    out["image_token_index"] = v.image_token;
    out["image_seq_length"] = v.image_tokens();
    out["projector_hidden_act"] = "gelu";
    out["multimodal_projector_bias"] = true;
    out["vision_feature_layer"] = v.vision_feature_layer;
    out["vision_feature_select_strategy"] = v.keep_class_token ? "full" : "default";
    out["tie_word_embeddings"] = v.text.tie_embeddings;
  }
  // The Llama's body under language_model.model., its head as language_model.lm_head.
  std::string hf_name(const ModelConfig&, const std::string& name) const override {
    const std::string language = "language_model.";
    if (name.rfind(language, 0) == 0 && name.rfind(language + "lm_head", 0) != 0)
      return language + "model." + name.substr(language.size());
    return name;
  }
  // The hub's older files nest the tower (vision_tower.vision_model.*); transformers 5 holds the
  // model as model.{vision_tower, multi_modal_projector, language_model} and lm_head.
  std::vector<std::string> hf_other_names(const ModelConfig&, const std::string& hf) const override {
    auto after = [&](const std::string& prefix) {
      return hf.rfind(prefix, 0) == 0 ? hf.substr(prefix.size()) : std::string();
    };
    if (hf.rfind("vision_tower.", 0) == 0)
      return {"vision_tower.vision_model." + after("vision_tower."), "model." + hf};
    if (hf.rfind("multi_modal_projector.", 0) == 0) return {"model." + hf};
    if (hf == "language_model.lm_head.weight") return {"lm_head.weight"};
    if (hf.rfind("language_model.model.", 0) == 0) return {"model.language_model." + after("language_model.model.")};
    return {};
  }
  bool hf_unread_buffer(const std::string& name) const override {
    return name == "vision_tower.vision_model.embeddings.position_ids";
  }
  std::string hf_exact_architecture() const override { return "LlavaForConditionalGeneration"; }
  // The planner's terms: the image tower's blocks and the Llama's in one stack (every k-th block
  // of both recomputed alike), the Llama's embedding and head, and the image tower's embeddings a
  // unit of their own; the rest (the tower's LayerNorms, the projector, the final norm) the root.
  PlanUnits plan_units(const ModelConfig& config) const override {
    const LlavaConfig& c = of(config);
    const ClipTowerShape& v = c.vision.vision;
    const int64_t llama_block = one_block_params(c.text);
    PlanUnits units;
    units.layers = v.layers + c.text.layers;
    units.largest_block = std::max(clip_block_params(v), llama_block);
    units.all_blocks = v.layers * clip_block_params(v) + c.text.layers * llama_block;
    units.embedding = c.text.vocab * c.text.dim;
    units.head = c.text.tie_embeddings ? 0 : c.text.vocab * c.text.dim;
    units.tied = c.text.tie_embeddings;
    units.other_units = 1;
    units.other_params = clip_vision_embedding_params(c.vision);
    return units;
  }
  // A frozen image tower trains nothing of it; else the blocks past the feature layer and the
  // tower's post_layernorm, which never run, are frozen (ClipVisionTransformerImpl).
  int64_t plan_trainable_params(const ModelConfig& config) const override {
    const LlavaConfig& c = of(config);
    const ClipTowerShape& v = c.vision.vision;
    if (c.freeze_vision) return c.parameter_count() - c.vision.vision_tower_parameter_count();
    return c.parameter_count() - (v.layers - c.read_blocks()) * clip_block_params(v) - 2 * v.dim;
  }
  int64_t plan_adapter_params(const ModelConfig& config) const override {
    return of(config).text.lora_parameter_count();
  }
  // The Llama's activations over its sequence (the image's tokens among them), as a Llama's; the
  // projector's input, hidden and output for the image's tokens; and, unless the tower is frozen
  // (nothing in it needs a gradient: it saves nothing), the blocks the features are read from, over
  // the tower's tokens (patches and the class token), as CLIP's image tower keeps them.
  int64_t plan_activation_bytes(const ModelConfig& config, const ActivationSettings& s) const override {
    const LlavaConfig& c = of(config);
    const ClipTowerShape& v = c.vision.vision;
    const ModelConfig text = c.text;
    const int64_t language = family_of(text).plan_activation_bytes(text, s);
    const int64_t projector = s.micro_batch * s.compute_bytes * c.image_tokens() * (v.dim + 2 * c.text.dim);
    if (c.freeze_vision || c.read_blocks() == 0) return language + projector;
    const int64_t tokens = c.vision.image_tokens();
    const int64_t tower =
        block_stack_activation_bytes(c.read_blocks(), v.dim, tokens, clip_block_activation_bytes(v, tokens, s), 0, s);
    return language + projector + tower;
  }
  int64_t largest_module_params(const ModelConfig& config) const override {
    const LlavaConfig& c = of(config);
    return std::max(
        {c.text.vocab * c.text.dim, c.text.dim * c.text.ffn_hidden, c.vision.vision.dim * c.vision.vision.mlp_hidden});
  }
  std::string peft_export_refusal(const ModelConfig&) const override {
    return "PEFT directories of a llava model are not written yet (its adapters' names are not checked against peft); "
           "export the "
           "merged model (--merge --hf-dir)";
  }
};

}  // namespace

const ModelFamily& LlavaConfig::family() {
  static const LlavaFamily family;
  return family;
}

}  // namespace fsdp::models
