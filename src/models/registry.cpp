#include "fsdp/models/registry.h"

#include <torch/torch.h>

#include <map>
#include <stdexcept>

#include "fsdp/nn/hooks.h"

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

LlamaConfig llama(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
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

VitConfig vit(int64_t image, int64_t patch, int64_t channels, int64_t classes, int64_t layers, int64_t dim,
              int64_t heads, int64_t mlp) {
  VitConfig c;
  c.image_size = image;
  c.patch = patch;
  c.channels = channels;
  c.classes = classes;
  c.layers = layers;
  c.dim = dim;
  c.heads = heads;
  c.mlp_hidden = mlp;
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

LlavaConfig llava(ClipConfig vision, LlamaConfig text, int64_t image_token) {
  LlavaConfig c;
  c.vision = vision;
  c.text = text;
  c.image_token = image_token;
  return c;
}

const std::map<std::string, ModelConfig>& zoo() {
  static const std::map<std::string, ModelConfig> models = {
      // Small sizes for tests and this CPU machine (byte vocabulary).
      {"gpt-test", gpt(2, 32, 2, 256, 64)},
      {"gpt-tiny", gpt(4, 128, 4, 256, 256)},
      {"gpt-mini", gpt(6, 256, 8, 256, 512)},
      // Published GPT-2 shapes (Radford et al. 2019; Hugging Face configs).
      {"gpt2", gpt(12, 768, 12, 50257, 1024)},
      {"gpt2-medium", gpt(24, 1024, 16, 50257, 1024)},
      {"gpt2-large", gpt(36, 1280, 20, 50257, 1024)},
      {"gpt2-xl", gpt(48, 1600, 25, 50257, 1024)},
      {"llama-test", llama(2, 32, 4, 2, 64, 256, 64, 10000.0, false)},
      {"llama-tiny", llama(4, 128, 4, 2, 352, 256, 256, 10000.0, false)},
      {"llama-small", llama(8, 256, 8, 4, 688, 256, 512, 10000.0, false)},
      // Published Llama 3 shapes (Meta's params.json / Hugging Face configs).
      {"llama3-1b", llama(16, 2048, 32, 8, 8192, 128256, 8192, 500000.0, true)},
      {"llama3-8b", llama(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0, false)},
      {"llama3-70b", llama(80, 8192, 64, 8, 28672, 128256, 8192, 500000.0, false)},
      // ViT: test size, a Fashion-MNIST size (28x28 greyscale, 10 classes), and the published
      // ImageNet shapes at 224x224 with 1000 classes.
      {"vit-test", vit(28, 7, 1, 10, 2, 32, 2, 64)},
      {"vit-fmnist", vit(28, 7, 1, 10, 6, 128, 4, 256)},
      {"vit-s16", vit(224, 16, 3, 1000, 12, 384, 6, 1536)},
      {"vit-b16", vit(224, 16, 3, 1000, 12, 768, 12, 3072)},
      {"vit-l16", vit(224, 16, 3, 1000, 24, 1024, 16, 4096)},
      // CLIP: test size and a Fashion-MNIST size, both with byte captions (256 bytes and the
      // end-of-text token 256, data/captions.h), and OpenAI's published ViT-B/32 and ViT-L/14
      // (transformers' configs: BPE vocabulary of 49408, eos 49407, 77 positions).
      {"clip-test", clip(28, 7, 1, tower(2, 32, 2, 64), 257, 48, 256, tower(2, 32, 2, 64), 16)},
      {"clip-fmnist", clip(28, 7, 1, tower(6, 128, 4, 256), 257, 48, 256, tower(4, 128, 4, 256), 128)},
      {"clip-vit-b32", clip(224, 32, 3, tower(12, 768, 12, 3072), 49408, 77, 49407, tower(12, 512, 8, 2048), 512)},
      {"clip-vit-l14", clip(224, 14, 3, tower(24, 1024, 16, 4096), 49408, 77, 49407, tower(12, 768, 12, 3072), 768)},
      // LLaVA: test size and a Fashion-MNIST size, CLIP image towers on 28x28 greyscale and a
      // Llama over bytes, end-of-text 256 and the image token 257 (data/image_chat.h); and
      // llava-1.5-7b (CLIP ViT-L/14 at 336 pixels, Llama 2 7B's shape with 32064 tokens, the
      // image token 32000: the hub's llava-hf/llava-1.5-7b-hf config).
      {"llava-test", llava(clip(28, 7, 1, tower(2, 32, 2, 64), 257, 48, 256, tower(2, 32, 2, 64), 16),
                           llama(2, 32, 4, 2, 64, 258, 128, 10000.0, false), 257)},
      {"llava-fmnist", llava(clip(28, 7, 1, tower(6, 128, 4, 256), 257, 48, 256, tower(2, 128, 4, 256), 128),
                             llama(4, 128, 4, 2, 352, 258, 128, 10000.0, false), 257)},
      {"llava-1.5-7b", llava(clip(336, 14, 3, tower(24, 1024, 16, 4096), 49408, 77, 49407, tower(12, 768, 12, 3072), 768),
                             llama(32, 4096, 32, 32, 11008, 32064, 4096, 10000.0, false), 32000)},
  };
  return models;
}

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& [name, config] : zoo()) names.push_back(name);
  return names;
}

ModelConfig model_config(const std::string& name) {
  auto it = zoo().find(name);
  if (it == zoo().end()) {
    std::string known;
    for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model '" + name + "' (known models: " + known + ")");
  }
  return it->second;
}

std::vector<std::string> linear_layers(const ModelConfig& config) {
  if (std::holds_alternative<GptConfig>(config)) return GptConfig::linear_layers();
  if (std::holds_alternative<LlamaConfig>(config) || std::holds_alternative<LlavaConfig>(config)) return LlamaConfig::linear_layers();
  if (std::holds_alternative<ClipConfig>(config)) return ClipConfig::linear_layers();
  return {};
}

int64_t linear_weight_count(const ModelConfig& config) {
  if (const auto* g = std::get_if<GptConfig>(&config)) return g->linear_weight_count();
  if (const auto* l = std::get_if<LlamaConfig>(&config)) return l->linear_weight_count();
  if (const auto* v = std::get_if<LlavaConfig>(&config)) return v->text.linear_weight_count();
  return 0;
}

const LoraSpec* lora_spec(const ModelConfig& config) {
  if (const auto* g = std::get_if<GptConfig>(&config)) return &g->lora;
  if (const auto* l = std::get_if<LlamaConfig>(&config)) return &l->lora;
  if (const auto* v = std::get_if<LlavaConfig>(&config)) return &v->text.lora;
  if (const auto* k = std::get_if<ClipConfig>(&config)) return &k->lora;
  return nullptr;
}

const char* family_name(const ModelConfig& config) {
  return std::visit(Overloaded{[](const GptConfig&) { return "gpt"; }, [](const LlamaConfig&) { return "llama"; },
                               [](const VitConfig&) { return "vit"; }, [](const ClipConfig&) { return "clip"; },
                               [](const LlavaConfig&) { return "llava"; }},
                    config);
}

bool is_language_model(const ModelConfig& config) {
  return std::holds_alternative<GptConfig>(config) || std::holds_alternative<LlamaConfig>(config);
}

bool is_contrastive(const ModelConfig& config) { return std::holds_alternative<ClipConfig>(config); }

bool reads_image_and_text(const ModelConfig& config) { return std::holds_alternative<LlavaConfig>(config); }

int64_t parameter_count(const ModelConfig& config) {
  return std::visit([](const auto& c) { return c.parameter_count(); }, config);
}

int64_t vocab_size(const ModelConfig& config) {
  return std::visit(Overloaded{[](const GptConfig& c) { return c.vocab; }, [](const LlamaConfig& c) { return c.vocab; },
                               [](const VitConfig&) { return int64_t{0}; }, [](const ClipConfig& c) { return c.vocab; },
                               [](const LlavaConfig& c) { return c.text.vocab; }},
                    config);
}

int64_t text_context(const ModelConfig& config) {
  return std::visit(Overloaded{[](const GptConfig& c) { return c.context; }, [](const LlamaConfig& c) { return c.context; },
                               [](const VitConfig&) { return int64_t{0}; }, [](const ClipConfig& c) { return c.context; },
                               [](const LlavaConfig& c) { return c.text.context; }},
                    config);
}

double flops_per_sample(const ModelConfig& config, int64_t seq) {
  return std::visit(Overloaded{[&](const GptConfig& c) { return c.flops_per_token(seq); },
                               [&](const LlamaConfig& c) { return c.flops_per_token(seq); },
                               [](const VitConfig& c) { return c.flops_per_image(); },
                               [](const ClipConfig& c) { return c.flops_per_pair(); },
                               [&](const LlavaConfig& c) { return c.flops_per_example(seq); }},
                    config);
}

std::vector<std::string> block_type_names(const ModelConfig& config) {
  using Names = std::vector<std::string>;
  return std::visit(Overloaded{[](const GptConfig&) { return Names{"GptBlock"}; }, [](const LlamaConfig&) { return Names{"LlamaBlock"}; },
                               [](const VitConfig&) { return Names{"VitBlock"}; },
                               [](const ClipConfig&) { return Names{kClipBlockType}; },
                               [](const LlavaConfig&) { return Names{kClipBlockType, "LlamaBlock"}; }},
                    config);
}

std::vector<std::string> embedding_and_head_paths(const ModelConfig& config) {
  return std::visit(Overloaded{[](const GptConfig&) { return std::vector<std::string>{"wte"}; },
                               [](const LlamaConfig& c) {
                                 return c.tie_embeddings ? std::vector<std::string>{"embed_tokens"}
                                                         : std::vector<std::string>{"embed_tokens", "lm_head"};
                               },
                               [](const VitConfig&) { return std::vector<std::string>{}; },
                               [](const ClipConfig&) {
                                 return std::vector<std::string>{"text_model.embeddings", "vision_model.embeddings"};
                               },
                               [](const LlavaConfig& c) {
                                 std::vector<std::string> paths = {"language_model.embed_tokens", "vision_tower.embeddings"};
                                 if (!c.text.tie_embeddings) paths.insert(paths.begin() + 1, "language_model.lm_head");
                                 return paths;
                               }},
                    config);
}

std::vector<std::string> tower_paths(const ModelConfig& config) {
  if (std::holds_alternative<ClipConfig>(config)) return {"text_model", "vision_model"};
  if (std::holds_alternative<LlavaConfig>(config)) return {"vision_tower"};
  return {};
}

void validate(const ModelConfig& config) {
  std::visit([](const auto& c) { c.validate(); }, config);
}

BuiltModel build_model(const ModelConfig& config) {
  return std::visit(
      [](const auto& c) -> BuiltModel {
        using Config = std::decay_t<decltype(c)>;
        using Impl = std::conditional_t<
            std::is_same_v<Config, GptConfig>, GptImpl,
            std::conditional_t<std::is_same_v<Config, LlamaConfig>, LlamaImpl,
                               std::conditional_t<std::is_same_v<Config, VitConfig>, VitImpl,
                                                  std::conditional_t<std::is_same_v<Config, ClipConfig>, ClipImpl, LlavaImpl>>>>;
        auto module = std::make_shared<Impl>(c);
        BuiltModel built;
        built.module = module;
        if constexpr (std::is_same_v<Config, ClipConfig>) {
          built.forward_function = [](const at::Tensor&, const at::Tensor&) -> at::Tensor {
            throw std::logic_error("clip: a contrastive model has no single-input forward (BuiltModel::contrastive)");
          };
          built.contrastive_function = [module](const at::Tensor& images, const at::Tensor& ids) {
            return fsdp::nn::call(module, images, ids);
          };
        } else if constexpr (std::is_same_v<Config, LlavaConfig>) {
          built.forward_function = [](const at::Tensor&, const at::Tensor&) -> at::Tensor {
            throw std::logic_error("llava: the model reads an image with its tokens (BuiltModel::image_text_logits)");
          };
          built.image_text_logits_function = [module](const at::Tensor& images, const at::Tensor& ids) {
            return fsdp::nn::call(module, images, ids);
          };
          built.image_text_loss_function = [module](const at::Tensor& images, const at::Tensor& ids, const at::Tensor& targets,
                                                    int64_t chunk_rows) { return fsdp::nn::call(module, images, ids, targets, chunk_rows); };
        } else if constexpr (std::is_same_v<Config, VitConfig>) {
          built.forward_function = [module](const at::Tensor& images, const at::Tensor& positions) {
            TORCH_CHECK(!positions.defined(), "vit: images have no token positions");
            return fsdp::nn::call(module, images);
          };
        } else {
          built.forward_function = [module](const at::Tensor& ids, const at::Tensor& positions) {
            return fsdp::nn::call(module, ids, positions);
          };
          built.loss_sum_function = [module](const at::Tensor& ids, const at::Tensor& targets, int64_t chunk_rows,
                                             const at::Tensor& positions) {
            return fsdp::nn::call(module, ids, targets, chunk_rows, positions);
          };
        }
        return built;
      },
      config);
}

}  // namespace fsdp::models
