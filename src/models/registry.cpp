// The zoo and the registry: every family's sizes by name, and each question about a config passed
// to the config's family.
#include "fsdp/models/registry.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace fsdp::models {

namespace {

template <size_t... I>
std::vector<const ModelFamily*> families_of(std::index_sequence<I...>) {
  return {&std::variant_alternative_t<I, ModelConfig>::family()...};
}

template <size_t... I>
ModelConfig default_config_at(size_t index, std::index_sequence<I...>) {
  ModelConfig config;
  ((I == index ? (config = ModelConfig(std::in_place_index<I>), true) : false) || ...);
  return config;
}

const std::map<std::string, ModelConfig>& zoo() {
  static const std::map<std::string, ModelConfig> models = [] {
    std::map<std::string, ModelConfig> sizes;
    for (const ModelFamily* family : model_families()) {
      for (auto& [name, config] : family->sizes()) {
        if (!sizes.emplace(name, config).second) throw std::logic_error("model zoo: '" + name + "' is named twice");
      }
    }
    return sizes;
  }();
  return models;
}

}  // namespace

const char* to_string(ModelTask task) {
  switch (task) {
    case ModelTask::Language: return "language";
    case ModelTask::ImageClassification: return "image classification";
    case ModelTask::Contrastive: return "contrastive";
    case ModelTask::ImageText: return "image and text";
  }
  return "?";
}

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families =
      families_of(std::make_index_sequence<std::variant_size_v<ModelConfig>>());
  return families;
}

const ModelFamily& family_of(const ModelConfig& config) { return *model_families().at(config.index()); }

const ModelFamily& family_named(const std::string& name) {
  std::string known;
  const auto& families = model_families();
  for (size_t i = 0; i < families.size(); ++i) {
    if (name == families[i]->name()) return *families[i];
    known += std::string(i == 0 ? "" : i + 1 == families.size() ? " or " : ", ") + families[i]->name();
  }
  throw std::invalid_argument("family '" + name + "' (expected " + known + ")");
}

ModelConfig default_model_config(const ModelFamily& family) {
  const auto& families = model_families();
  const auto at = std::find(families.begin(), families.end(), &family);
  if (at == families.end())
    throw std::logic_error(std::string("model family '") + family.name() + "' is not registered");
  return default_config_at(static_cast<size_t>(at - families.begin()),
                           std::make_index_sequence<std::variant_size_v<ModelConfig>>());
}

ModelConfig ModelFamily::read_hf_config(const HfConfigReader&) const {
  throw std::invalid_argument(std::string("the ") + name() + " family has no Hugging Face config.json form");
}

void ModelFamily::write_hf_config(const ModelConfig&, const nlohmann::json&, nlohmann::json&) const {
  throw std::invalid_argument(std::string("hf_config_json: no Hugging Face config for ") + name() + " models");
}

const ModelFamily* family_of_hf_model_type(const std::string& model_type) {
  for (const ModelFamily* family : model_families()) {
    for (const auto& type : family->hf_model_types()) {
      if (type == model_type) return family;
    }
  }
  return nullptr;
}

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

const char* family_name(const ModelConfig& config) { return family_of(config).name(); }
ModelTask model_task(const ModelConfig& config) { return family_of(config).task(); }
bool is_language_model(const ModelConfig& config) { return model_task(config) == ModelTask::Language; }
bool is_contrastive(const ModelConfig& config) { return model_task(config) == ModelTask::Contrastive; }
bool reads_image_and_text(const ModelConfig& config) { return model_task(config) == ModelTask::ImageText; }
LoraSpec* mutable_lora_spec(ModelConfig& config) { return family_of(config).lora(config); }
const LoraSpec* lora_spec(const ModelConfig& config) { return mutable_lora_spec(const_cast<ModelConfig&>(config)); }
std::vector<std::string> linear_layers(const ModelConfig& config) { return family_of(config).linear_layers(config); }
int64_t linear_weight_count(const ModelConfig& config) { return family_of(config).linear_weight_count(config); }
int64_t parameter_count(const ModelConfig& config) { return family_of(config).parameter_count(config); }
int64_t vocab_size(const ModelConfig& config) { return family_of(config).vocab_size(config); }
int64_t text_context(const ModelConfig& config) { return family_of(config).text_context(config); }
std::optional<AttentionCall> attention_call(const ModelConfig& config, int64_t tokens) {
  return family_of(config).attention_call(config, tokens);
}
double flops_per_sample(const ModelConfig& config, int64_t seq) {
  return family_of(config).flops_per_sample(config, seq);
}
std::vector<std::string> block_type_names(const ModelConfig& config) {
  return family_of(config).block_type_names(config);
}
std::vector<std::string> embedding_and_head_paths(const ModelConfig& config) {
  return family_of(config).embedding_and_head_paths(config);
}
std::vector<std::string> tower_paths(const ModelConfig& config) { return family_of(config).tower_paths(config); }
void validate(const ModelConfig& config) { family_of(config).validate(config); }
BuiltModel build_model(const ModelConfig& config) { return family_of(config).build(config); }

}  // namespace fsdp::models
