// Every registered model family provides each part of its spec (model_family.h): what
// docs/architecture.md's "Adding a model family" lists. parts_missing() is checked on a family
// that leaves parts out, so the check is seen to catch them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/models/hf_config_reader.h"
#include "fsdp/models/registry.h"
#include "fsdp/runtime/wrap_policy.h"

namespace family_tests {

using fsdp::models::BuiltModel;
using fsdp::models::ModelConfig;
using fsdp::models::ModelFamily;
using fsdp::models::ModelField;
using fsdp::models::ModelTask;

bool inside(const void* address, const ModelConfig& config) {
  const auto* begin = reinterpret_cast<const char*>(&config);
  const auto* at = static_cast<const char*>(address);
  return at >= begin && at < begin + sizeof(ModelConfig);
}

const void* address_of(const ModelField& f) {
  return std::visit([](auto* p) { return static_cast<const void*>(p); }, f.address);
}

bool has_module(const torch::nn::Module& root, const std::string& path) {
  for (const auto& item : root.named_modules()) {
    if (item.key() == path) return true;
  }
  return false;
}

bool has_module_type(const torch::nn::Module& root, const std::string& type) {
  for (const auto& module : root.modules()) {
    if (fsdp::runtime::short_type_name(*module) == type) return true;  // as the wrap policy matches it
  }
  return false;
}

bool has_module_named(const torch::nn::Module& root, const std::string& leaf) {
  for (const auto& item : root.named_modules()) {
    const std::string& path = item.key();
    if (path == leaf || (path.size() > leaf.size() &&
                         path.compare(path.size() - leaf.size() - 1, std::string::npos, "." + leaf) == 0)) {
      return true;
    }
  }
  return false;
}

// A field's value as text, to compare two configs field by field.
std::string value_text(const ModelField& f) {
  return std::visit([](auto* p) { return std::to_string(*p); }, f.address);
}

// A family with a Hugging Face form: its config.json written and read back is the same config
// (every field a config.json sets), and its model_type finds it.
std::vector<std::string> hf_parts_missing(const ModelFamily& family, ModelConfig config) {
  std::vector<std::string> missing;
  const auto types = family.hf_model_types();
  if (types.empty()) return missing;
  for (const auto& type : types) {
    if (fsdp::models::family_of_hf_model_type(type) != &family)
      missing.push_back("model_type '" + type + "' does not find this family");
  }
  nlohmann::json written = nlohmann::json::object();
  ModelConfig back;
  try {
    family.write_hf_config(config, nullptr, written);
    back = family.read_hf_config(fsdp::models::HfConfigReader(written, "written config.json"));
  } catch (const std::exception& e) {
    missing.push_back(std::string("its config.json does not read back: ") + e.what());
    return missing;
  }
  if (&fsdp::models::family_of(back) != &family) {
    missing.push_back("its config.json reads back as another family's config");
    return missing;
  }
  const auto before = family.fields(config), after = family.fields(back);
  for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
    if (before[i].free_beside_hf_config && before[i].key != "context")
      continue;  // a training choice config.json does not hold
    if (value_text(before[i]) != value_text(after[i])) {
      missing.push_back("field '" + before[i].key + "' is " + value_text(before[i]) +
                        ", read back from its config.json " + value_text(after[i]));
    }
  }
  return missing;
}

int64_t parameters_of(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& p : module.parameters()) total += p.numel();
  return total;
}

// The planner's terms agree with the built model: its blocks (count, largest, all), its embedding,
// head and other units, and give activations and a largest module.
std::vector<std::string> plan_parts_missing(const ModelFamily& family, const ModelConfig& config,
                                            const BuiltModel& built) {
  std::vector<std::string> missing;
  if (!family.plan_refusal(config).empty()) return missing;  // not planned yet, and says so
  const fsdp::models::PlanUnits units = family.plan_units(config);
  const auto types = family.block_type_names(config);
  int64_t blocks = 0, largest = 0, all = 0;
  for (const auto& module : built.module->modules()) {
    const std::string type = fsdp::runtime::short_type_name(*module);
    if (std::find(types.begin(), types.end(), type) == types.end()) continue;
    ++blocks;
    largest = std::max(largest, parameters_of(*module));
    all += parameters_of(*module);
  }
  if (units.layers != blocks || units.largest_block != largest || units.all_blocks != all) {
    missing.push_back("plan_units counts " + std::to_string(units.layers) + " blocks, the largest " +
                      std::to_string(units.largest_block) + ", all " + std::to_string(units.all_blocks) +
                      "; the built model " + std::to_string(blocks) + ", " + std::to_string(largest) + ", " +
                      std::to_string(all));
  }
  int64_t outer = 0;
  for (const auto& item : built.module->named_modules()) {
    for (const auto& path : family.embedding_and_head_paths(config)) {
      if (item.key() == path) outer += parameters_of(*item.value());
    }
  }
  // The paths hold the embedding, the head and the other units (LLaVA's image embeddings).
  if (units.embedding + units.head + units.other_params != outer) {
    missing.push_back("plan_units' embedding, head and other units hold " +
                      std::to_string(units.embedding + units.head + units.other_params) +
                      " parameters, the modules at embedding_and_head_paths " + std::to_string(outer));
  }
  const int64_t trainable = family.plan_trainable_params(config);
  if (trainable <= 0 || trainable > family.parameter_count(config))
    missing.push_back("plan_trainable_params out of range");
  if (family.plan_activation_bytes(config, fsdp::models::ActivationSettings{}) <= 0)
    missing.push_back("plans no activations");
  if (family.largest_module_params(config) <= 0) missing.push_back("names no largest module");
  return missing;
}

// What `family` leaves out or gets wrong, one line each; empty when it provides every part.
// The model is built from its first (smallest) size.
std::vector<std::string> parts_missing(const ModelFamily& family) {
  std::vector<std::string> missing;
  auto miss = [&](const std::string& what) { missing.push_back(std::string(family.name()) + ": " + what); };
  if (std::string(family.name()).empty() || std::string(family.display_name()).empty()) miss("no name");
  const auto sizes = family.sizes();
  if (sizes.empty()) {
    miss("no sizes in the zoo");
    return missing;
  }
  for (const auto& [name, config] : sizes) {
    if (name.rfind(family.name(), 0) != 0) miss("size '" + name + "' is not named with the family's name first");
    if (&fsdp::models::family_of(config) != &family) miss("size '" + name + "' holds another family's config");
    try {
      family.validate(config);
    } catch (const std::exception& e) {
      miss("size '" + name + "' does not validate: " + e.what());
    }
    if (family.parameter_count(config) <= 0) miss("size '" + name + "' counts no parameters");
    if (!(family.flops_per_sample(config, 16) > 0)) miss("size '" + name + "' counts no FLOPs");
    const bool reads_text = family.task() != ModelTask::ImageClassification;
    if (reads_text != (family.vocab_size(config) > 0 && family.text_context(config) > 0)) {
      miss("size '" + name + "': vocab_size and text_context do not match the task (" + to_string(family.task()) + ")");
    }
  }
  ModelConfig config = sizes.front().second;
  const auto fields = family.fields(config);
  if (fields.empty()) miss("no [model] fields");
  std::set<std::string> keys;
  for (const ModelField& f : fields) {
    if (f.key.empty() || f.help.empty()) miss("a field without a key or help");
    if (!keys.insert(f.key).second) miss("field '" + f.key + "' declared twice");
    if (!inside(address_of(f), config)) miss("field '" + f.key + "' does not point into the config it was asked about");
    if (f.on_word.empty() != f.off_word.empty() || (!f.on_word.empty() && !std::holds_alternative<bool*>(f.address))) {
      miss("field '" + f.key + "': words for a switch need both and a bool");
    }
  }
  const auto blocks = family.block_type_names(config);
  if (blocks.empty()) miss("no block types (the FSDP units)");
  BuiltModel built;
  try {
    built = family.build(config);
  } catch (const std::exception& e) {
    miss(std::string("does not build: ") + e.what());
    return missing;
  }
  if (!built.module) {
    miss("builds no module");
    return missing;
  }
  for (const auto& type : blocks) {
    if (!has_module_type(*built.module, type)) miss("block type '" + type + "' is not in the built model");
  }
  for (const auto& path : family.embedding_and_head_paths(config)) {
    if (!has_module(*built.module, path)) miss("embedding or head '" + path + "' is not a module of the built model");
  }
  const auto towers = family.tower_paths(config);
  for (const auto& path : towers) {
    if (!has_module(*built.module, path)) miss("tower '" + path + "' is not a module of the built model");
  }
  // Under fsdp.wrap = "tower", a block type is a unit of its own exactly when it has blocks outside the towers.
  const auto outside = family.block_types_outside_towers(config);
  for (const auto& type : blocks) {
    bool found_outside = false;
    for (const auto& item : built.module->named_modules()) {
      if (fsdp::runtime::short_type_name(*item.value()) != type) continue;
      bool in_tower = false;
      for (const auto& tower : towers) in_tower = in_tower || item.key().rfind(tower + ".", 0) == 0;
      found_outside = found_outside || !in_tower;
    }
    const bool listed = std::find(outside.begin(), outside.end(), type) != outside.end();
    if (listed != found_outside)
      miss("block type '" + type + "' is " + (found_outside ? "" : "not ") +
           "outside the towers, block_types_outside_towers says the reverse");
  }
  int64_t held = 0;
  for (const auto& p : built.module->parameters()) held += p.numel();
  if (held != family.parameter_count(config)) {
    miss("parameter_count says " + std::to_string(family.parameter_count(config)) + ", the built model holds " +
         std::to_string(held));
  }
  const bool entry_points_fit = [&] {
    switch (family.task()) {
      case ModelTask::Language: return built.has_loss_sum() && static_cast<bool>(built.forward_function);
      case ModelTask::ImageClassification: return static_cast<bool>(built.forward_function) && !built.has_loss_sum();
      case ModelTask::Contrastive: return built.is_contrastive();
      case ModelTask::ImageText:
        return built.reads_image_and_text() && static_cast<bool>(built.image_text_loss_function);
    }
    return false;
  }();
  if (!entry_points_fit)
    miss(std::string("the built model lacks the entry points of its task (") + to_string(family.task()) + ")");
  const auto linear = family.linear_layers(config);
  if ((family.lora(config) != nullptr) != !linear.empty())
    miss("takes adapters but names no linear layers, or the reverse");
  if (family.lora(config) != nullptr && !inside(family.lora(config), config))
    miss("its LoRA settings are not the config's");
  for (const auto& layer : linear) {
    if (!has_module_named(*built.module, layer))
      miss("linear layer '" + layer + "' is not a module of the built model");
  }
  for (const auto& part : hf_parts_missing(family, sizes.front().second)) miss(part);
  for (const auto& part : plan_parts_missing(family, sizes.front().second, built)) miss(part);
  return missing;
}

TEST(ModelFamilies, EachRegisteredFamilyProvidesEveryPart) {
  const auto& families = fsdp::models::model_families();
  ASSERT_FALSE(families.empty());
  std::set<std::string> names;
  for (const ModelFamily* family : families) {
    EXPECT_TRUE(names.insert(family->name()).second) << family->name() << " is registered twice";
    EXPECT_EQ(&fsdp::models::family_named(family->name()), family);
    EXPECT_EQ(&fsdp::models::family_of(fsdp::models::default_model_config(*family)), family);
    const auto missing = parts_missing(*family);
    for (const auto& line : missing) ADD_FAILURE() << line;
  }
}

TEST(ModelFamilies, AnUnknownFamilyIsRefusedWithTheKnownOnes) {
  try {
    fsdp::models::family_named("mamba");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    // Every registered family named, in registration order: "family 'mamba' (expected gpt, llama, ... or x)".
    std::string known;
    const auto& families = fsdp::models::model_families();
    for (size_t i = 0; i < families.size(); ++i)
      known += std::string(i == 0 ? "" : i + 1 == families.size() ? " or " : ", ") + families[i]->name();
    EXPECT_EQ(std::string(e.what()), "family 'mamba' (expected " + known + ")");
    EXPECT_NE(known.find("gpt, llama"), std::string::npos) << known;
  }
}

// A family that borrows GPT's configs and leaves its parts out (or gets them wrong): the check
// names each gap.
class IncompleteFamily final : public ModelFamily {
 public:
  const char* name() const override { return "half"; }
  const char* display_name() const override { return "Half"; }
  std::vector<std::string> hf_model_types() const override { return {"half"}; }
  ModelTask task() const override { return ModelTask::Language; }
  std::vector<std::pair<std::string, ModelConfig>> sizes() const override {
    return {{"half-test", fsdp::models::model_config("gpt-test")}};
  }
  std::vector<ModelField> fields(ModelConfig&) const override {
    static int64_t elsewhere = 0;
    return {fsdp::models::field("dim", elsewhere, "width")};
  }
  void validate(const ModelConfig&) const override {}
  BuiltModel build(const ModelConfig& config) const override {
    BuiltModel built = fsdp::models::build_model(config);
    built.loss_sum_function = nullptr;
    return built;
  }
  int64_t parameter_count(const ModelConfig&) const override { return 1; }
  int64_t vocab_size(const ModelConfig&) const override { return 256; }
  int64_t text_context(const ModelConfig&) const override { return 64; }
  double flops_per_sample(const ModelConfig&, int64_t) const override { return 1.0; }
  std::vector<std::string> block_type_names(const ModelConfig&) const override { return {"HalfBlock"}; }
  std::vector<std::string> embedding_and_head_paths(const ModelConfig&) const override { return {"lm_head"}; }
  std::vector<std::string> linear_layers(const ModelConfig&) const override { return {"c_attn"}; }
  fsdp::models::PlanUnits plan_units(const ModelConfig&) const override { return {1, 1, 1, 0, 0, false}; }
  int64_t plan_activation_bytes(const ModelConfig&, const fsdp::models::ActivationSettings&) const override {
    return 0;
  }
  int64_t largest_module_params(const ModelConfig&) const override { return 1; }
};

TEST(ModelFamilies, TheCheckNamesEachPartAFamilyLeavesOut) {
  const auto missing = parts_missing(IncompleteFamily());
  auto names = [&](const std::string& text) {
    for (const auto& line : missing) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(names("holds another family's config"));
  EXPECT_TRUE(names("field 'dim' does not point into the config"));
  EXPECT_TRUE(names("block type 'HalfBlock' is not in the built model"));
  EXPECT_TRUE(names("embedding or head 'lm_head' is not a module"));
  EXPECT_TRUE(names("parameter_count says 1"));
  EXPECT_TRUE(names("lacks the entry points of its task (language)"));
  EXPECT_TRUE(names("takes adapters but names no linear layers, or the reverse"));
  EXPECT_TRUE(names("model_type 'half' does not find this family"));
  EXPECT_TRUE(names("its config.json does not read back: hf_config_json: no Hugging Face config for half models"));
  EXPECT_TRUE(names("plan_units counts 1 blocks, the largest 1, all 1; the built model 0, 0, 0"));
  EXPECT_TRUE(names("plans no activations"));
  EXPECT_EQ(missing.size(), 12u) << ::testing::PrintToString(missing);
}

}  // namespace family_tests
