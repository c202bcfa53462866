// Private to train/: every key of fsdp-train's TOML config, declared once (config_keys.cpp): its
// dotted name, the TrainConfig member it reads into, its type, one line of help, and its check.
// Reading (parse_train_config), the resolved config.toml (to_toml) and the key listing
// (fsdp-train --list-keys) all walk this one table, so a key cannot be read and not written, or
// written and not documented.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "fsdp/train/config.h"

namespace fsdp::train {

// A value as its TOML has it.
using ConfigValue = std::variant<int64_t, double, bool, std::string>;

enum class ConfigType { Integer, Number, Boolean, String };
const char* to_string(ConfigType type);  // "integer", "number", "boolean", "string"

struct ConfigKey {
  std::string name;  // "train.steps"; a top-level key has no dot
  ConfigType type = ConfigType::String;
  std::string help;  // one line, for --list-keys
  // Reads and writes the member; only called where applies() holds.
  std::function<ConfigValue(const TrainConfig&)> get;
  // Sets the member; throws std::invalid_argument with the reason for a value it cannot take
  // ("8 GiB" that is no size); the caller names the key and the file.
  std::function<void(TrainConfig&, const ConfigValue&)> set;
  // Whether the key exists for this config (a model key of another family, [lora] on a family without adapters): a key
  // given where it does not apply is refused with not_applicable(config); it is never written.
  std::function<bool(const TrainConfig&)> applies = [](const TrainConfig&) { return true; };
  std::function<std::string(const TrainConfig&)> not_applicable;
  // Whether the resolved config.toml writes it (besides applying): [lora] only with adapters, ...
  std::function<bool(const TrainConfig&)> written = [](const TrainConfig&) { return true; };
  // After every key is read and the config resolved: "" when the value is fine, else what is wrong,
  // the key named ("train.steps must be at least 1"). Checks may read other keys.
  std::function<std::string(const TrainConfig&)> check = [](const TrainConfig&) { return std::string(); };
  // A model shape key that a Hugging Face directory's config.json sets (model.init_from): refused
  // when given beside one, unless this says it may be (the longest sequence of a decoder).
  bool set_by_hf_config = false;
  std::function<bool(const TrainConfig&)> free_beside_hf_config = [](const TrainConfig&) { return false; };
  // Read before the others by parse_train_config itself (the model's source: name, family,
  // init_from), which decides what the model keys apply to.
  bool read_first = false;
  // An integer key whose negative values mean something (an index from the end); others refuse them.
  bool may_be_negative = false;
  // What --list-keys shows as the default ("" : the default TrainConfig's value).
  std::string default_text;
};

// In declaration order: top-level keys, then [model], [data], [train], [optimizer], [fsdp], [eval],
// [checkpoint], [guard], [lora], [targets].
const std::vector<ConfigKey>& config_keys();

// The TOML text of a value: integers as written, numbers in their shortest exact form (0.95, not
// 0.9499999999999996; always with a '.' or an exponent, so they read back as numbers), strings
// quoted and escaped.
std::string toml_value_text(const ConfigValue& value);

}  // namespace fsdp::train
