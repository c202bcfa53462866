// Reading, resolving and writing fsdp-train's config. Every key is declared once, in
// config_keys.cpp; this file walks that table. What it does itself: where the model's shape comes
// from (model.name, model.family, model.init_from), LoRA's settings from a PEFT adapter, and the
// defaults that depend on other keys (output_dir, seq_len, a Hugging Face directory's tokenizer).
#include "fsdp/train/config.h"

#include "config_keys.h"
#include "fsdp/checkpoint/hf_model_dir.h"
#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/peft_adapter.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/nccl_process_group.h"
#include "toml_screen.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace fsdp::train {

namespace {

// The offset of the first byte of `text` that is not part of a well-formed UTF-8 sequence
// (overlong forms, surrogates and code points past U+10FFFF included), or npos.
size_t first_invalid_utf8(const std::string& text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = bytes[i];
    size_t length = 0;
    uint32_t code = 0, min = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      length = 2, code = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      length = 3, code = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      length = 4, code = b & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (i + length > n) return i;
    for (size_t k = 1; k < length; ++k) {
      if ((bytes[i + k] & 0xC0) != 0x80) return i;
      code = (code << 6) | (bytes[i + k] & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += length;
  }
  return std::string::npos;
}

// The first `end` bytes of text, printable ASCII as is and the rest as \xNN: for error messages.
std::string printable_prefix(const std::string& text, size_t end) {
  std::string out;
  for (size_t i = 0; i < end && i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      out += text[i];
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    }
  }
  return out;
}

std::string section_of(const std::string& name) {
  const size_t dot = name.find('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

// The sections the declaration has, in its order.
std::vector<std::string> known_sections() {
  std::vector<std::string> sections;
  for (const ConfigKey& k : config_keys()) {
    const std::string section = section_of(k.name);
    if (!section.empty() && std::find(sections.begin(), sections.end(), section) == sections.end())
      sections.push_back(section);
  }
  return sections;
}

// Typed values out of a TOML table, each failure naming the file (or override) and the key.
class Reader {
 public:
  Reader(const toml::table& root, std::string source) : root_(root), source_(std::move(source)) {}

  bool has(const std::string& key) const { return root_.at_path(key).node() != nullptr; }

  // The key's value in `type`, or nullopt when absent.
  // may_be_negative: an integer key whose negative values mean something (ConfigKey::may_be_negative).
  std::optional<ConfigValue> value(const std::string& key, ConfigType type, bool may_be_negative = false) const {
    const toml::node* node = root_.at_path(key).node();
    if (node == nullptr) return std::nullopt;
    switch (type) {
      case ConfigType::Boolean:
        if (auto v = node->value_exact<bool>()) return ConfigValue(*v);
        fail(key + " must be true or false, got " + type_of(*node));
      case ConfigType::Integer:
        if (auto v = node->value_exact<int64_t>()) {
          if (*v < 0 && !may_be_negative) fail(key + " must not be negative, got " + std::to_string(*v));
          return ConfigValue(*v);
        }
        fail(key + " must be an integer, got " + type_of(*node));
      case ConfigType::Number:
        if (auto v = node->value_exact<double>()) return ConfigValue(*v);
        if (auto v = node->value_exact<int64_t>()) return ConfigValue(static_cast<double>(*v));
        fail(key + " must be a number, got " + type_of(*node));
      case ConfigType::String:
        if (auto v = node->value_exact<std::string>()) {
          // Paths and names go into JSON (manifests, metrics) and TOML (config.toml), which hold
          // UTF-8 only: refused here, by key, rather than at the first checkpoint's save.
          const size_t bad = first_invalid_utf8(*v);
          if (bad != std::string::npos) {
            fail(key + " is not valid UTF-8 (byte " + std::to_string(bad) + " of \"" + printable_prefix(*v, bad) +
                 "...\"): give paths and names as UTF-8");
          }
          return ConfigValue(*v);
        }
        fail(key + " must be a string, got " + type_of(*node));
    }
    return std::nullopt;
  }
  std::optional<std::string> string(const std::string& key) const {
    auto v = value(key, ConfigType::String);
    return v ? std::optional<std::string>(std::get<std::string>(*v)) : std::nullopt;
  }

  // Throws for the first section or key the declaration does not have.
  void reject_unknown() const {
    std::set<std::string> declared;
    for (const ConfigKey& k : config_keys()) declared.insert(k.name);
    const std::vector<std::string> sections = known_sections();
    for (const auto& [section, node] : root_) {
      const std::string section_name(section.str());
      if (const toml::table* table = node.as_table()) {
        if (std::find(sections.begin(), sections.end(), section_name) == sections.end()) {
          std::string known;
          for (const auto& s : sections) known += (known.empty() ? "" : ", ") + s;
          fail("unknown section [" + section_name + "] (known: " + known + ")");
        }
        for (const auto& [key, value] : *table) {
          const std::string path = section_name + "." + std::string(key.str());
          if (!declared.count(path)) fail("unknown key '" + path + "' (fsdp-train --list-keys lists them all)");
        }
      } else if (!declared.count(section_name)) {
        fail("unknown key '" + section_name + "' (fsdp-train --list-keys lists them all)");
      }
    }
  }

  [[noreturn]] void fail(const std::string& what) const { throw ConfigError(source_ + ": " + what); }

 private:
  static const char* type_of(const toml::node& node) {
    switch (node.type()) {
      case toml::node_type::string: return "a string";
      case toml::node_type::integer: return "an integer";
      case toml::node_type::floating_point: return "a number";
      case toml::node_type::boolean: return "a boolean";
      case toml::node_type::table: return "a table";
      case toml::node_type::array: return "an array";
      default: return "a date or time";
    }
  }

  const toml::table& root_;
  std::string source_;
};

// "a.b=value" -> sets root[a][b] = value (parsed as TOML, else a string).
void apply_override(toml::table& root, const std::string& assignment) {
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw ConfigError("override '" + assignment + "': expected key=value, e.g. train.steps=50");
  }
  const std::string key = assignment.substr(0, equals), text = assignment.substr(equals + 1);
  toml::table parsed;
  bool is_toml = true;
  const ScreenedToml screened = screen_toml("value = " + text);
  if (!screened.refusal.empty()) {
    is_toml = false;  // text toml++ must not see (toml_screen.h) is not TOML either: a string
  } else {
    try {
      parsed = toml::parse(screened.text);
    } catch (const toml::parse_error&) {
      is_toml = false;
    }
  }
  std::vector<std::string> parts;
  std::stringstream stream(key);
  for (std::string part; std::getline(stream, part, '.');) parts.push_back(part);
  if (parts.empty() || parts.size() > 2) {
    throw ConfigError("override '" + assignment + "': key must be 'key' or 'section.key'");
  }
  toml::table* table = &root;
  if (parts.size() == 2) {
    if (!root.contains(parts[0])) root.insert(parts[0], toml::table{});
    table = root[parts[0]].as_table();
    if (table == nullptr) throw ConfigError("override '" + assignment + "': '" + parts[0] + "' is not a section");
  }
  if (is_toml) {
    table->insert_or_assign(parts.back(), *parsed.get("value"));
  } else {
    table->insert_or_assign(parts.back(), text);
  }
}

// Where the model's shape comes from, in this order: model.family (every field explicit, as a run's
// resolved config.toml writes it), a Hugging Face directory in model.init_from (its config.json),
// or model.name from the zoo. Returns whether the shape is a Hugging Face directory's.
bool read_model_source(const Reader& r, TrainConfig& c) {
  auto name = r.string("model.name");
  auto family = r.string("model.family");
  if (auto init_from = r.string("model.init_from")) c.init_from = *init_from;
  if (family) {
    try {
      c.model = models::default_model_config(models::family_named(*family));
    } catch (const std::invalid_argument& e) {
      r.fail("model." + std::string(e.what()));
    }
    c.model_name = name ? *name : *family;
    return false;
  }
  if (!c.init_from.empty() && checkpoint::is_hf_model_dir(c.init_from)) {
    try {
      c.model = checkpoint::read_hf_config(c.init_from);
    } catch (const std::exception& e) {
      r.fail(std::string("model.init_from: ") + e.what());
    }
    std::string label = c.init_from;
    while (label.size() > 1 && label.back() == '/') label.pop_back();
    c.model_name = name ? *name : label.substr(label.find_last_of('/') + 1);
    c.model_vocab = models::vocab_size(c.model);
    return true;
  }
  if (name) {
    c.model_name = *name;
    try {
      c.model = models::model_config(*name);
    } catch (const std::invalid_argument& e) {
      r.fail(std::string("model.name: ") + e.what());
    }
    return false;
  }
  if (!c.init_from.empty()) {
    r.fail("model.init_from '" + c.init_from +
           "' is not a Hugging Face model directory (no config.json there); give "
           "model.name for weights without one");
  }
  r.fail(
      "model.name is required (e.g. \"gpt-tiny\"; see fsdp-train --list-models), unless model.init_from names a "
      "Hugging Face model directory (one with a config.json)");
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : " ") + name;
  return text;
}

// [lora], once its keys are read: a PEFT adapter (lora.init_adapter) fills the keys left out and
// must agree with those given; then the adapters must be complete and valid.
void finish_lora(const Reader& r, TrainConfig& c) {
  const models::LoraSpec* spec = models::lora_spec(c.model);
  if (spec == nullptr) return;  // a family without adapters: a [lora] key given was refused as not applying
  models::LoraSpec lora = *spec;
  const bool rank = r.has("lora.rank"), alpha = r.has("lora.alpha"), dropout = r.has("lora.dropout");
  const bool rslora = r.has("lora.rslora"), targets = r.has("lora.targets");
  const bool from_adapter = !c.lora_init_adapter.empty();
  if (from_adapter) {
    checkpoint::PeftAdapterConfig adapter;
    try {
      adapter = checkpoint::read_peft_adapter_config(c.lora_init_adapter);
    } catch (const std::exception& e) {
      r.fail(std::string("lora.init_adapter: ") + e.what());
    }
    auto conflict = [&](const std::string& key, const std::string& ours, const std::string& theirs) {
      r.fail("lora." + key + " is " + ours + " but the adapter in lora.init_adapter ('" + c.lora_init_adapter +
             "') has " + theirs + " (leave lora." + key + " out to take the adapter's)");
    };
    auto number = [](double v) { return toml_value_text(v); };
    if (rank && lora.rank != adapter.rank)
      conflict("rank", std::to_string(lora.rank), "r = " + std::to_string(adapter.rank));
    if (alpha && lora.alpha != adapter.alpha)
      conflict("alpha", number(lora.alpha), "lora_alpha = " + number(adapter.alpha));
    if (dropout && lora.dropout != adapter.dropout)
      conflict("dropout", number(lora.dropout), "lora_dropout = " + number(adapter.dropout));
    if (rslora && lora.rslora != adapter.rslora) {
      conflict("rslora", lora.rslora ? "true" : "false",
               std::string("use_rslora = ") + (adapter.rslora ? "true" : "false"));
    }
    if (targets) {
      models::LoraSpec theirs_spec;
      theirs_spec.targets = adapter.targets;
      const std::vector<std::string> layers = models::linear_layers(c.model);
      auto ours = lora.target_layers(layers), theirs = theirs_spec.target_layers(layers);
      std::sort(ours.begin(), ours.end());
      std::sort(theirs.begin(), theirs.end());
      if (ours != theirs)
        conflict("targets", "\"" + joined(lora.targets) + "\"", "target_modules \"" + joined(adapter.targets) + "\"");
    }
    if (!rank) lora.rank = adapter.rank;
    if (!alpha) lora.alpha = adapter.alpha;
    if (!dropout) lora.dropout = adapter.dropout;
    if (!rslora) lora.rslora = adapter.rslora;
    if (!targets) lora.targets = adapter.targets;
  }
  if (!(rank || alpha || dropout || rslora || targets || from_adapter)) return;
  if (!rank && !from_adapter) r.fail("[lora] needs lora.rank (e.g. 8)");
  if (lora.rank <= 0) r.fail("lora.rank must be positive, got " + std::to_string(lora.rank));
  if (lora.targets.empty()) {
    r.fail("[lora] needs lora.targets: some of the " + std::string(models::family_name(c.model)) +
           " model's linear layers (" + joined(models::linear_layers(c.model)) + ") or \"all-linear\"");
  }
  try {
    lora.validate(models::family_name(c.model), models::linear_layers(c.model));
  } catch (const std::invalid_argument& e) {
    r.fail(std::string("[lora] ") + e.what());
  }
  if (models::LoraSpec* spec = models::mutable_lora_spec(c.model)) *spec = lora;
}

// Defaults that depend on other keys.
void resolve_defaults(const Reader& r, TrainConfig& c) {
  if (c.output_dir.empty()) c.output_dir = "runs/" + c.name;
  // (Instructions need train.seq_len given: the model's context would be mostly padding.)
  if (models::is_language_model(c.model) && c.seq_len == 0 && c.data.source != DataSource::Instructions) {
    c.seq_len = models::text_context(c.model);
  }
  DataConfig& d = c.data;
  // Image models read images: the one image source unless data.source says otherwise.
  if (!r.has("data.source") && !models::is_language_model(c.model)) d.source = DataSource::FashionMnist;
  if (checkpoint::is_hf_model_dir(c.init_from)) {
    // A Hugging Face directory brings its tokenizer: tokenizer.json, or GPT-2's vocab.json + merges.txt.
    const std::string dir = c.init_from + "/";
    if (!r.has("data.tokenizer")) {
      if (std::filesystem::exists(dir + "tokenizer.json")) d.tokenizer = data::TokenizerKind::Hf;
      else if (std::filesystem::exists(dir + "vocab.json") && std::filesystem::exists(dir + "merges.txt"))
        d.tokenizer = data::TokenizerKind::Gpt2;
    }
    if (d.tokenizer == data::TokenizerKind::Hf && d.tokenizer_json.empty()) d.tokenizer_json = dir + "tokenizer.json";
    if (d.tokenizer == data::TokenizerKind::Gpt2 && d.vocab_json.empty()) d.vocab_json = dir + "vocab.json";
    if (d.tokenizer == data::TokenizerKind::Gpt2 && d.merges_txt.empty()) d.merges_txt = dir + "merges.txt";
  }
}

}  // namespace

TrainConfig parse_train_config(const std::string& toml_text, const std::string& source_name,
                               const std::vector<std::string>& overrides) {
  toml::table root;
  const ScreenedToml screened = screen_toml(toml_text);
  if (!screened.refusal.empty()) throw ConfigError(source_name + ":" + screened.refusal);
  try {
    root = toml::parse(screened.text, source_name);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << source_name << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
    throw ConfigError(where.str());
  }
  for (const auto& assignment : overrides) apply_override(root, assignment);

  TrainConfig c;
  c.source = source_name;
  const Reader r(root, overrides.empty() ? source_name : source_name + " (with --set overrides)");
  const bool shape_from_hf_dir = read_model_source(r, c);
  for (const ConfigKey& k : config_keys()) {
    if (k.read_first) continue;
    const std::optional<ConfigValue> value = r.value(k.name, k.type, k.may_be_negative);
    if (!value) continue;
    c.keys_given.insert(k.name);
    if (!k.applies(c)) r.fail(k.not_applicable(c));
    if (shape_from_hf_dir && k.set_by_hf_config && !k.free_beside_hf_config(c)) {
      r.fail(k.name + " is set by " + c.init_from + "/config.json (leave it out)");
    }
    try {
      k.set(c, *value);
    } catch (const std::exception& e) {
      r.fail(k.name + " " + e.what());
    }
  }
  r.reject_unknown();
  finish_lora(r, c);
  try {
    models::validate(c.model);
  } catch (const std::invalid_argument& e) {
    r.fail(std::string("[model] ") + e.what());
  }
  resolve_defaults(r, c);
  for (const ConfigKey& k : config_keys()) {
    if (!k.applies(c)) continue;
    if (const std::string problem = k.check(c); !problem.empty()) r.fail(problem);
  }
  return c;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError("config file '" + path + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_train_config(text.str(), path, overrides);
}

void check_this_build_runs(const TrainConfig& c) {
  if (c.device == c10::DeviceType::CUDA && !comm::nccl_backend_built()) {
    throw ConfigError(c.source +
                      ": train.device 'cuda' needs a CUDA build of fsdp.cpp (cmake -DFSDP_CUDA=ON against a CUDA "
                      "libtorch; see docs/gpu.md); this binary is the CPU build");
  }
}

void validate_for_world(const TrainConfig& c, int world_size) {
  if (c.global_batch % (static_cast<int64_t>(world_size) * c.micro_batches) != 0) {
    throw ConfigError(c.source + ": train.global_batch " + std::to_string(c.global_batch) +
                      " is not divisible by ranks x micro-batches (" + std::to_string(world_size) + " x " +
                      std::to_string(c.micro_batches) + ")");
  }
  if (c.fsdp.strategy == runtime::ShardingStrategy::HybridShard && c.fsdp.shard_group_size > 0 &&
      world_size % c.fsdp.shard_group_size != 0) {
    throw ConfigError(c.source + ": fsdp.shard_group_size " + std::to_string(c.fsdp.shard_group_size) +
                      " does not divide the " + std::to_string(world_size) + " ranks (hybrid_shard needs N = R x S)");
  }
}

models::LoraBaseDtype resolved_lora_base_dtype(const TrainConfig& c) {
  using models::LoraBaseDtype;
  if (c.lora_base_dtype != LoraBaseDtype::Auto) return c.lora_base_dtype;
  // The base's own dtype, so that storing it loses nothing: a random base is fp32; published
  // weights are kept in bf16 only when they are bf16, in NF4 when transformers saved them 4-bit
  // (bitsandbytes' NF4); our checkpoints as their run kept them.
  try {
    if (checkpoint::is_checkpoint_dir(c.init_from)) {
      // The run that wrote it resolved its own base_dtype into its config (either quote style:
      // toml++ wrote single quotes before 2026-12-02).
      const std::string saved = checkpoint::read_checkpoint_info(c.init_from).config_toml;
      auto saved_as = [&](const char* dtype) {
        return saved.find(std::string("base_dtype = \"") + dtype + "\"") != std::string::npos ||
               saved.find(std::string("base_dtype = '") + dtype + "'") != std::string::npos;
      };
      return saved_as("nf4")        ? LoraBaseDtype::Nf4
             : saved_as("bfloat16") ? LoraBaseDtype::BFloat16
                                    : LoraBaseDtype::Float32;
    }
    if (!c.init_from.empty() && checkpoint::stored_as_bnb_nf4(c.init_from)) return LoraBaseDtype::Nf4;
    if (!c.init_from.empty() && checkpoint::stored_weights_dtype(c.init_from) == at::kBFloat16) {
      return LoraBaseDtype::BFloat16;
    }
  } catch (const std::exception& e) {
    throw ConfigError(c.source + ": lora.base_dtype 'auto' takes the dtype of model.init_from's weights: " + e.what());
  }
  return LoraBaseDtype::Float32;
}

std::string checkpoints_dir(const TrainConfig& c) {
  return c.checkpoint.dir.empty() ? c.output_dir + "/checkpoints" : c.checkpoint.dir;
}

std::string to_toml(const TrainConfig& c) {
  // Every key that applies, section by section in the declaration's order: the resolved config
  // stands alone (family and every shape field: no zoo entry or config.json needed).
  std::map<std::string, std::string> sections;  // section -> its "key = value" lines
  std::string top;
  for (const ConfigKey& k : config_keys()) {
    if (!k.applies(c) || !k.written(c)) continue;
    if (k.name == "model.init_from" && c.init_from.empty()) continue;
    const std::string section = section_of(k.name);
    const std::string line =
        k.name.substr(section.empty() ? 0 : section.size() + 1) + " = " + toml_value_text(k.get(c)) + "\n";
    (section.empty() ? top : sections[section]) += line;
  }
  std::string text = top;
  for (const std::string& section : known_sections()) {
    auto it = sections.find(section);
    if (it != sections.end()) text += "\n[" + section + "]\n" + it->second;
  }
  return text;
}

std::string list_config_keys() {
  std::ostringstream out;
  std::string section = "-";
  size_t width = 0;
  for (const ConfigKey& k : config_keys()) width = std::max(width, k.name.size());
  for (const ConfigKey& k : config_keys()) {
    const std::string s = section_of(k.name);
    if (s != section) {
      out << (section == "-" ? "" : "\n") << (s.empty() ? "(top level)" : "[" + s + "]") << "\n";
      section = s;
    }
    std::string name = k.name;
    name.resize(width + 2, ' ');
    std::string type = to_string(k.type);
    type.resize(9, ' ');
    out << "  " << name << type << k.help << " (default: " << k.default_text << ")\n";
  }
  return out.str();
}

}  // namespace fsdp::train
