#include "fsdp/train/config.h"

#include "fsdp/checkpoint/hf_model_dir.h"
#include "fsdp/checkpoint/peft_adapter.h"
#include "fsdp/comm/nccl_process_group.h"
#include "fsdp/plan/memory_plan.h"
#include "toml_screen.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace fsdp::train {

namespace {

// Reads typed values out of a TOML table, remembering which keys it read, so that whatever is left
// is reported as unknown.
class Reader {
 public:
  Reader(const toml::table& root, std::string source) : root_(root), source_(std::move(source)) {}

  template <class T>
  void get(const std::string& key, T& out) {
    if (auto value = find(key)) out = convert<T>(key, *value);
  }
  template <class T>
  std::optional<T> optional(const std::string& key) {
    if (auto value = find(key)) return convert<T>(key, *value);
    return std::nullopt;
  }

  // Throws for the first key never read.
  void reject_unknown() const {
    for (const auto& [section, node] : root_) {
      const std::string section_name(section.str());
      if (const toml::table* table = node.as_table()) {
        if (!known_sections().count(section_name)) {
          fail("unknown section [" + section_name + "] (known: model, data, train, optimizer, fsdp, eval, checkpoint, targets, guard, lora)");
        }
        for (const auto& [key, value] : *table) {
          const std::string path = section_name + "." + std::string(key.str());
          if (!used_.count(path)) fail("unknown key '" + path + "'");
        }
      } else if (!used_.count(section_name)) {
        fail("unknown key '" + section_name + "'");
      }
    }
  }

  [[noreturn]] void fail(const std::string& what) const { throw ConfigError(source_ + ": " + what); }

 private:
  static const std::set<std::string>& known_sections() {
    static const std::set<std::string> sections = {"model", "data", "train", "optimizer", "fsdp", "eval", "checkpoint", "targets", "guard", "lora"};
    return sections;
  }

  const toml::node* find(const std::string& key) {
    used_.insert(key);
    return root_.at_path(key).node();
  }

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

  template <class T>
  T convert(const std::string& key, const toml::node& node) const {
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = node.value_exact<bool>()) return *v;
      fail(key + " must be true or false, got " + type_of(node));
    } else if constexpr (std::is_integral_v<T>) {
      if (auto v = node.value_exact<int64_t>()) {
        if (*v < 0) fail(key + " must not be negative, got " + std::to_string(*v));
        return static_cast<T>(*v);
      }
      fail(key + " must be an integer, got " + type_of(node));
    } else if constexpr (std::is_floating_point_v<T>) {
      if (auto v = node.value_exact<double>()) return *v;
      if (auto v = node.value_exact<int64_t>()) return static_cast<double>(*v);
      fail(key + " must be a number, got " + type_of(node));
    } else {
      if (auto v = node.value_exact<std::string>()) return *v;
      fail(key + " must be a string, got " + type_of(node));
    }
  }

  const toml::table& root_;
  std::string source_;
  std::set<std::string> used_;
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
  if (!non_ascii_outside_strings(text).empty()) {
    is_toml = false;  // text toml++ must not see (toml_screen.h) is not TOML either: a string
  } else {
    try {
      parsed = toml::parse("value = " + text);
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

void check(bool ok, Reader& reader, const std::string& what) {
  if (!ok) reader.fail(what);
}

// Where the model's shape comes from, in this order: model.family (every field explicit, as a run's
// resolved config.toml writes it), a Hugging Face directory in model.init_from (its config.json),
// or model.name from the zoo.
void read_model(Reader& r, TrainConfig& c) {
  auto name = r.optional<std::string>("model.name");
  auto family_key = r.optional<std::string>("model.family");
  r.get("model.init_from", c.init_from);
  bool from_hf_dir = false;
  if (family_key) {
    if (*family_key == "gpt") {
      c.model = models::GptConfig{};
    } else if (*family_key == "llama") {
      c.model = models::LlamaConfig{};
    } else if (*family_key == "vit") {
      c.model = models::VitConfig{};
    } else {
      r.fail("model.family '" + *family_key + "' (expected gpt, llama or vit)");
    }
    c.model_name = name ? *name : *family_key;
  } else if (!c.init_from.empty() && checkpoint::is_hf_model_dir(c.init_from)) {
    try {
      c.model = checkpoint::read_hf_config(c.init_from);
    } catch (const std::exception& e) {
      r.fail(std::string("model.init_from: ") + e.what());
    }
    from_hf_dir = true;
    std::string label = c.init_from;
    while (label.size() > 1 && label.back() == '/') label.pop_back();
    c.model_name = name ? *name : label.substr(label.find_last_of('/') + 1);
    c.model_vocab = std::visit(
        [](const auto& m) -> int64_t {
          if constexpr (std::is_same_v<std::decay_t<decltype(m)>, models::VitConfig>) {
            return 0;
          } else {
            return m.vocab;
          }
        },
        c.model);
  } else if (name) {
    c.model_name = *name;
    try {
      c.model = models::model_config(*name);
    } catch (const std::invalid_argument& e) {
      r.fail(std::string("model.name: ") + e.what());
    }
  } else if (!c.init_from.empty()) {
    r.fail("model.init_from '" + c.init_from + "' is not a Hugging Face model directory (no config.json there); give "
           "model.name for weights without one");
  } else {
    r.fail("model.name is required (e.g. \"gpt-tiny\"; see fsdp-train --list-models), unless model.init_from names a "
           "Hugging Face model directory (one with a config.json)");
  }
  // Size overrides: each applies to the families that have the field.
  const std::string family = models::family_name(c.model);
  std::map<std::string, int64_t> ints;
  for (const char* key : {"context", "dim", "heads", "kv_heads", "layers", "ffn_hidden", "mlp_hidden", "patch", "image_size",
                          "channels", "classes"}) {
    if (auto v = r.optional<int64_t>(std::string("model.") + key)) ints[key] = *v;
  }
  const auto vocab = r.optional<int64_t>("model.vocab");
  if (vocab) {
    if (!models::is_language_model(c.model)) r.fail("model.vocab does not apply to " + family + " models");
    c.model_vocab = *vocab;
    if (auto* g = std::get_if<models::GptConfig>(&c.model)) g->vocab = *vocab;
    if (auto* l = std::get_if<models::LlamaConfig>(&c.model)) l->vocab = *vocab;
  }
  auto dropout = r.optional<double>("model.dropout");
  auto rope_theta = r.optional<double>("model.rope_theta");
  auto qkv_bias = r.optional<bool>("model.qkv_bias");
  auto norm_eps = r.optional<double>("model.norm_eps");
  auto tie_embeddings = r.optional<bool>("model.tie_embeddings");
  auto rope_scaling = r.optional<std::string>("model.rope_scaling");
  auto rope_factor = r.optional<double>("model.rope_scaling_factor");
  auto rope_low = r.optional<double>("model.rope_low_freq_factor");
  auto rope_high = r.optional<double>("model.rope_high_freq_factor");
  auto rope_original = r.optional<int64_t>("model.rope_original_context");
  auto not_for = [&](const std::string& key) {
    r.fail("model." + key + " does not apply to " + family + " models");
  };
  if (from_hf_dir) {
    // The directory's config.json sets the shape; only dropout and (Llama: no learned positions)
    // the longest sequence may change.
    const bool llama = std::holds_alternative<models::LlamaConfig>(c.model);
    for (const auto& [key, value] : ints) {
      if (key != "context" || !llama) r.fail("model." + key + " is set by " + c.init_from + "/config.json (leave it out)");
    }
    if (vocab) r.fail("model.vocab is set by " + c.init_from + "/config.json (leave it out)");
    if (rope_theta || qkv_bias || norm_eps || tie_embeddings || rope_scaling || rope_factor || rope_low || rope_high || rope_original) {
      r.fail("the model's shape and rotary settings are set by " + c.init_from + "/config.json (leave model.* out but context and dropout)");
    }
  }
  auto take = [&](const char* key, int64_t& field) {
    auto it = ints.find(key);
    if (it != ints.end()) {
      field = it->second;
      ints.erase(it);
    }
  };
  if (auto* g = std::get_if<models::GptConfig>(&c.model)) {
    take("context", g->context), take("dim", g->dim), take("heads", g->heads), take("layers", g->layers);
    if (dropout) g->dropout = *dropout;
    if (qkv_bias) g->qkv_bias = *qkv_bias;
    if (rope_theta) not_for("rope_theta");
    if (norm_eps || tie_embeddings || rope_scaling || rope_factor || rope_low || rope_high || rope_original) {
      r.fail("model.norm_eps, tie_embeddings and rope_* do not apply to gpt models");
    }
  } else if (auto* l = std::get_if<models::LlamaConfig>(&c.model)) {
    take("context", l->context), take("dim", l->dim), take("heads", l->heads), take("kv_heads", l->kv_heads);
    take("layers", l->layers), take("ffn_hidden", l->ffn_hidden);
    if (rope_theta) l->rope_theta = *rope_theta;
    if (norm_eps) l->norm_eps = *norm_eps;
    if (tie_embeddings) l->tie_embeddings = *tie_embeddings;
    if (rope_scaling) {
      if (*rope_scaling != "llama3" && *rope_scaling != "none") r.fail("model.rope_scaling '" + *rope_scaling + "' (expected llama3 or none)");
      l->rope_scaling.enabled = *rope_scaling == "llama3";
    }
    if (rope_factor) l->rope_scaling.factor = *rope_factor;
    if (rope_low) l->rope_scaling.low_freq_factor = *rope_low;
    if (rope_high) l->rope_scaling.high_freq_factor = *rope_high;
    if (rope_original) l->rope_scaling.original_context = *rope_original;
    if (dropout) not_for("dropout");
    if (qkv_bias) not_for("qkv_bias");
  } else if (auto* v = std::get_if<models::VitConfig>(&c.model)) {
    take("dim", v->dim), take("heads", v->heads), take("layers", v->layers), take("mlp_hidden", v->mlp_hidden);
    take("patch", v->patch), take("image_size", v->image_size), take("channels", v->channels), take("classes", v->classes);
    if (dropout) not_for("dropout");
    if (qkv_bias) not_for("qkv_bias");
    if (rope_theta) not_for("rope_theta");
    if (norm_eps || tie_embeddings || rope_scaling || rope_factor || rope_low || rope_high || rope_original) {
      r.fail("model.norm_eps, tie_embeddings and rope_* do not apply to vit models");
    }
  }
  if (!ints.empty()) not_for(ints.begin()->first);
  try {
    models::validate(c.model);
  } catch (const std::invalid_argument& e) {
    r.fail(std::string("[model] ") + e.what());
  }
}

// [lora]: adapters on the named linear layers of a frozen base (models/layers.h, LoraSpec).
void read_lora(Reader& r, TrainConfig& c) {
  auto rank = r.optional<int64_t>("lora.rank");
  auto alpha = r.optional<double>("lora.alpha");
  auto dropout = r.optional<double>("lora.dropout");
  auto targets = r.optional<std::string>("lora.targets");
  r.get("lora.base_dtype", c.lora_base_dtype);
  r.get("lora.init_adapter", c.lora_init_adapter);
  if (!c.lora_init_adapter.empty()) {
    // A PEFT adapter to continue: its settings fill the keys left out, and must equal those given.
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
    if (rank && *rank != adapter.rank) conflict("rank", std::to_string(*rank), "r = " + std::to_string(adapter.rank));
    if (alpha && *alpha != adapter.alpha) conflict("alpha", std::to_string(*alpha), "lora_alpha = " + std::to_string(adapter.alpha));
    if (targets) {
      auto ours = models::LoraSpec::parse_targets(*targets), theirs = adapter.targets;
      std::sort(ours.begin(), ours.end());
      std::sort(theirs.begin(), theirs.end());
      if (ours != theirs) {
        std::string listed;
        for (const auto& t : adapter.targets) listed += (listed.empty() ? "" : " ") + t;
        conflict("targets", "\"" + *targets + "\"", "target_modules \"" + listed + "\"");
      }
    }
    if (!rank) rank = adapter.rank;
    if (!alpha) alpha = adapter.alpha;
    if (!dropout) dropout = adapter.dropout;
    if (!targets) {
      std::string listed;
      for (const auto& t : adapter.targets) listed += (listed.empty() ? "" : " ") + t;
      targets = listed;
    }
  }
  if (!rank && !alpha && !dropout && !targets) return;
  models::LoraSpec spec;
  if (!rank) r.fail("[lora] needs lora.rank (e.g. 8)");
  if (*rank <= 0) r.fail("lora.rank must be positive, got " + std::to_string(*rank));
  spec.rank = *rank;
  if (alpha) spec.alpha = *alpha;
  if (dropout) spec.dropout = *dropout;
  if (!targets) r.fail("[lora] needs lora.targets, e.g. \"q_proj k_proj v_proj o_proj\" (Llama) or \"c_attn\" (GPT-2)");
  spec.targets = models::LoraSpec::parse_targets(*targets);
  if (auto* g = std::get_if<models::GptConfig>(&c.model)) g->lora = spec;
  else if (auto* l = std::get_if<models::LlamaConfig>(&c.model)) l->lora = spec;
  else r.fail("[lora] applies to the gpt and llama families, not " + std::string(models::family_name(c.model)));
  try {
    models::validate(c.model);
  } catch (const std::invalid_argument& e) {
    r.fail(std::string("[lora] ") + e.what());
  }
  if (c.lora_base_dtype != "bfloat16" && c.lora_base_dtype != "float32") {
    r.fail("lora.base_dtype '" + c.lora_base_dtype + "' (expected bfloat16 or float32)");
  }
}

}  // namespace

TrainConfig parse_train_config(const std::string& toml_text, const std::string& source_name,
                               const std::vector<std::string>& overrides) {
  toml::table root;
  if (const std::string where = non_ascii_outside_strings(toml_text); !where.empty()) {
    throw ConfigError(source_name + ":" + where);
  }
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << source_name << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
    throw ConfigError(where.str());
  }
  for (const auto& assignment : overrides) apply_override(root, assignment);

  TrainConfig c;
  c.source = source_name;
  Reader r(root, overrides.empty() ? source_name : source_name + " (with --set overrides)");
  r.get("name", c.name);
  r.get("seed", c.seed);
  r.get("output_dir", c.output_dir);
  if (c.output_dir.empty()) c.output_dir = "runs/" + c.name;
  read_model(r, c);

  DataConfig& d = c.data;
  r.get("data.source", d.source);
  r.get("data.dir", d.dir);
  const bool tokenizer_set = r.optional<std::string>("data.tokenizer").has_value();
  r.get("data.tokenizer", d.tokenizer);
  r.get("data.vocab_json", d.vocab_json);
  r.get("data.merges_txt", d.merges_txt);
  r.get("data.tokenizer_json", d.tokenizer_json);
  r.get("data.validation_percent", d.validation_percent);
  r.get("data.train_tokens", d.train_tokens);
  r.get("data.validation_tokens", d.validation_tokens);
  r.get("data.augment", d.augment);
  r.get("data.train_jsonl", d.train_jsonl);
  r.get("data.validation_jsonl", d.validation_jsonl);
  r.get("data.chat_format", d.chat_format);
  if (checkpoint::is_hf_model_dir(c.init_from)) {
    // A Hugging Face directory brings its tokenizer: tokenizer.json, or GPT-2's vocab.json + merges.txt.
    const std::string dir = c.init_from + "/";
    if (!tokenizer_set) {
      if (std::filesystem::exists(dir + "tokenizer.json")) d.tokenizer = "hf";
      else if (std::filesystem::exists(dir + "vocab.json") && std::filesystem::exists(dir + "merges.txt")) d.tokenizer = "gpt2";
    }
    if (d.tokenizer == "hf" && d.tokenizer_json.empty()) d.tokenizer_json = dir + "tokenizer.json";
    if (d.tokenizer == "gpt2" && d.vocab_json.empty()) d.vocab_json = dir + "vocab.json";
    if (d.tokenizer == "gpt2" && d.merges_txt.empty()) d.merges_txt = dir + "merges.txt";
  }

  r.get("train.steps", c.steps);
  r.get("train.global_batch", c.global_batch);
  r.get("train.micro_batches", c.micro_batches);
  r.get("train.seq_len", c.seq_len);
  r.get("train.sync_each_micro_batch", c.sync_each_micro_batch);
  r.get("train.grad_clip", c.grad_clip);
  r.get("train.max_nonfinite_steps", c.max_nonfinite_steps);
  r.get("guard.spike_zscore", c.guard.spike_zscore);
  r.get("guard.window", c.guard.window);
  r.get("guard.rollback_after", c.guard.rollback_after);
  r.get("guard.max_rollbacks", c.guard.max_rollbacks);
  r.get("train.log_every", c.log_every);
  r.get("train.threads", c.threads);
  r.get("train.device", c.device);
  r.get("train.device_memory_fraction", c.device_memory_fraction);

  OptimizerConfig& o = c.optimizer;
  r.get("optimizer.name", o.name);
  r.get("optimizer.lr", o.lr);
  r.get("optimizer.min_lr", o.min_lr);
  r.get("optimizer.warmup_steps", o.warmup_steps);
  r.get("optimizer.weight_decay", o.weight_decay);
  r.get("optimizer.beta1", o.beta1);
  r.get("optimizer.beta2", o.beta2);
  r.get("optimizer.eps", o.eps);
  r.get("optimizer.momentum", o.momentum);

  r.get("fsdp.strategy", c.fsdp.strategy);
  r.get("fsdp.wrap", c.fsdp.wrap);
  r.get("fsdp.min_params", c.fsdp.min_params);
  r.get("fsdp.embedding_units", c.fsdp.embedding_units);
  r.get("fsdp.prefetch", c.fsdp.prefetch);
  r.get("fsdp.max_inflight", c.fsdp.max_inflight);
  r.get("fsdp.param_dtype", c.fsdp.param_dtype);
  r.get("fsdp.reduce_dtype", c.fsdp.reduce_dtype);
  r.get("fsdp.activation_checkpointing", c.fsdp.activation_checkpointing);
  r.get("fsdp.shard_group_size", c.fsdp.shard_group_size);
  r.get("fsdp.cpu_offload", c.fsdp.cpu_offload);

  EvalConfig& e = c.eval;
  r.get("eval.every", e.every);
  r.get("eval.batches", e.batches);
  r.get("eval.max_items", e.max_items);
  r.get("eval.sample_tokens", e.sample_tokens);
  r.get("eval.prompt", e.prompt);
  r.get("eval.temperature", e.temperature);
  r.get("eval.top_k", e.top_k);
  r.get("checkpoint.every", c.checkpoint.every);
  r.get("checkpoint.keep", c.checkpoint.keep);
  r.get("checkpoint.dir", c.checkpoint.dir);
  r.get("train.report_every", c.report_every);
  r.get("train.loss_chunk_tokens", c.loss_chunk_tokens);
  r.get("train.fused_ops", c.fused_ops);
  read_lora(r, c);
  TargetsConfig& t = c.targets;
  r.get("targets.min_tokens_per_second", t.min_tokens_per_second);
  r.get("targets.max_step_seconds", t.max_step_seconds);
  if (auto memory = r.optional<std::string>("targets.max_memory_per_rank")) {
    try {
      t.max_memory_per_rank = plan::parse_bytes(*memory);
    } catch (const std::exception& e) {
      r.fail(std::string("targets.max_memory_per_rank: ") + e.what());
    }
  }
  r.get("targets.max_validation_loss", t.max_validation_loss);
  r.get("targets.max_validation_loss_step", t.max_validation_loss_step);
  r.get("targets.price_per_device_hour", t.price_per_device_hour);
  r.get("targets.max_cost", t.max_cost);
  r.get("targets.stop", t.stop);
  r.reject_unknown();
  check(t.min_tokens_per_second >= 0 && t.max_step_seconds >= 0 && t.max_validation_loss >= 0 && t.max_cost >= 0 &&
            t.price_per_device_hour >= 0,
        r, "[targets] values must not be negative");
  check(t.max_cost == 0 || t.price_per_device_hour > 0, r, "targets.max_cost needs targets.price_per_device_hour");
  check(t.max_validation_loss_step == 0 || t.max_validation_loss > 0, r,
        "targets.max_validation_loss_step needs targets.max_validation_loss");

  // Values that parse but cannot work.
  const bool language = models::is_language_model(c.model);
  check(d.source == "fortunes" || d.source == "token_files" || d.source == "instructions" || d.source == "fashion_mnist", r,
        "data.source '" + d.source + "' (expected fortunes, token_files, instructions or fashion_mnist)");
  check(language == (d.source != "fashion_mnist"), r,
        "data.source '" + d.source + "' does not suit the " + models::family_name(c.model) + " model '" + c.model_name +
            "' (" + (language ? "language models read fortunes, token_files or instructions" : "ViT reads fashion_mnist") + ")");
  check(d.source != "instructions" || !d.train_jsonl.empty(), r,
        "data.source 'instructions' needs data.train_jsonl (JSONL of {\"messages\": [...]} or {\"prompt\", \"completion\"}; "
        "fsdp-data instructions makes one from the fortunes)");
  check(d.source != "instructions" || c.seq_len > 0, r,
        "data.source 'instructions' needs train.seq_len: each example is a row padded to it (the model's context, "
        "often 8k to 128k tokens, would mostly be padding)");
  check(d.chat_format == "auto" || d.chat_format == "llama3" || d.chat_format == "plain", r,
        "data.chat_format '" + d.chat_format + "' (expected auto, llama3 or plain)");
  check(d.augment == "none" || ((d.augment == "hflip" || d.augment == "shift" || d.augment == "shift+hflip") && !language), r,
        "data.augment '" + d.augment + "' (expected none, or for images hflip, shift or shift+hflip)");
  check(d.tokenizer == "byte" || d.tokenizer == "gpt2" || d.tokenizer == "hf", r,
        "data.tokenizer '" + d.tokenizer + "' (expected byte, gpt2 or hf)");
  check(d.tokenizer != "gpt2" || (!d.vocab_json.empty() && !d.merges_txt.empty()), r,
        "data.tokenizer 'gpt2' needs data.vocab_json and data.merges_txt");
  check(d.tokenizer != "hf" || !d.tokenizer_json.empty(), r,
        "data.tokenizer 'hf' needs data.tokenizer_json (a Hugging Face tokenizer.json)");
  check(d.source != "token_files" || (!d.train_tokens.empty() && !d.validation_tokens.empty()), r,
        "data.source 'token_files' needs data.train_tokens and data.validation_tokens (made by fsdp-data)");
  check(d.validation_percent >= 1 && d.validation_percent <= 50, r, "data.validation_percent must be in [1, 50]");
  check(c.steps >= 1, r, "train.steps must be at least 1");
  check(c.global_batch >= 1, r, "train.global_batch must be at least 1");
  check(c.micro_batches >= 1, r, "train.micro_batches must be at least 1");
  check(c.seq_len == 0 || c.seq_len >= 2, r, "train.seq_len must be at least 2");
  check(c.log_every >= 1, r, "train.log_every must be at least 1");
  check(c.loss_chunk_tokens >= 0, r, "train.loss_chunk_tokens must be 0 (off) or positive");
  check(c.max_nonfinite_steps >= 1, r, "train.max_nonfinite_steps must be at least 1");
  check(c.guard.spike_zscore >= 0, r, "guard.spike_zscore must be 0 (off) or positive");
  check(c.guard.window >= 2, r, "guard.window must be at least 2 (a standard deviation needs two losses)");
  check(c.guard.rollback_after >= 0, r, "guard.rollback_after must be 0 (never) or positive");
  check(c.guard.max_rollbacks >= 1, r, "guard.max_rollbacks must be at least 1");
  check(c.guard.rollback_after == 0 || c.checkpoint.every > 0, r,
        "guard.rollback_after needs checkpoints to roll back to: set checkpoint.every");
  if (language) {
    const int64_t model_context = std::visit(
        [](const auto& m) -> int64_t {
          if constexpr (std::is_same_v<std::decay_t<decltype(m)>, models::VitConfig>) {
            return 0;
          } else {
            return m.context;
          }
        },
        c.model);
    if (c.seq_len == 0) c.seq_len = model_context;
    check(c.seq_len <= model_context, r,
          "train.seq_len " + std::to_string(c.seq_len) + " exceeds the model's context of " +
              std::to_string(model_context) + " (raise model.context)");
  }
  check(c.device == "cpu" || c.device == "cuda", r, "train.device '" + c.device + "' (expected cpu or cuda)");
  check(c.device_memory_fraction >= 0.0 && c.device_memory_fraction <= 1.0, r,
        "train.device_memory_fraction must be in [0, 1] (0: no cap)");
  check(c.device_memory_fraction == 0.0 || c.device == "cuda", r,
        "train.device_memory_fraction caps GPU memory: it needs train.device 'cuda'");
  check(c.device != "cuda" || comm::nccl_backend_built(), r,
        "train.device 'cuda' needs a CUDA build of fsdp.cpp (cmake -DFSDP_CUDA=ON against a CUDA libtorch; "
        "see README, 'GPU build'); this binary is the CPU build");
  check(o.name == "adamw" || o.name == "sgd", r, "optimizer.name '" + o.name + "' (expected adamw or sgd)");
  check(o.lr > 0, r, "optimizer.lr must be positive");
  check(o.min_lr >= 0 && o.min_lr <= o.lr, r, "optimizer.min_lr must be in [0, optimizer.lr]");
  check(o.warmup_steps <= c.steps, r, "optimizer.warmup_steps exceeds train.steps");
  check(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, r, "optimizer.beta1 and beta2 must be in [0, 1)");
  check(o.eps > 0, r, "optimizer.eps must be positive");
  check(c.fsdp.strategy == "full_shard" || c.fsdp.strategy == "shard_grad_op" || c.fsdp.strategy == "no_shard" ||
            c.fsdp.strategy == "hybrid_shard",
        r, "fsdp.strategy '" + c.fsdp.strategy + "' (expected full_shard, shard_grad_op, no_shard or hybrid_shard)");
  check(!c.fsdp.cpu_offload || c.fsdp.strategy != "no_shard", r,
        "fsdp.cpu_offload needs a sharding strategy (full_shard, shard_grad_op or hybrid_shard), not no_shard");
  check(!c.fsdp.cpu_offload || c.device == "cuda", r,
        "fsdp.cpu_offload moves shards from the GPU to host memory: it needs train.device 'cuda' (on the CPU they are there already)");
  check(c.fsdp.shard_group_size >= 0, r, "fsdp.shard_group_size must be 0 (the ranks of one node) or more");
  check(c.fsdp.shard_group_size == 0 || c.fsdp.strategy == "hybrid_shard", r,
        "fsdp.shard_group_size applies to fsdp.strategy 'hybrid_shard' only (strategy is '" + c.fsdp.strategy + "')");
  check(c.fsdp.wrap == "block" || c.fsdp.wrap == "root" || c.fsdp.wrap == "min_params", r,
        "fsdp.wrap '" + c.fsdp.wrap + "' (expected block, root or min_params)");
  check(c.fsdp.wrap != "min_params" || c.fsdp.min_params > 0, r, "fsdp.wrap 'min_params' needs fsdp.min_params > 0");
  check(c.fsdp.max_inflight >= 0 && c.fsdp.max_inflight <= 64, r, "fsdp.max_inflight must be in [0, 64]");
  for (const std::string* dtype : {&c.fsdp.param_dtype, &c.fsdp.reduce_dtype}) {
    check(*dtype == "float32" || *dtype == "bfloat16", r,
          "fsdp." + std::string(dtype == &c.fsdp.param_dtype ? "param_dtype" : "reduce_dtype") + " '" + *dtype +
              "' (expected float32 or bfloat16)");
  }
  check(c.fsdp.param_dtype == "float32" || c.fsdp.strategy != "no_shard", r,
        "fsdp.param_dtype 'bfloat16' needs fsdp.strategy full_shard, shard_grad_op or hybrid_shard (no_shard keeps "
        "float32)");
  check(c.fsdp.reduce_dtype == "float32" || c.fsdp.strategy != "no_shard", r,
        "fsdp.reduce_dtype 'bfloat16' needs fsdp.strategy full_shard, shard_grad_op or hybrid_shard");
  check(e.batches >= 1, r, "eval.batches must be at least 1");
  check(e.temperature > 0, r, "eval.temperature must be positive");
  check(e.top_k >= 1, r, "eval.top_k must be at least 1");
  return c;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError("config file '" + path + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_train_config(text.str(), path, overrides);
}

void validate_for_world(const TrainConfig& c, int world_size) {
  if (c.global_batch % (static_cast<int64_t>(world_size) * c.micro_batches) != 0) {
    throw ConfigError(c.source + ": train.global_batch " + std::to_string(c.global_batch) +
                      " is not divisible by ranks x micro-batches (" + std::to_string(world_size) + " x " +
                      std::to_string(c.micro_batches) + ")");
  }
  if (c.fsdp.strategy == "hybrid_shard" && c.fsdp.shard_group_size > 0 && world_size % c.fsdp.shard_group_size != 0) {
    throw ConfigError(c.source + ": fsdp.shard_group_size " + std::to_string(c.fsdp.shard_group_size) +
                      " does not divide the " + std::to_string(world_size) + " ranks (hybrid_shard needs N = R x S)");
  }
}

std::string checkpoints_dir(const TrainConfig& c) {
  return c.checkpoint.dir.empty() ? c.output_dir + "/checkpoints" : c.checkpoint.dir;
}

std::string to_toml(const TrainConfig& c) {
  // family and every field: the resolved config stands alone (no zoo entry or config.json needed).
  toml::table model{{"name", c.model_name}, {"family", models::family_name(c.model)}};
  if (!c.init_from.empty()) model.insert("init_from", c.init_from);
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        model.insert("dim", m.dim);
        model.insert("heads", m.heads);
        model.insert("layers", m.layers);
        if constexpr (std::is_same_v<M, models::GptConfig>) {
          model.insert("context", m.context);
          model.insert("vocab", m.vocab);
          model.insert("dropout", m.dropout);
          model.insert("qkv_bias", m.qkv_bias);
        } else if constexpr (std::is_same_v<M, models::LlamaConfig>) {
          model.insert("context", m.context);
          model.insert("vocab", m.vocab);
          model.insert("kv_heads", m.kv_heads);
          model.insert("ffn_hidden", m.ffn_hidden);
          model.insert("rope_theta", m.rope_theta);
          model.insert("norm_eps", m.norm_eps);
          model.insert("tie_embeddings", m.tie_embeddings);
          model.insert("rope_scaling", m.rope_scaling.enabled ? "llama3" : "none");
          if (m.rope_scaling.enabled) {
            model.insert("rope_scaling_factor", m.rope_scaling.factor);
            model.insert("rope_low_freq_factor", m.rope_scaling.low_freq_factor);
            model.insert("rope_high_freq_factor", m.rope_scaling.high_freq_factor);
            model.insert("rope_original_context", m.rope_scaling.original_context);
          }
        } else {
          model.insert("patch", m.patch);
          model.insert("mlp_hidden", m.mlp_hidden);
          model.insert("image_size", m.image_size);
          model.insert("channels", m.channels);
          model.insert("classes", m.classes);
        }
      },
      c.model);
  toml::table root{
      {"name", c.name},
      {"seed", static_cast<int64_t>(c.seed)},
      {"output_dir", c.output_dir},
      {"model", model},
      {"data", toml::table{{"source", c.data.source},
                           {"dir", c.data.dir},
                           {"tokenizer", c.data.tokenizer},
                           {"vocab_json", c.data.vocab_json},
                           {"merges_txt", c.data.merges_txt},
                           {"tokenizer_json", c.data.tokenizer_json},
                           {"validation_percent", c.data.validation_percent},
                           {"train_tokens", c.data.train_tokens},
                           {"validation_tokens", c.data.validation_tokens},
                           {"augment", c.data.augment},
                           {"train_jsonl", c.data.train_jsonl},
                           {"validation_jsonl", c.data.validation_jsonl},
                           {"chat_format", c.data.chat_format}}},
      {"train", toml::table{{"steps", c.steps},
                            {"global_batch", c.global_batch},
                            {"micro_batches", c.micro_batches},
                            {"seq_len", c.seq_len},
                            {"sync_each_micro_batch", c.sync_each_micro_batch},
                            {"grad_clip", c.grad_clip},
                            {"max_nonfinite_steps", c.max_nonfinite_steps},
                            {"log_every", c.log_every},
                            {"threads", c.threads},
                            {"device", c.device},
                            {"device_memory_fraction", c.device_memory_fraction}}},
      {"optimizer", toml::table{{"name", c.optimizer.name},
                                {"lr", c.optimizer.lr},
                                {"min_lr", c.optimizer.min_lr},
                                {"warmup_steps", c.optimizer.warmup_steps},
                                {"weight_decay", c.optimizer.weight_decay},
                                {"beta1", c.optimizer.beta1},
                                {"beta2", c.optimizer.beta2},
                                {"eps", c.optimizer.eps},
                                {"momentum", c.optimizer.momentum}}},
      {"fsdp", toml::table{{"strategy", c.fsdp.strategy},
                           {"wrap", c.fsdp.wrap},
                           {"min_params", c.fsdp.min_params},
                           {"embedding_units", c.fsdp.embedding_units},
                           {"prefetch", c.fsdp.prefetch},
                           {"max_inflight", c.fsdp.max_inflight},
                           {"param_dtype", c.fsdp.param_dtype},
                           {"reduce_dtype", c.fsdp.reduce_dtype},
                           {"activation_checkpointing", c.fsdp.activation_checkpointing},
                           {"shard_group_size", c.fsdp.shard_group_size},
                           {"cpu_offload", c.fsdp.cpu_offload}}},
      {"eval", toml::table{{"every", c.eval.every},
                           {"batches", c.eval.batches},
                           {"max_items", c.eval.max_items},
                           {"sample_tokens", c.eval.sample_tokens},
                           {"prompt", c.eval.prompt},
                           {"temperature", c.eval.temperature},
                           {"top_k", c.eval.top_k}}},
      {"checkpoint", toml::table{{"every", c.checkpoint.every}, {"keep", c.checkpoint.keep}, {"dir", c.checkpoint.dir}}},
  };
  root["train"].as_table()->insert("report_every", c.report_every);
  root["train"].as_table()->insert("loss_chunk_tokens", c.loss_chunk_tokens);
  root["train"].as_table()->insert("fused_ops", c.fused_ops);
  const models::LoraSpec* lora = models::lora_spec(c.model);
  if (lora != nullptr && lora->enabled()) {
    std::string targets;
    for (const auto& t : lora->targets) targets += (targets.empty() ? "" : " ") + t;
    root.insert("lora", toml::table{{"rank", lora->rank}, {"alpha", lora->alpha}, {"dropout", lora->dropout},
                                    {"targets", targets}, {"base_dtype", c.lora_base_dtype}});
  }
  if (c.guard.any()) {
    root.insert("guard", toml::table{{"spike_zscore", c.guard.spike_zscore},
                                     {"window", c.guard.window},
                                     {"rollback_after", c.guard.rollback_after},
                                     {"max_rollbacks", c.guard.max_rollbacks}});
  }
  if (c.targets.any()) {
    const TargetsConfig& t = c.targets;
    toml::table targets{{"stop", t.stop}};
    if (t.min_tokens_per_second > 0) targets.insert("min_tokens_per_second", t.min_tokens_per_second);
    if (t.max_step_seconds > 0) targets.insert("max_step_seconds", t.max_step_seconds);
    if (t.max_memory_per_rank > 0) targets.insert("max_memory_per_rank", std::to_string(t.max_memory_per_rank) + "B");
    if (t.max_validation_loss > 0) {
      targets.insert("max_validation_loss", t.max_validation_loss);
      targets.insert("max_validation_loss_step", t.max_validation_loss_step);
    }
    if (t.price_per_device_hour > 0) targets.insert("price_per_device_hour", t.price_per_device_hour);
    if (t.max_cost > 0) targets.insert("max_cost", t.max_cost);
    root.insert("targets", targets);
  }
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

}  // namespace fsdp::train
