// CLIP's family spec (contrastive image-text towers): its sizes, [model] fields, units, LoRA and
// entry point.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "fsdp/models/model_family.h"
#include "fsdp/nn/hooks.h"
#include "clip_plan_terms.h"
#include "plan_formulas.h"
#include "shared_fields.h"

namespace fsdp::models {

std::vector<ModelField> clip_image_tower_fields(ClipConfig& c) {
  return {
      field("patch", c.patch, "patch side in pixels"),
      field("image_size", c.image_size, "image side in pixels"),
      field("channels", c.channels, "image channels"),
      field("vision_dim", c.vision.dim, "image tower: width"),
      field("vision_heads", c.vision.heads, "image tower: attention heads"),
      field("vision_layers", c.vision.layers, "image tower: blocks"),
      field("vision_mlp_hidden", c.vision.mlp_hidden, "image tower: MLP width"),
  };
}

nlohmann::json clip_vision_hf_config(const ClipConfig& k, bool with_projection) {
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

namespace {

// CLIPModel's config: text_config and vision_config, each read with transformers' defaults for
// the keys a save may leave out (CLIPTextConfig, CLIPVisionConfig: OpenAI's ViT-B/32).
ClipConfig clip_from_hf_config(const HfConfigReader& r) {
  const nlohmann::json text_json = r.section("text_config"), vision_json = r.section("vision_config");
  const HfConfigReader text(text_json, r.file() + " (text_config)"), vision(vision_json, r.file() + " (vision_config)");
  ClipConfig c;
  c.projection_dim = r.integer_or("projection_dim", 512);
  c.vocab = text.integer_or("vocab_size", 49408);
  c.context = text.integer_or("max_position_embeddings", 77);
  c.eos_token = text.integer_or("eos_token_id", 49407);
  c.text = {text.integer_or("hidden_size", 512), text.integer_or("num_attention_heads", 8),
            text.integer_or("num_hidden_layers", 12), text.integer_or("intermediate_size", 2048)};
  c.vision = {vision.integer_or("hidden_size", 768), vision.integer_or("num_attention_heads", 12),
              vision.integer_or("num_hidden_layers", 12), vision.integer_or("intermediate_size", 3072)};
  c.image_size = vision.integer_or("image_size", 224);
  c.patch = vision.integer_or("patch_size", 32);
  c.channels = vision.integer_or("num_channels", 3);
  c.norm_eps = text.number_or("layer_norm_eps", 1e-5);
  if (vision.number_or("layer_norm_eps", 1e-5) != c.norm_eps) {
    vision.fail("layer_norm_eps " + std::to_string(vision.number_or("layer_norm_eps", 1e-5)) +
                " differs from the text tower's " + std::to_string(c.norm_eps) + " (one epsilon for both towers here)");
  }
  text.require_value("hidden_act", "quick_gelu", "the CLIP MLP here is quick_gelu, OpenAI's");
  vision.require_value("hidden_act", "quick_gelu", "the CLIP MLP here is quick_gelu, OpenAI's");
  // text_config and vision_config may carry a projection_dim of their own (transformers' default,
  // 512): CLIPModel projects with the top-level one and never reads theirs, so neither is refused.
  if (c.eos_token == 2) {
    text.fail(
        "eos_token_id = 2 is transformers' legacy pooling at each caption's highest token id: not supported (set the "
        "tokenizer's real end-of-text id)");
  }
  return c;
}

ClipTowerShape tower(int64_t layers, int64_t dim, int64_t heads, int64_t mlp) { return {dim, heads, layers, mlp}; }

ClipConfig clip(int64_t image, int64_t patch, int64_t channels, ClipTowerShape vision, int64_t vocab, int64_t context,
                int64_t eos, ClipTowerShape text, int64_t projection) {
  ClipConfig c;
  c.image_size = image;
  c.patch = patch;
  c.channels = channels;
  c.vision = vision;
  c.vocab = vocab;
  c.context = context;
  c.eos_token = eos;
  c.text = text;
  c.projection_dim = projection;
  return c;
}

ModelField freeze_field(const char* key, bool& member, const char* help) {
  ModelField f = field(key, member, help);
  f.free_beside_hf_config = true;  // a training choice, not the checkpoint's shape
  f.default_text = "false";
  return f;
}

class ClipFamily final : public FamilyOf<ClipConfig> {
 public:
  const char* name() const override { return "clip"; }
  const char* display_name() const override { return "CLIP"; }
  ModelTask task() const override { return ModelTask::Contrastive; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    return {
        // A test size and a Fashion-MNIST size, both with byte captions (256 bytes and the
        // end-of-text token 256, data/captions.h), and OpenAI's published ViT-B/32 and ViT-L/14
        // (transformers' configs: BPE vocabulary of 49408, eos 49407, 77 positions).
        {"clip-test", clip(28, 7, 1, tower(2, 32, 2, 64), 257, 48, 256, tower(2, 32, 2, 64), 16)},
        {"clip-fmnist", clip(28, 7, 1, tower(6, 128, 4, 256), 257, 48, 256, tower(4, 128, 4, 256), 128)},
        {"clip-vit-b32", clip(224, 32, 3, tower(12, 768, 12, 3072), 49408, 77, 49407, tower(12, 512, 8, 2048), 512)},
        {"clip-vit-l14", clip(224, 14, 3, tower(24, 1024, 16, 4096), 49408, 77, 49407, tower(12, 768, 12, 3072), 768)},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override {
    ClipConfig& c = of(config);
    std::vector<ModelField> fields = {
        field("vocab", c.vocab, "the text tower's embedding rows; 0 = the tokenizer's, else at least it"),
        field("context", c.context, "longest caption"),
    };
    for (ModelField& f : clip_image_tower_fields(c)) fields.push_back(f);
    for (ModelField f : {field("text_dim", c.text.dim, "text tower: width"),
                         field("text_heads", c.text.heads, "text tower: attention heads"),
                         field("text_layers", c.text.layers, "text tower: blocks"),
                         field("text_mlp_hidden", c.text.mlp_hidden, "text tower: MLP width"),
                         field("eos_token", c.eos_token, "end-of-text token: a caption's feature is read there"),
                         field("projection_dim", c.projection_dim, "width of the shared image-text space"),
                         freeze_field("freeze_vision", c.freeze_vision,
                                      "the image tower gets no gradient (train the rest against it)"),
                         freeze_field("freeze_text", c.freeze_text,
                                      "the text tower gets no gradient (train the image tower against it)"),
                         field("norm_eps", c.norm_eps, "epsilon of the norms (LayerNorm, RMSNorm)")}) {
      fields.push_back(f);
    }
    return fields;
  }
  BuiltModel build(const ModelConfig& config) const override {
    auto module = std::make_shared<ClipImpl>(of(config));
    BuiltModel built;
    built.module = module;
    built.forward_function = [](const at::Tensor&, const at::Tensor&) -> at::Tensor {
      throw std::logic_error("clip: a contrastive model has no single-input forward (BuiltModel::contrastive)");
    };
    built.contrastive_function = [module](const at::Tensor& images, const at::Tensor& ids) {
      return fsdp::nn::call(module, images, ids);
    };
    return built;
  }
  int64_t vocab_size(const ModelConfig& config) const override { return of(config).vocab; }
  int64_t text_context(const ModelConfig& config) const override { return of(config).context; }
  double flops_per_sample(const ModelConfig& config, int64_t) const override { return of(config).flops_per_pair(); }
  ImageInput image_input(const ModelConfig& config) const override {
    const ClipConfig& c = of(config);
    return {c.image_size, c.channels, c.image_tokens()};
  }
  int64_t end_of_text_token(const ModelConfig& config) const override { return of(config).eos_token; }
  // Both towers' blocks are one type.
  std::vector<std::string> block_type_names(const ModelConfig&) const override { return {kClipBlockType}; }
  // Both towers' embeddings (the text one holds vocab x dim).
  std::vector<std::string> embedding_and_head_paths(const ModelConfig&) const override {
    return {"text_model.embeddings", "vision_model.embeddings"};
  }
  std::vector<std::string> tower_paths(const ModelConfig&) const override { return {"text_model", "vision_model"}; }
  std::vector<std::string> block_types_outside_towers(const ModelConfig&) const override { return {}; }
  LoraSpec* lora(ModelConfig& config) const override { return &of(config).lora; }
  std::vector<std::string> linear_layers(const ModelConfig&) const override { return ClipConfig::linear_layers(); }
  // 0: a CLIP base is not stored in NF4.

  // CLIPModel: our names are its own.
  std::vector<std::string> hf_model_types() const override { return {"clip"}; }
  ModelConfig read_hf_config(const HfConfigReader& r) const override { return clip_from_hf_config(r); }
  void write_hf_config(const ModelConfig& config, const nlohmann::json& source, nlohmann::json& out) const override {
    const ClipConfig& k = of(config);
    out.erase("bos_token_id");  // CLIPModel keeps the token ids in text_config
    out.erase("eos_token_id");
    out.erase("pad_token_id");
    out["architectures"] = {"CLIPModel"};
    out["model_type"] = "clip";
    out["projection_dim"] = k.projection_dim;
    out["logit_scale_init_value"] = 2.6592;
    nlohmann::json text = {{"model_type", "clip_text_model"},
                           {"vocab_size", k.vocab},
                           {"max_position_embeddings", k.context},
                           {"eos_token_id", k.eos_token},
                           {"hidden_size", k.text.dim},
                           {"num_attention_heads", k.text.heads},
                           {"num_hidden_layers", k.text.layers},
                           {"intermediate_size", k.text.mlp_hidden},
                           {"projection_dim", k.projection_dim},
                           {"hidden_act", "quick_gelu"},
                           {"layer_norm_eps", k.norm_eps}};
    if (source.is_object() && source.contains("text_config") && source.at("text_config").is_object()) {
      for (const char* key : {"bos_token_id", "pad_token_id"}) {
        if (source.at("text_config").contains(key)) text[key] = source.at("text_config").at(key);
      }
    }
    out["text_config"] = text;
    out["vision_config"] = clip_vision_hf_config(k, /*with_projection=*/true);
  }
  bool hf_unread_buffer(const std::string& name) const override {
    return name == "text_model.embeddings.position_ids" || name == "vision_model.embeddings.position_ids";
  }
  std::string hf_exact_architecture() const override { return "CLIPModel"; }
  std::string plan_refusal(const ModelConfig& config) const override {
    if (!of(config).lora.enabled()) return "";
    return "fsdp-plan does not model LoRA on a clip model yet (plan it without [lora]: an upper bound)";
  }
  // The text tower's embeddings in `embedding`, the image tower's in `head`: two units.
  PlanUnits plan_units(const ModelConfig& config) const override {
    const ClipConfig& c = of(config);
    return {c.vision.layers + c.text.layers,
            std::max(clip_block_params(c.vision), clip_block_params(c.text)),
            c.vision.layers * clip_block_params(c.vision) + c.text.layers * clip_block_params(c.text),
            clip_text_embedding_params(c),
            clip_vision_embedding_params(c),
            false};
  }
  // A frozen tower's parameters get no gradient and no optimizer state.
  int64_t plan_trainable_params(const ModelConfig& config) const override {
    const ClipConfig& c = of(config);
    int64_t trainable = c.parameter_count();
    if (c.freeze_text) {
      trainable -= c.text.layers * clip_block_params(c.text) + clip_text_embedding_params(c) + 2 * c.text.dim +
                   c.text.dim * c.projection_dim;
    }
    if (c.freeze_vision) {
      trainable -= c.vision.layers * clip_block_params(c.vision) + clip_vision_embedding_params(c) + 4 * c.vision.dim +
                   c.vision.dim * c.projection_dim;
    }
    return trainable;
  }
  // Both towers' blocks for one pair (with checkpointing, each block's input only), one block more
  // for the backward's peak; the loss: both modalities' gathered features [B, p] fp32 and their
  // gradients, this rank's logits [b, B] in both directions, their softmax and gradients. A frozen
  // tower saves nothing for backward: its input needs no gradient and neither do its parameters.
  int64_t plan_activation_bytes(const ModelConfig& config, const ActivationSettings& s) const override {
    const ClipConfig& c = of(config);
    const int64_t image_tokens = c.image_tokens(), text_tokens = c.context;
    const int64_t vision_block = clip_block_activation_bytes(c.vision, image_tokens, s);
    const int64_t text_block = clip_block_activation_bytes(c.text, text_tokens, s);
    const int64_t vision_input = s.compute_bytes * image_tokens * c.vision.dim,
                  text_input = s.compute_bytes * text_tokens * c.text.dim;
    const int64_t vision_saved =
        c.freeze_vision ? 0 : c.vision.layers * (s.checkpointing ? vision_input : vision_block);
    const int64_t text_saved = c.freeze_text ? 0 : c.text.layers * (s.checkpointing ? text_input : text_block);
    const int64_t backward_block = std::max(c.freeze_vision ? 0 : vision_block, c.freeze_text ? 0 : text_block);
    const int64_t per_pair = vision_saved + text_saved + (s.checkpointing ? 2 : 1) * backward_block +
                             s.compute_bytes * image_tokens * c.vision.dim;
    const int64_t global = s.micro_batch * s.ranks;
    const int64_t loss = 2 * 2 * 4 * global * c.projection_dim + 2 * 3 * 4 * s.micro_batch * global;
    return s.micro_batch * per_pair + loss;
  }
  int64_t largest_module_params(const ModelConfig& config) const override {
    const ClipConfig& c = of(config);
    return std::max({clip_text_embedding_params(c), clip_vision_embedding_params(c), c.vision.dim * c.vision.mlp_hidden,
                     c.text.dim * c.text.mlp_hidden});
  }
  std::string peft_export_refusal(const ModelConfig& config) const override {
    if (!of(config).freeze_vision && !of(config).freeze_text) return "";
    return "LoRA on one CLIP tower has no PEFT directory here (target_modules names layers of both towers alike; peft "
           "would adapt "
           "the frozen tower too); export the merged model (--merge --hf-dir)";
  }
};

}  // namespace

const ModelFamily& ClipConfig::family() {
  static const ClipFamily family;
  return family;
}

}  // namespace fsdp::models
