// The one declaration of fsdp-train's config keys (config_keys.h). To add a key: a member in
// TrainConfig (fsdp/train/config.h) with its default, and one entry below with its help and check.
// A sharding setting ([fsdp], reaching the runtime and the planner) is declared in
// fsdp/runtime/sharding_settings.h instead, and its key follows from there.
#include "config_keys.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <type_traits>

#include "fsdp/data/instructions.h"
#include "fsdp/plan/memory_plan.h"

namespace fsdp::train {

const char* to_string(ConfigType type) {
  switch (type) {
    case ConfigType::Integer: return "integer";
    case ConfigType::Number: return "number";
    case ConfigType::Boolean: return "boolean";
    case ConfigType::String: return "string";
  }
  return "?";
}

std::string toml_value_text(const ConfigValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const auto* d = std::get_if<double>(&value)) {
    if (std::isnan(*d)) return "nan";
    if (std::isinf(*d)) return *d > 0 ? "inf" : "-inf";
    char buffer[64];
    const auto result =
        std::to_chars(buffer, buffer + sizeof(buffer), *d);  // the shortest text that reads back exactly
    std::string text(buffer, result.ptr);
    if (text.find_first_of(".eE") == std::string::npos) text += ".0";  // 8 -> 8.0: stays a number in TOML
    return text;
  }
  std::string quoted = "\"";
  for (const char ch : std::get<std::string>(value)) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      quoted += '\\';
      quoted += ch;
    } else if (byte < 0x20 || byte == 0x7f) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04x", byte);
      quoted += escape;
    } else {
      quoted += ch;
    }
  }
  return quoted + "\"";
}

std::string toml_string(const std::string& text) { return toml_value_text(ConfigValue(text)); }

namespace {

// ---- How values travel between a member and a ConfigValue ----

// An enum with declared names (fsdp/enum_names.h) travels as its name: written as it, read from it
// (another name is refused at once, listing the names). An optional one is "auto" when empty: a
// choice the run makes itself (train.attention).
template <class T>
struct is_automatic_enum : std::false_type {};
template <class E>
struct is_automatic_enum<std::optional<E>> : has_enum_names<E> {};

template <class T>
constexpr ConfigType type_of() {
  if constexpr (has_enum_names<T>::value || is_automatic_enum<T>::value) return ConfigType::String;
  else if constexpr (std::is_same_v<T, bool>) return ConfigType::Boolean;
  else if constexpr (std::is_integral_v<T>) return ConfigType::Integer;
  else if constexpr (std::is_floating_point_v<T>) return ConfigType::Number;
  else return ConfigType::String;
}

template <class T>
ConfigValue to_value(const T& v) {
  if constexpr (has_enum_names<T>::value) return std::string(enum_name(v));
  else if constexpr (is_automatic_enum<T>::value) return std::string(enum_name(v));
  else if constexpr (std::is_same_v<T, bool>) return v;
  else if constexpr (std::is_integral_v<T>) return static_cast<int64_t>(v);
  else if constexpr (std::is_floating_point_v<T>) return static_cast<double>(v);
  else return std::string(v);
}

template <class T>
T from_value(const ConfigValue& v) {
  if constexpr (has_enum_names<T>::value) return enum_from_name<T>(std::get<std::string>(v));
  else if constexpr (is_automatic_enum<T>::value)
    return optional_enum_from_name<typename T::value_type>(std::get<std::string>(v));
  else if constexpr (std::is_same_v<T, bool>) return std::get<bool>(v);
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(std::get<int64_t>(v));
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(std::get<double>(v));
  else return std::get<std::string>(v);
}

// A key bound to the member `field` gives the address of (nullptr where the key does not apply).
template <class Field>
ConfigKey key(std::string name, Field field, std::string help) {
  using T = std::remove_pointer_t<std::invoke_result_t<Field, TrainConfig&>>;
  ConfigKey k;
  k.name = std::move(name);
  k.type = type_of<T>();
  k.help = std::move(help);
  k.get = [field](const TrainConfig& c) { return to_value(*field(const_cast<TrainConfig&>(c))); };
  k.set = [field](TrainConfig& c, const ConfigValue& v) { *field(c) = from_value<T>(v); };
  k.applies = [field](const TrainConfig& c) { return field(const_cast<TrainConfig&>(c)) != nullptr; };
  return k;
}

#define MEMBER(path) [](TrainConfig& c) { return &c.path; }

// "a | b | c": an enum key's values, for its help (an optional enum's start with auto).
template <class E>
std::string alternatives() {
  if constexpr (is_automatic_enum<E>::value) return names_listed(enum_names_with_auto<typename E::value_type>(), " | ");
  else return enum_names_listed<E>(" | ");
}

// ---- Checks ----

std::string unless(bool ok, const std::string& message) { return ok ? std::string() : message; }

// ---- [model]: the keys are the families' fields (ModelFamily::fields), one key per field name ----

// The field `key` of the config's family; nullopt where the family has no such field.
std::optional<models::ModelField> model_field(TrainConfig& c, const std::string& key) {
  for (models::ModelField& f : models::family_of(c.model).fields(c.model)) {
    if (f.key == key) return f;
  }
  return std::nullopt;
}

ConfigValue field_value(const models::ModelField& f) {
  if (const auto* b = std::get_if<bool*>(&f.address)) {
    if (!f.on_word.empty()) return std::string(**b ? f.on_word : f.off_word);
    return **b;
  }
  if (const auto* i = std::get_if<int64_t*>(&f.address)) return **i;
  return *std::get<double*>(f.address);
}

void set_field(const models::ModelField& f, const ConfigValue& v) {
  if (auto* b = std::get_if<bool*>(&f.address)) {
    if (f.on_word.empty()) {
      **b = std::get<bool>(v);
      return;
    }
    const std::string text = std::get<std::string>(v);
    if (text != f.on_word && text != f.off_word)
      throw std::invalid_argument("'" + text + "' (expected " + f.on_word + " or " + f.off_word + ")");
    **b = text == f.on_word;
  } else if (auto* i = std::get_if<int64_t*>(&f.address)) {
    **i = std::get<int64_t>(v);
  } else {
    *std::get<double*>(f.address) = std::get<double>(v);
  }
}

ConfigType field_type(const models::ModelField& f) {
  if (std::holds_alternative<bool*>(f.address)) return f.on_word.empty() ? ConfigType::Boolean : ConfigType::String;
  return std::holds_alternative<int64_t*>(f.address) ? ConfigType::Integer : ConfigType::Number;
}

// model.<field> for every field name any family declares, in the order the families declare them
// (registration order); a field several families have is one key, its help each family's own.
std::vector<ConfigKey> model_keys() {
  std::vector<ConfigKey> keys;
  std::vector<std::vector<std::pair<std::string, std::vector<std::string>>>> helps;  // per key: (help, its families)
  for (const models::ModelFamily* family : models::model_families()) {
    models::ModelConfig example = models::default_model_config(*family);
    for (const models::ModelField& f : family->fields(example)) {
      const std::string name = "model." + f.key;
      auto it = std::find_if(keys.begin(), keys.end(), [&](const ConfigKey& k) { return k.name == name; });
      if (it == keys.end()) {
        ConfigKey k;
        k.name = name;
        k.type = field_type(f);
        k.get = [key = f.key](const TrainConfig& c) {
          return field_value(*model_field(const_cast<TrainConfig&>(c), key));
        };
        k.set = [key = f.key](TrainConfig& c, const ConfigValue& v) { set_field(*model_field(c, key), v); };
        k.applies = [key = f.key](const TrainConfig& c) {
          return model_field(const_cast<TrainConfig&>(c), key).has_value();
        };
        k.written = [key = f.key](const TrainConfig& c) {
          return model_field(const_cast<TrainConfig&>(c), key)->written;
        };
        k.free_beside_hf_config = [key = f.key](const TrainConfig& c) {
          return model_field(const_cast<TrainConfig&>(c), key)->free_beside_hf_config;
        };
        k.not_applicable = [name](const TrainConfig& c) {
          return name + " does not apply to " + std::string(models::family_name(c.model)) + " models";
        };
        k.set_by_hf_config = true;
        k.default_text = f.default_text.empty() ? "the model's" : f.default_text;
        keys.push_back(std::move(k));
        helps.emplace_back();
        it = keys.end() - 1;
      } else if (it->type != field_type(f)) {
        throw std::logic_error(name + " is declared with two types (the " + family->name() + " family's differs)");
      }
      it->may_be_negative = it->may_be_negative || f.may_be_negative;
      auto& key_helps = helps[static_cast<size_t>(it - keys.begin())];
      auto same = std::find_if(key_helps.begin(), key_helps.end(), [&](const auto& h) { return h.first == f.help; });
      if (same == key_helps.end()) key_helps.push_back({f.help, {family->name()}});
      else same->second.push_back(family->name());
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    for (const auto& [help, families] : helps[i]) {
      std::string names;
      for (const auto& n : families) names += (names.empty() ? "" : ", ") + n;
      keys[i].help += (keys[i].help.empty() ? "" : "; ") + help + " [" + names + "]";
    }
  }
  // model.vocab also records that the config gave a vocabulary (TrainConfig::model_vocab).
  for (ConfigKey& k : keys) {
    if (k.name != "model.vocab") continue;
    k.set = [plain_set = k.set](TrainConfig& c, const ConfigValue& v) {
      plain_set(c, v);
      c.model_vocab = std::get<int64_t>(v);
    };
  }
  return keys;
}

// "a, b and c": the registered families `which` holds for (given the family's default config).
std::string families_where(const std::function<bool(const models::ModelFamily&, models::ModelConfig&)>& which) {
  std::vector<std::string> names;
  for (const models::ModelFamily* family : models::model_families()) {
    models::ModelConfig example = models::default_model_config(*family);
    if (which(*family, example)) names.push_back(family->name());
  }
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return text;
}

// The registered families (with adapters only, with_lora).
std::string family_names(bool with_lora) {
  return families_where([with_lora](const models::ModelFamily& family, models::ModelConfig& example) {
    return !with_lora || family.lora(example) != nullptr;
  });
}

// The families whose models read images (data.source fashion_mnist).
std::string image_families() {
  return families_where(
      [](const models::ModelFamily&, models::ModelConfig& example) { return !models::is_language_model(example); });
}

// The families with towers (fsdp.wrap "tower").
std::string tower_families() {
  return families_where(
      [](const models::ModelFamily&, models::ModelConfig& example) { return !models::tower_paths(example).empty(); });
}

// The families whose frozen base may be stored in NF4 (lora.base_dtype "nf4").
std::string nf4_families() {
  return families_where([](const models::ModelFamily&, models::ModelConfig& example) {
    return models::lora_spec(example) != nullptr && models::linear_weight_count(example) > 0;
  });
}

bool has_lora(const TrainConfig& c) { return models::lora_spec(c.model) != nullptr; }
bool lora_enabled(const TrainConfig& c) {
  const models::LoraSpec* lora = models::lora_spec(c.model);
  return lora != nullptr && lora->enabled();
}

ConfigKey lora_key(ConfigKey k) {
  k.applies = has_lora;
  k.not_applicable = [](const TrainConfig& c) {
    return "[lora] applies to the " + family_names(true) + " families, not " +
           std::string(models::family_name(c.model));
  };
  k.written = [](const TrainConfig& c) { return lora_enabled(c); };
  return k;
}

ConfigKey target_key(ConfigKey k) {
  k.written = [](const TrainConfig& c) { return c.targets.any(); };
  return k;
}

ConfigKey loss_scale_key(ConfigKey k) {
  k.written = [](const TrainConfig& c) { return c.fsdp.param_dtype == at::kHalf; };
  return k;
}

ConfigKey guard_key(ConfigKey k) {
  k.written = [](const TrainConfig& c) { return c.guard.any(); };
  return k;
}

// The keys in --list-keys' order, each section's declared by a function of its own.
class KeyList {
 public:
  ConfigKey& add(ConfigKey k) {
    keys_.push_back(std::move(k));
    return keys_.back();  // valid until the next add
  }
  // The key declared as `name`, to attach what its declaration could not (a check).
  ConfigKey& at(const std::string& name) {
    for (ConfigKey& k : keys_) {
      if (k.name == name) return k;
    }
    throw std::logic_error("config key '" + name + "' is not declared");
  }
  std::vector<ConfigKey> take() { return std::move(keys_); }

 private:
  std::vector<ConfigKey> keys_;
};

// ---- top level ----
void declare_run_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(key("name", MEMBER(name), "run name; output_dir defaults to runs/<name>"));
  add(key("seed", MEMBER(seed), "seeds the model's initialisation, the data order and sampling"));
  add(key("output_dir", MEMBER(output_dir), "where config.toml, metrics.jsonl, report.html and checkpoints go"))
      .default_text = "runs/<name>";
}

// ---- [model] ----
void declare_model_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  {
    ConfigKey& k =
        add(key("model.name", MEMBER(model_name), "a model of the zoo (fsdp-train --list-models), or a label"));
    k.read_first = true;
    k.default_text = "required unless init_from or family";
  }
  {
    ConfigKey k;
    k.name = "model.family";
    k.type = ConfigType::String;
    k.help = "the family (" + family_names(false) + "), with every shape key given (as a resolved config.toml has it)";
    k.get = [](const TrainConfig& c) { return ConfigValue(std::string(models::family_name(c.model))); };
    k.set = [](TrainConfig&, const ConfigValue&) {};  // read by parse_train_config (read_first)
    k.read_first = true;
    k.default_text = "from name or init_from";
    add(std::move(k));
  }
  add(key("model.init_from", MEMBER(init_from),
          "initial weights: a Hugging Face model directory (its config.json gives the shape), safetensors, or a "
          "checkpoint"))
      .read_first = true;
  for (ConfigKey& k : model_keys()) add(std::move(k));
}

// ---- [data] ----
void declare_data_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  ConfigKey& source = add(key("data.source", MEMBER(data.source), alternatives<DataSource>()));
  source.default_text = "fortunes (fashion_mnist for " + image_families() + ")";
  source.check = [](const TrainConfig& c) {
    const bool language = models::is_language_model(c.model);
    return unless(language == (c.data.source != DataSource::FashionMnist),
                  std::string("data.source '") + enum_name(c.data.source) + "' does not suit the " +
                      models::family_name(c.model) + " model '" + c.model_name + "' (" +
                      (language ? "language models read fortunes, token_files or instructions"
                                : "image models (" + image_families() + ") read fashion_mnist") +
                      ")");
  };
  add(key("data.dir", MEMBER(data.dir), "the fortunes or Fashion-MNIST directory")).default_text = "Debian's";
  add(key("data.tokenizer", MEMBER(data.tokenizer), "byte | gpt2 (vocab_json, merges_txt) | hf (tokenizer_json)"))
      .check = [](const TrainConfig& c) {
    const DataConfig& d = c.data;
    if (d.tokenizer == data::TokenizerKind::Gpt2 && (d.vocab_json.empty() || d.merges_txt.empty())) {
      return std::string("data.tokenizer 'gpt2' needs data.vocab_json and data.merges_txt");
    }
    return unless(d.tokenizer != data::TokenizerKind::Hf || !d.tokenizer_json.empty(),
                  "data.tokenizer 'hf' needs data.tokenizer_json (a Hugging Face tokenizer.json)");
  };
  add(key("data.vocab_json", MEMBER(data.vocab_json), "GPT-2 tokenizer: vocab.json"));
  add(key("data.merges_txt", MEMBER(data.merges_txt), "GPT-2 tokenizer: merges.txt"));
  add(key("data.tokenizer_json", MEMBER(data.tokenizer_json),
          "hf tokenizer: a Hugging Face tokenizer.json (byte-level BPE)"));
  add(key("data.validation_percent", MEMBER(data.validation_percent),
          "documents (or examples) held out, chosen by a hash of their text"))
      .check = [](const TrainConfig& c) {
    return unless(c.data.validation_percent >= 1 && c.data.validation_percent <= 50,
                  "data.validation_percent must be in [1, 50]");
  };
  add(key("data.train_tokens", MEMBER(data.train_tokens),
          "token_files: the training tokens: a token file, a directory of shards or a glob (fsdp-data corpus)"))
      .check = [](const TrainConfig& c) {
    return unless(
        c.data.source != DataSource::TokenFiles || (!c.data.train_tokens.empty() && !c.data.validation_tokens.empty()),
        "data.source 'token_files' needs data.train_tokens and data.validation_tokens (made by fsdp-data)");
  };
  add(key("data.validation_tokens", MEMBER(data.validation_tokens),
          "token_files: the validation tokens (a file, a directory or a glob)"));
  add(key("data.augment", MEMBER(data.augment), "images: " + alternatives<data::ImageAugment>())).check =
      [](const TrainConfig& c) {
        return unless(c.data.augment == data::ImageAugment::None || !models::is_language_model(c.model),
                      std::string("data.augment '") + enum_name(c.data.augment) +
                          "' augments images; a language model takes none");
      };
}

// ---- [data], instruction examples and how windows and rows are cut ----
void declare_example_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(key("data.train_jsonl", MEMBER(data.train_jsonl),
          "instructions: JSONL of {\"messages\": [...]} or {\"prompt\", \"completion\"}"))
      .check = [](const TrainConfig& c) {
    if (c.data.source != DataSource::Instructions) return std::string();
    if (c.data.train_jsonl.empty()) {
      return std::string(
          "data.source 'instructions' needs data.train_jsonl (JSONL of {\"messages\": [...]} or "
          "{\"prompt\", \"completion\"}; fsdp-data instructions makes one from the fortunes)");
    }
    return unless(c.seq_len > 0,
                  "data.source 'instructions' needs train.seq_len: each example is a row padded to it (the "
                  "model's context, often 8k to 128k tokens, would mostly be padding)");
  };
  add(key("data.validation_jsonl", MEMBER(data.validation_jsonl),
          "instructions: held-out examples (else validation_percent)"));
  add(key("data.chat_format", MEMBER(data.chat_format),
          "instructions: " + alternatives<std::optional<data::ChatFormat>>() +
              " (auto: the first format whose tokens the tokenizer has, else plain)"));
  add(key("data.packing", MEMBER(data.packing),
          "instructions: several examples to a row of train.seq_len, each attending only to itself (no padding paid "
          "for)"))
      .check = [](const TrainConfig& c) {
    return unless(
        !c.data.packing || c.data.source == DataSource::Instructions,
        std::string("data.packing packs instruction examples (data.source 'instructions'); data.source is '") +
            enum_name(c.data.source) +
            "' (for fortunes and token_files, data.document_masking keeps a window's documents apart)");
  };
  add(key("data.split_special_tokens", MEMBER(data.split_special_tokens),
          "instructions: special-token text inside a message (\"<|eot_id|>\") stays text instead of becoming that "
          "control "
          "token (false: transformers' apply_chat_template default)"))
      .check = [](const TrainConfig& c) {
    return unless(
        !c.data.split_special_tokens || c.data.source == DataSource::Instructions,
        std::string("data.split_special_tokens applies to instruction data (data.source 'instructions'); data.source "
                    "is '") +
            enum_name(c.data.source) + "'");
  };
  add(key("data.document_masking", MEMBER(data.document_masking),
          "fortunes, token_files: a window's documents (ended by end-of-text) attend only to themselves, positions "
          "restarting"))
      .check = [](const TrainConfig& c) {
    return unless(
        !c.data.document_masking || c.data.source == DataSource::Fortunes || c.data.source == DataSource::TokenFiles,
        std::string("data.document_masking splits token windows at end-of-text (data.source 'fortunes' or "
                    "'token_files'); data.source is '") +
            enum_name(c.data.source) + "'" + (c.data.source == DataSource::Instructions ? " (use data.packing)" : ""));
  };
}

// ---- [train] ----
void declare_train_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(key("train.steps", MEMBER(steps), "optimizer steps")).check = [](const TrainConfig& c) {
    return unless(c.steps >= 1, "train.steps must be at least 1");
  };
  add(key("train.global_batch", MEMBER(global_batch), "samples (token windows or images) per step, all ranks together"))
      .check = [](const TrainConfig& c) {
    return unless(c.global_batch >= 1, "train.global_batch must be at least 1");
  };
  add(key("train.micro_batches", MEMBER(micro_batches), "per rank per step (gradient accumulation)")).check =
      [](const TrainConfig& c) {
        if (c.micro_batches < 1) return std::string("train.micro_batches must be at least 1");
        // The contrastive loss compares every image with every caption of the global batch at once.
        return unless(
            c.micro_batches == 1 || !models::is_contrastive(c.model),
            "train.micro_batches " + std::to_string(c.micro_batches) + " with the " + models::family_name(c.model) +
                " model '" + c.model_name +
                "': its contrastive loss compares every image with every caption of the global batch in one pass "
                "(micro-batches would change the loss); use 1");
      };
  add(key("train.seq_len", MEMBER(seq_len), "tokens per window (0: the model's context)")).check =
      [](const TrainConfig& c) {
        if (!(c.seq_len == 0 || c.seq_len >= 2)) return std::string("train.seq_len must be at least 2");
        if (!models::is_language_model(c.model)) return std::string();
        const int64_t context = models::text_context(c.model);
        return unless(c.seq_len <= context, "train.seq_len " + std::to_string(c.seq_len) +
                                                " exceeds the model's context of " + std::to_string(context) +
                                                " (raise model.context)");
      };
  add(key("train.sync_each_micro_batch", MEMBER(sync_each_micro_batch),
          "reduce gradients after every micro-batch (false: accumulate unsharded, reduce once per step)"));
  add(key("train.grad_clip", MEMBER(grad_clip), "global gradient norm clip (0: off)"));
  add(key("train.max_nonfinite_steps", MEMBER(max_nonfinite_steps),
          "steps with a NaN or inf gradient norm in a row that stop the run"))
      .check = [](const TrainConfig& c) {
    return unless(c.max_nonfinite_steps >= 1, "train.max_nonfinite_steps must be at least 1");
  };
  add(key("train.log_every", MEMBER(log_every), "plain-text log cadence when not on a terminal")).check =
      [](const TrainConfig& c) { return unless(c.log_every >= 1, "train.log_every must be at least 1"); };
  add(key("train.threads", MEMBER(threads), "intra-op threads per rank (0: cores / ranks on this machine)"));
  add(key("train.device", MEMBER(device),
          alternatives<c10::DeviceType>() + " (cpu: MPI; cuda: NCCL, one GPU per rank; a -DFSDP_CUDA=ON build)"));
  add(key("train.device_memory_fraction", MEMBER(device_memory_fraction),
          "cuda: cap the caching allocator at this share of the GPU (0: none)"))
      .check = [](const TrainConfig& c) {
    if (!(c.device_memory_fraction >= 0.0 && c.device_memory_fraction <= 1.0)) {
      return std::string("train.device_memory_fraction must be in [0, 1] (0: no cap)");
    }
    return unless(c.device_memory_fraction == 0.0 || c.device == c10::DeviceType::CUDA,
                  "train.device_memory_fraction caps GPU memory: it needs train.device 'cuda'");
  };
  add(key("train.report_every", MEMBER(report_every),
          "rewrite <output_dir>/report.html every this many steps (0: at the end)"));
  add(key("train.loss_chunk_tokens", MEMBER(loss_chunk_tokens),
          "head + loss this many tokens at a time, never all logits (0: composed)"));
  add(key("train.fused_ops", MEMBER(fused_ops),
          "the decoder's fused RMSNorm, rotary, SwiGLU, add + RMSNorm, stacked q/k/v and gate/up GEMMs "
          "(false: composed references)"));
  add(key("train.attention", MEMBER(attention),
          alternatives<decltype(TrainConfig::attention)>() +
              " (auto: fused_fp32 for bf16 and fp16 compute on the CPU, else fused; models/attention.h)"));
  add(key("train.bf16_matmul", MEMBER(bf16_matmul),
          alternatives<decltype(TrainConfig::bf16_matmul)>() +
              " (auto: on a CPU with bf16 instructions the faster for the model's linear layers, measured at start; "
              "fp32 GEMMs on bf16 operands on one without; native on a GPU)"));
  add(key("train.attention_kernel", MEMBER(attention_kernel),
          alternatives<decltype(TrainConfig::attention_kernel)>() +
              " (CUDA's fused attention kernel tried first; auto: the fastest for the model's attention, "
              "measured at start)"))
      .check = [](const TrainConfig& c) {
    return unless(!c.attention_kernel || c.device == c10::DeviceType::CUDA,
                  "train.attention_kernel = \"" + std::string(enum_name(*c.attention_kernel)) +
                      "\" chooses among CUDA's attention kernels, and this run is on the CPU (leave it \"auto\")");
  };
}

// ---- [optimizer] ----
void declare_optimizer_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(key("optimizer.name", MEMBER(optimizer.name), alternatives<optim::OptimizerKind>()));
  add(key("optimizer.lr", MEMBER(optimizer.lr), "peak learning rate")).check = [](const TrainConfig& c) {
    return unless(c.optimizer.lr > 0, "optimizer.lr must be positive");
  };
  add(key("optimizer.min_lr", MEMBER(optimizer.min_lr), "end of the cosine decay")).check = [](const TrainConfig& c) {
    return unless(c.optimizer.min_lr >= 0 && c.optimizer.min_lr <= c.optimizer.lr,
                  "optimizer.min_lr must be in [0, optimizer.lr]");
  };
  add(key("optimizer.warmup_steps", MEMBER(optimizer.warmup_steps),
          "linear warm-up steps (more than train.steps: the run ends still warming up)"));
  add(key("optimizer.weight_decay", MEMBER(optimizer.weight_decay), "decoupled weight decay, matrices only"));
  add(key("optimizer.beta1", MEMBER(optimizer.beta1), "AdamW's first-moment decay")).check = [](const TrainConfig& c) {
    return unless(c.optimizer.beta1 >= 0 && c.optimizer.beta1 < 1, "optimizer.beta1 and beta2 must be in [0, 1)");
  };
  add(key("optimizer.beta2", MEMBER(optimizer.beta2), "AdamW's second-moment decay")).check = [](const TrainConfig& c) {
    return unless(c.optimizer.beta2 >= 0 && c.optimizer.beta2 < 1, "optimizer.beta1 and beta2 must be in [0, 1)");
  };
  add(key("optimizer.eps", MEMBER(optimizer.eps), "AdamW's epsilon")).check = [](const TrainConfig& c) {
    return unless(c.optimizer.eps > 0, "optimizer.eps must be positive");
  };
  add(key("optimizer.momentum", MEMBER(optimizer.momentum), "sgd: momentum"));
  add(key("optimizer.kernel", MEMBER(optimizer.kernel),
          "adamw: " + alternatives<decltype(OptimizerConfig::kernel)>() +
              " (auto: fused where the shards are on a GPU, where it also skips a non-finite step without the host "
              "reading the norm; composed where they are in host memory: torch::optim::AdamW bit for bit; "
              "optim/adamw_kernel.h)"));
}

// ---- [fsdp] ----

// fsdp.<name> for each sharding setting (runtime/sharding_settings.h declares them); an enum's help
// starts with its names.
void declare_sharding_setting_keys(KeyList& keys) {
  runtime::for_each_sharding_setting([&](const char* name, auto member, const char* help) {
    using T = std::decay_t<decltype(std::declval<runtime::ShardingSettings&>().*member)>;
    std::string text = help;
    if constexpr (has_enum_names<T>::value) text = alternatives<T>() + ": " + text;
    keys.add(key(
        std::string("fsdp.") + name, [member](TrainConfig& c) { return &(c.fsdp.*member); }, text));
  });
}

// What the sharding settings may not be, alone and together (and with train.device).
void declare_sharding_setting_checks(KeyList& keys) {
  keys.at("fsdp.max_inflight").check = [](const TrainConfig& c) {
    return unless(c.fsdp.max_inflight >= 0 && c.fsdp.max_inflight <= 64, "fsdp.max_inflight must be in [0, 64]");
  };
  keys.at("fsdp.param_dtype").check = [](const TrainConfig& c) {
    return unless(c.fsdp.param_dtype == at::kFloat || runtime::shards_parameters(c.fsdp.strategy),
                  std::string("fsdp.param_dtype '") + enum_name(c.fsdp.param_dtype) +
                      "' needs fsdp.strategy full_shard, shard_grad_op or hybrid_shard (no_shard keeps float32)");
  };
  keys.at("fsdp.reduce_dtype").check = [](const TrainConfig& c) {
    const at::ScalarType param = c.fsdp.param_dtype;
    const at::ScalarType reduce = c.fsdp.reduce_dtype;
    if (reduce == at::kHalf && param != at::kHalf) {
      // Unscaled gradients of a bf16 or fp32 run: fp16 flushes the small ones to zero.
      return "fsdp.reduce_dtype 'float16' needs fsdp.param_dtype 'float16' (its loss scaling keeps gradients inside "
             "fp16's range; fsdp.param_dtype is '" +
             std::string(enum_name(param)) + "')";
    }
    if (reduce == at::kBFloat16 && param == at::kHalf) {
      // Scaled fp16 gradients rounded to bf16's 8 bits: less precise than the fp16 they came from.
      return std::string(
          "fsdp.reduce_dtype 'bfloat16' with fsdp.param_dtype 'float16' would round fp16 gradients to "
          "fewer bits: use float32 or float16");
    }
    return unless(reduce == at::kFloat || runtime::shards_parameters(c.fsdp.strategy),
                  std::string("fsdp.reduce_dtype '") + enum_name(reduce) +
                      "' needs fsdp.strategy full_shard, shard_grad_op or hybrid_shard");
  };
  keys.at("fsdp.activation_checkpointing_every").check = [](const TrainConfig& c) {
    if (c.fsdp.activation_checkpointing_every < 1)
      return std::string("fsdp.activation_checkpointing_every must be 1 or more");
    return unless(c.fsdp.activation_checkpointing_every == 1 || c.fsdp.activation_checkpointing,
                  "fsdp.activation_checkpointing_every applies with fsdp.activation_checkpointing = true");
  };
  keys.at("fsdp.shard_group_size").check = [](const TrainConfig& c) {
    return unless(c.fsdp.shard_group_size == 0 || c.fsdp.strategy == runtime::ShardingStrategy::HybridShard,
                  std::string("fsdp.shard_group_size applies to fsdp.strategy 'hybrid_shard' only (strategy is '") +
                      enum_name(c.fsdp.strategy) + "')");
  };
  keys.at("fsdp.cpu_offload").check = [](const TrainConfig& c) {
    if (!c.fsdp.cpu_offload) return std::string();
    if (!runtime::shards_parameters(c.fsdp.strategy)) {
      return std::string(
          "fsdp.cpu_offload needs a sharding strategy (full_shard, shard_grad_op or hybrid_shard), not no_shard");
    }
    return unless(c.device == c10::DeviceType::CUDA,
                  "fsdp.cpu_offload moves shards from the GPU to host memory: it needs train.device 'cuda' "
                  "(on the CPU they are there already)");
  };
}

// How the model's units are chosen (the trainer's, from the model's family).
void declare_unit_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(key("fsdp.wrap", MEMBER(fsdp.wrap),
          alternatives<UnitWrap>() +
              " (block: each transformer block a unit; root: one unit; tower: each image or text tower of " +
              tower_families() + ")"))
      .check = [](const TrainConfig& c) {
    if (c.fsdp.wrap == UnitWrap::Tower && models::tower_paths(c.model).empty()) {
      return "fsdp.wrap 'tower' applies to " + tower_families() + " models (each image or text tower one unit), not " +
             std::string(models::family_name(c.model));
    }
    return unless(c.fsdp.wrap != UnitWrap::MinParams || c.fsdp.min_params > 0,
                  "fsdp.wrap 'min_params' needs fsdp.min_params > 0");
  };
  add(key("fsdp.min_params", MEMBER(fsdp.min_params), "wrap = min_params: parameters per unit at least"));
  add(key("fsdp.embedding_units", MEMBER(fsdp.embedding_units),
          "token embedding and output head as units of their own"));
}

void declare_fsdp_keys(KeyList& keys) {
  declare_sharding_setting_keys(keys);
  declare_sharding_setting_checks(keys);
  declare_unit_keys(keys);
}

// ---- [eval] ----
void declare_eval_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(key("eval.every", MEMBER(eval.every), "steps between evaluations, also at the start and the end (0: ends only)"));
  add(key("eval.batches", MEMBER(eval.batches), "language models: global batches of validation windows per evaluation"))
      .check = [](const TrainConfig& c) { return unless(c.eval.batches >= 1, "eval.batches must be at least 1"); };
  add(key("eval.max_items", MEMBER(eval.max_items), "images: test images per evaluation (0: all)"));
  add(key("eval.sample_tokens", MEMBER(eval.sample_tokens), "language models: tokens sampled at the end (0: none)"));
  add(key("eval.prompt", MEMBER(eval.prompt), "the sample's prompt"));
  add(key("eval.temperature", MEMBER(eval.temperature), "sampling temperature")).check = [](const TrainConfig& c) {
    return unless(c.eval.temperature > 0, "eval.temperature must be positive");
  };
  add(key("eval.top_k", MEMBER(eval.top_k), "sampling: the k most likely tokens")).check = [](const TrainConfig& c) {
    return unless(c.eval.top_k >= 1, "eval.top_k must be at least 1");
  };
}

// ---- [checkpoint] ----
void declare_checkpoint_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(key("checkpoint.every", MEMBER(checkpoint.every),
          "save every this many steps and at the end (0: only when stopped)"));
  add(key("checkpoint.keep", MEMBER(checkpoint.keep), "newest checkpoints kept (0: all)"));
  add(key("checkpoint.dir", MEMBER(checkpoint.dir), "where checkpoints go")).default_text = "<output_dir>/checkpoints";
  add(key("checkpoint.async", MEMBER(checkpoint.async),
          "the step waits only for a copy of the shards; a thread writes the files, published at a later step"));
}

// ---- [guard] ----
void declare_guard_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(guard_key(key("guard.spike_zscore", MEMBER(guard.spike_zscore),
                    "skip a step whose loss is this many deviations above the recent window's mean (0: off)")))
      .check = [](const TrainConfig& c) {
    return unless(c.guard.spike_zscore >= 0, "guard.spike_zscore must be 0 (off) or positive");
  };
  add(guard_key(key("guard.window", MEMBER(guard.window), "applied steps the spike guard compares against"))).check =
      [](const TrainConfig& c) {
        return unless(c.guard.window >= 2, "guard.window must be at least 2 (a standard deviation needs two losses)");
      };
  add(guard_key(key("guard.rollback_after", MEMBER(guard.rollback_after),
                    "skipped steps in a row that roll back to the last checkpoint before them (0: never)")))
      .check = [](const TrainConfig& c) {
    return unless(c.guard.rollback_after == 0 || c.checkpoint.every > 0,
                  "guard.rollback_after needs checkpoints to roll back to: set checkpoint.every");
  };
  add(guard_key(key("guard.max_rollbacks", MEMBER(guard.max_rollbacks), "rollbacks in one run before it stops")))
      .check = [](const TrainConfig& c) {
    return unless(c.guard.max_rollbacks >= 1, "guard.max_rollbacks must be at least 1");
  };
}

// ---- [loss_scale]: float16 compute only ----
void declare_loss_scale_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(loss_scale_key(key("loss_scale.init", MEMBER(loss_scale.init),
                         "float16: the first loss scale (2^16, as torch.amp.GradScaler)")))
      .check = [](const TrainConfig& c) {
    return unless(
        std::isfinite(c.loss_scale.init) && c.loss_scale.init >= c.loss_scale.min && c.loss_scale.init <= 3.0e38,
        "loss_scale.init must be finite and at least loss_scale.min");
  };
  add(loss_scale_key(key("loss_scale.growth_factor", MEMBER(loss_scale.growth_factor),
                         "float16: the scale's factor after growth_interval clean steps")))
      .check = [](const TrainConfig& c) {
    // The scale is an fp32 number (as GradScaler's): the factors must differ from 1 in fp32 too.
    return unless(static_cast<float>(c.loss_scale.growth_factor) > 1.0f,
                  "loss_scale.growth_factor must be above 1 (in fp32)");
  };
  add(loss_scale_key(key("loss_scale.backoff_factor", MEMBER(loss_scale.backoff_factor),
                         "float16: the scale's factor after an overflow")))
      .check = [](const TrainConfig& c) {
    const float backoff = static_cast<float>(c.loss_scale.backoff_factor);
    return unless(backoff > 0.0f && backoff < 1.0f, "loss_scale.backoff_factor must be in (0, 1) (in fp32)");
  };
  add(loss_scale_key(key("loss_scale.growth_interval", MEMBER(loss_scale.growth_interval),
                         "float16: clean steps in a row before the scale grows")))
      .check = [](const TrainConfig& c) {
    return unless(c.loss_scale.growth_interval >= 1, "loss_scale.growth_interval must be at least 1");
  };
  add(loss_scale_key(key("loss_scale.min", MEMBER(loss_scale.min),
                         "float16: an overflow that would back the scale off below this stops the run")))
      .check = [](const TrainConfig& c) {
    return unless(static_cast<float>(c.loss_scale.min) > 0.0f, "loss_scale.min must be positive (in fp32)");
  };
}

// ---- [lora] ----
void declare_lora_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  auto lora_field = [](auto member) {
    return [member](TrainConfig& c) -> std::remove_reference_t<decltype(models::LoraSpec().*member)>* {
      models::LoraSpec* lora = models::mutable_lora_spec(c.model);
      return lora == nullptr ? nullptr : &(lora->*member);
    };
  };
  add(lora_key(key("lora.rank", lora_field(&models::LoraSpec::rank), "adapter rank r (adapters on: give it)")));
  add(lora_key(key("lora.alpha", lora_field(&models::LoraSpec::alpha), "scale numerator: B A is scaled by alpha / r")));
  add(lora_key(key("lora.dropout", lora_field(&models::LoraSpec::dropout), "dropout on the adapters' input")));
  add(lora_key(
      key("lora.rslora", lora_field(&models::LoraSpec::rslora), "scale alpha / sqrt(r) instead (rank-stabilised)")));
  {
    ConfigKey k = lora_key(key("lora.targets", lora_field(&models::LoraSpec::rank),
                               "linear layers by name (\"q_proj v_proj\") or \"all-linear\""));
    k.type = ConfigType::String;
    k.get = [](const TrainConfig& c) {
      std::string text;
      for (const auto& t : models::lora_spec(c.model)->targets) text += (text.empty() ? "" : " ") + t;
      return ConfigValue(text);
    };
    k.set = [](TrainConfig& c, const ConfigValue& v) {
      models::mutable_lora_spec(c.model)->targets = models::LoraSpec::parse_targets(std::get<std::string>(v));
    };
    add(std::move(k));
  }
  {
    ConfigKey k =
        lora_key(key("lora.base_dtype", MEMBER(lora_base_dtype),
                     "the frozen base's shards: " + alternatives<models::LoraBaseDtype>() +
                         " (auto: the weights' own dtype, nf4 for a transformers 4-bit directory; nf4: QLoRA, linear "
                         "weights in bitsandbytes' 4-bit NF4, the rest bfloat16)"));
    k.applies = has_lora;
    k.check = [](const TrainConfig& c) {
      // A family whose base is not stored in NF4 counts no linear weights for it (ModelFamily).
      return unless(c.lora_base_dtype != models::LoraBaseDtype::Nf4 || models::linear_weight_count(c.model) > 0,
                    "lora.base_dtype 'nf4' is not built for " + std::string(models::family_name(c.model)) +
                        " models (an NF4 base is built for " + nf4_families() + "; use bfloat16)");
    };
    add(std::move(k));
  }
  {
    ConfigKey k =
        lora_key(key("lora.init_adapter", MEMBER(lora_init_adapter), "a PEFT adapter directory to continue training"));
    k.applies = has_lora;
    add(std::move(k));
  }
}

// ---- [targets] ----
void declare_targets_keys(KeyList& keys) {
  auto add = [&](ConfigKey k) -> ConfigKey& { return keys.add(std::move(k)); };
  add(target_key(key("targets.min_tokens_per_second", MEMBER(targets.min_tokens_per_second),
                     "median of the last 10 steps (images/s for image models)")));
  add(target_key(key("targets.max_step_seconds", MEMBER(targets.max_step_seconds), "median of the last 10 steps")));
  {
    ConfigKey k = target_key(key("targets.max_memory_per_rank", MEMBER(targets.max_memory_per_rank),
                                 "the largest rank's peak, e.g. \"8GiB\""));
    k.type = ConfigType::String;
    k.get = [](const TrainConfig& c) { return ConfigValue(std::to_string(c.targets.max_memory_per_rank) + "B"); };
    k.set = [](TrainConfig& c, const ConfigValue& v) {
      c.targets.max_memory_per_rank = plan::parse_bytes(std::get<std::string>(v));
    };
    k.default_text = "0 (not set)";
    add(std::move(k));
  }
  add(target_key(
      key("targets.max_validation_loss", MEMBER(targets.max_validation_loss), "by max_validation_loss_step")));
  add(target_key(key("targets.max_validation_loss_step", MEMBER(targets.max_validation_loss_step),
                     "the first evaluation at or after this step is judged")))
      .check = [](const TrainConfig& c) {
    return unless(c.targets.max_validation_loss_step == 0 || c.targets.max_validation_loss > 0,
                  "targets.max_validation_loss_step needs targets.max_validation_loss");
  };
  add(target_key(key("targets.price_per_device_hour", MEMBER(targets.price_per_device_hour),
                     "cost = elapsed hours x ranks x this")));
  add(target_key(key("targets.max_cost", MEMBER(targets.max_cost), "the run's cost at most"))).check =
      [](const TrainConfig& c) {
        const TargetsConfig& t = c.targets;
        if (t.min_tokens_per_second < 0 || t.max_step_seconds < 0 || t.max_validation_loss < 0 || t.max_cost < 0 ||
            t.price_per_device_hour < 0) {
          return std::string("[targets] values must not be negative");
        }
        return unless(t.max_cost == 0 || t.price_per_device_hour > 0,
                      "targets.max_cost needs targets.price_per_device_hour");
      };
  add(target_key(
      key("targets.stop", MEMBER(targets.stop), "a missed target saves a checkpoint and ends the run (exit 3)")));
}

std::vector<ConfigKey> declare() {
  KeyList keys;
  declare_run_keys(keys);
  declare_model_keys(keys);
  declare_data_keys(keys);
  declare_example_keys(keys);
  declare_train_keys(keys);
  declare_optimizer_keys(keys);
  declare_fsdp_keys(keys);
  declare_eval_keys(keys);
  declare_checkpoint_keys(keys);
  declare_guard_keys(keys);
  declare_loss_scale_keys(keys);
  declare_lora_keys(keys);
  declare_targets_keys(keys);
  return keys.take();
}

#undef MEMBER

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = [] {
    std::vector<ConfigKey> declared = declare();
    const TrainConfig defaults;
    for (ConfigKey& k : declared) {
      if (k.default_text.empty() && k.applies(defaults)) k.default_text = toml_value_text(k.get(defaults));
    }
    return declared;
  }();
  return keys;
}

}  // namespace fsdp::train
