#include "fsdp/checkpoint/peft_adapter.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <set>

#include "fsdp/checkpoint/hf_model_dir.h"
#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/safetensors.h"
#include "flat_ranges.h"
#include "fsdp/comm/agreement.h"
#include "shape_text.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

}  // namespace

bool is_peft_adapter_dir(const std::string& dir) {
  std::error_code error;
  return fs::is_regular_file(fs::path(dir) / kConfigFile, error);
}

PeftAdapterConfig read_peft_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfigFile).string();
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error("PEFT adapter '" + dir + "': cannot read " + kConfigFile +
                             " (is it an adapter directory?)");
  nlohmann::json json;
  try {
    in >> json;
  } catch (const std::exception& e) {
    throw std::runtime_error("'" + path + "' is not valid JSON: " + e.what());
  }
  auto fail = [&](const std::string& what) { throw std::runtime_error("'" + path + "': " + what); };
  if (!json.is_object()) fail("expected a JSON object");
  try {
    PeftAdapterConfig config;
    const std::string type = json.value("peft_type", std::string("LORA"));
    if (type != "LORA") fail("peft_type is '" + type + "'; only LORA adapters load");
    if (!json.contains("r")) fail("no 'r' (the adapters' rank)");
    if (!json.at("r").is_number_integer() || json.at("r").get<int64_t>() <= 0) {
      fail("r (the adapters' rank) must be a positive integer, got " + json.at("r").dump());
    }
    config.rank = json.at("r").get<int64_t>();
    config.alpha = json.contains("lora_alpha") ? json.at("lora_alpha").get<double>() : 8.0;  // peft's default
    config.dropout = json.contains("lora_dropout") ? json.at("lora_dropout").get<double>() : 0.0;
    config.rslora =
        json.contains("use_rslora") && !json.at("use_rslora").is_null() && json.at("use_rslora").get<bool>();
    const std::string bias = json.value("bias", std::string("none"));
    if (bias != "none") fail("bias is '" + bias + "'; only adapters without trained biases (\"none\") load");
    const auto& targets = json.contains("target_modules") ? json.at("target_modules") : nlohmann::json();
    if (targets.is_string()) {
      const std::string text = targets.get<std::string>();
      if (text != models::LoraSpec::kAllLinear) {
        fail("target_modules is the string \"" + text + "\", which PEFT reads as a regular expression over module " +
             "paths; fsdp.cpp takes a list of layer names or \"all-linear\"");
      }
      config.targets = {text};
    } else if (targets.is_array()) {
      // PEFT matches an entry against a module's whole path or its last components, and saves
      // "all-linear" expanded into paths ("model.layers.0.self_attn.q_proj", ...): each entry
      // names the layer its last component names. (A list that adapts some layers of a name and
      // not others loads only as far as the file holds every layer's tensors: import refuses the
      // first one missing, by name.)
      for (const auto& entry : targets) {
        const std::string path = entry.get<std::string>();
        const std::string name =
            path.substr(path.find_last_of('.') == std::string::npos ? 0 : path.find_last_of('.') + 1);
        if (std::find(config.targets.begin(), config.targets.end(), name) == config.targets.end())
          config.targets.push_back(name);
      }
    } else {
      fail("target_modules must be a list of layer names (e.g. [\"q_proj\", \"v_proj\"]) or \"all-linear\"");
    }
    if (config.targets.empty()) fail("target_modules is empty");
    // Keys read above, keys that change nothing about what the trained adapter computes (where
    // the model came from, how its adapters were initialised before training), and the rest.
    static const std::set<std::string> read = {"peft_type",  "r",    "lora_alpha",     "lora_dropout",
                                               "use_rslora", "bias", "target_modules", "base_model_name_or_path"};
    static const std::set<std::string> harmless = {
        "task_type",    "revision",     "inference_mode",  "init_lora_weights", "fan_in_fan_out",
        "auto_mapping", "peft_version", "megatron_config", "megatron_core",     "loftq_config",
        "eva_config",   "corda_config", "lora_ga_config",  "qalora_group_size", "ensure_weight_tying"};
    for (const auto& [key, value] : json.items()) {
      if (read.count(key) || harmless.count(key)) continue;
      const bool unset = value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
                         ((value.is_object() || value.is_array() || value.is_string()) && value.empty());
      if (unset) continue;
      fail(key + " = " + value.dump() + " changes what the adapter computes, and fsdp.cpp does not implement it " +
           "(use_dora, modules_to_save, rank_pattern, alpha_pattern, layers_to_transform and the like are refused " +
           "rather than loaded as a plain LoRA adapter)");
    }
    if (json.contains("base_model_name_or_path") && json.at("base_model_name_or_path").is_string()) {
      config.base_model = json.at("base_model_name_or_path").get<std::string>();
    }
    return config;
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("a key has the wrong type: ") + e.what());
  }
  return {};
}

std::string peft_tensor_name(const models::ModelConfig& model, const std::string& name) {
  // PEFT wraps the model: base_model.model.<the causal LM's own name>; GPT2LMHeadModel keeps its
  // body under "transformer.".
  return "base_model.model." + models::family_of(model).peft_body_prefix() + hf_name(model, name);
}

int64_t export_peft_adapter(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& dir,
                            const std::string& base_model_name) {
  const models::LoraSpec* lora = models::lora_spec(model);
  if (lora == nullptr || !lora->enabled())
    throw std::invalid_argument("export_peft_adapter: the model has no LoRA adapters");
  if (const std::string why = models::family_of(model).peft_export_refusal(model); !why.empty()) {
    throw std::invalid_argument("export_peft_adapter: " + why);
  }
  const comm::ProcessGroupPtr& group = state.group();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto* flat : state.flat_params()) {
    if (!flat->trainable()) continue;
    std::vector<at::Tensor> full = flat->gather_full_params();  // collective
    for (size_t e = 0; e < full.size(); ++e) {
      const std::string& name = flat->layout().entries[e].name;
      if (is_adapter(name)) tensors.emplace_back(peft_tensor_name(model, name), full[e].to(at::kFloat).contiguous());
    }
  }
  int64_t bytes = 0;
  comm::on_every_rank(group, "writing the PEFT adapter to '" + dir + "'", [&] {
    if (group->rank() != 0) return;
    fs::create_directories(dir);
    write_safetensors((fs::path(dir) / kWeightsFile).string(), tensors, {{"format", "pt"}});
    nlohmann::json config = {
        {"peft_type", "LORA"},
        // A language model's adapter is PEFT's causal-LM kind; a contrastive model's the plain PeftModel's.
        {"task_type", models::is_language_model(model) ? nlohmann::json("CAUSAL_LM") : nlohmann::json(nullptr)},
        {"r", lora->rank},
        {"lora_alpha", lora->alpha},
        {"lora_dropout", lora->dropout},
        {"use_rslora", lora->rslora},
        {"target_modules", lora->target_layers(models::linear_layers(model))},
        {"bias", "none"},
        {"fan_in_fan_out", models::family_of(model).peft_fan_in_fan_out()},
        {"base_model_name_or_path", base_model_name},
        {"inference_mode", true},
        {"init_lora_weights", true},
        {"modules_to_save", nullptr}};
    write_text_file((fs::path(dir) / kConfigFile).string(), config.dump(2) + "\n");
    for (const auto& [name, t] : tensors) bytes += t.numel() * 4;
  });
  return bytes;
}

void import_peft_adapter(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& dir) {
  const models::LoraSpec* lora = models::lora_spec(model);
  if (lora == nullptr || !lora->enabled())
    throw std::invalid_argument("import_peft_adapter: the model has no LoRA adapters");
  if (models::reads_image_and_text(model)) {
    throw std::invalid_argument(
        std::string("import_peft_adapter: PEFT directories of a ") + models::family_name(model) +
        " model (images and text) are not read yet (its adapters' names are not checked against peft)");
  }
  const comm::ProcessGroupPtr& group = state.group();
  const auto flats = state.flat_params();
  std::vector<at::Tensor> loaded(flats.size());  // per trainable FlatParam: its held range, fp32
  comm::on_every_rank(group, "loading the PEFT adapter from '" + dir + "'", [&] {
    const std::string path = (fs::path(dir) / kWeightsFile).string();
    const SafetensorsFile file(path);
    std::set<std::string> used;
    for (size_t f = 0; f < flats.size(); ++f) {
      if (!flats[f]->trainable()) continue;
      const auto& layout = flats[f]->layout();
      const auto [begin, end] = held_range(*flats[f]);
      at::Tensor out = flats[f]->shard().narrow(0, 0, end - begin).to(at::kFloat).clone();
      for (const auto& entry : layout.entries) {
        if (!is_adapter(entry.name)) continue;
        const std::string name = peft_tensor_name(model, entry.name);
        if (!file.contains(name)) {
          throw std::runtime_error("PEFT adapter '" + path + "' has no tensor '" + name + "' (its target_modules or " +
                                   "layer count differ from this model's)");
        }
        used.insert(name);
        const TensorInfo& info = file.info(name);
        if (info.shape != entry.shape) {
          throw std::runtime_error("PEFT adapter '" + path + "': tensor '" + name + "' has shape " +
                                   shape_text(info.shape) + ", this model's layer needs " + shape_text(entry.shape) +
                                   " (an adapter for another base model, or another rank r)");
        }
        if (info.dtype != at::kFloat && info.dtype != at::kBFloat16 && info.dtype != at::kHalf) {
          throw std::runtime_error("PEFT adapter '" + path + "': tensor '" + name + "' has dtype " +
                                   safetensors_dtype_name(info.dtype) + " (expected F32, BF16 or F16)");
        }
        const int64_t lo = std::max(begin, entry.offset), hi = std::min(end, entry.offset + entry.numel);
        if (lo >= hi) continue;
        out.narrow(0, lo - begin, hi - lo).copy_(file.read_range(name, lo - entry.offset, hi - lo).to(at::kFloat));
      }
      loaded[f] = out;
    }
    for (const auto& info : file.tensors()) {
      if (used.count(info.name)) continue;
      const bool adapter =
          info.name.find(".lora_A.") != std::string::npos || info.name.find(".lora_B.") != std::string::npos;
      throw std::runtime_error("PEFT adapter '" + path + "' holds '" + info.name + "', " +
                               (adapter ? "a layer this model does not adapt (lora.targets must cover the adapter's "
                                          "target_modules)"
                                        : "which fsdp.cpp would not use (a DoRA magnitude, a layer trained in full "
                                          "through modules_to_save, ...): refused rather than dropped"));
    }
  });
  for (size_t f = 0; f < flats.size(); ++f) {
    if (loaded[f].defined()) flats[f]->shard().narrow(0, 0, loaded[f].numel()).copy_(loaded[f]);
  }
}

}  // namespace fsdp::checkpoint
