// ViT's family spec (an image classifier): its sizes, [model] fields, units and entry point.
#include <torch/torch.h>

#include "fsdp/models/model_family.h"
#include "fsdp/nn/hooks.h"
#include "plan_formulas.h"

namespace fsdp::models {

namespace {

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

class VitFamily final : public FamilyOf<VitConfig> {
 public:
  const char* name() const override { return "vit"; }
  const char* display_name() const override { return "ViT"; }
  ModelTask task() const override { return ModelTask::ImageClassification; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    return {
        // A test size, a Fashion-MNIST size (28x28 greyscale, 10 classes), and the published
        // ImageNet shapes at 224x224 with 1000 classes.
        {"vit-test", vit(28, 7, 1, 10, 2, 32, 2, 64)},          {"vit-fmnist", vit(28, 7, 1, 10, 6, 128, 4, 256)},
        {"vit-s16", vit(224, 16, 3, 1000, 12, 384, 6, 1536)},   {"vit-b16", vit(224, 16, 3, 1000, 12, 768, 12, 3072)},
        {"vit-l16", vit(224, 16, 3, 1000, 24, 1024, 16, 4096)}, {"vit-h14", vit(224, 14, 3, 1000, 32, 1280, 16, 5120)},
    };
  }
  std::vector<ModelField> fields(ModelConfig& config) const override {
    VitConfig& c = of(config);
    return {
        field("dim", c.dim, "width of the residual stream"), field("heads", c.heads, "attention heads"),
        field("layers", c.layers, "transformer blocks"),     field("mlp_hidden", c.mlp_hidden, "MLP width"),
        field("patch", c.patch, "patch side in pixels"),     field("image_size", c.image_size, "image side in pixels"),
        field("channels", c.channels, "image channels"),     field("classes", c.classes, "classes of the head"),
    };
  }
  BuiltModel build(const ModelConfig& config) const override {
    auto module = std::make_shared<VitImpl>(of(config));
    BuiltModel built;
    built.module = module;
    built.forward_function = [module](const at::Tensor& images, const at::Tensor& positions) {
      TORCH_CHECK(!positions.defined(), "vit: images have no token positions");
      return fsdp::nn::call(module, images);
    };
    return built;
  }
  int64_t vocab_size(const ModelConfig&) const override { return 0; }
  int64_t text_context(const ModelConfig&) const override { return 0; }
  double flops_per_sample(const ModelConfig& config, int64_t) const override { return of(config).flops_per_image(); }
  ImageInput image_input(const ModelConfig& config) const override {
    const VitConfig& c = of(config);
    return {c.image_size, c.channels, c.tokens()};
  }
  std::vector<std::string> block_type_names(const ModelConfig&) const override { return {"VitBlock"}; }
  // None: the patch embedding and the class head are small (dim x 768 and dim x classes), well
  // below one block, and stay in the root unit.
  std::vector<std::string> embedding_and_head_paths(const ModelConfig&) const override { return {}; }

  // No embedding or head units (see embedding_and_head_paths).
  PlanUnits plan_units(const ModelConfig& config) const override {
    const VitConfig& c = of(config);
    const int64_t block = one_block_params(c);
    return {c.layers, block, c.layers * block, 0, 0, false};
  }
  // Patches and the class token a sample; the class head keeps its input and fp32 logits.
  int64_t plan_activation_bytes(const ModelConfig& config, const ActivationSettings& s) const override {
    const VitConfig& c = of(config);
    const int64_t block = layer_norm_block_activation_bytes(c.dim, c.heads, c.mlp_hidden, c.tokens(), s);
    const int64_t head = s.micro_batch * (s.compute_bytes * 2 * c.dim + 16 * c.classes);
    return block_stack_activation_bytes(c.layers, c.dim, c.tokens(), block, head, s);
  }
  int64_t largest_module_params(const ModelConfig& config) const override {
    const VitConfig& c = of(config);
    return std::max(c.dim * c.mlp_hidden + c.mlp_hidden, c.dim * c.classes + c.classes);
  }
};

}  // namespace

const ModelFamily& VitConfig::family() {
  static const VitFamily family;
  return family;
}

}  // namespace fsdp::models
