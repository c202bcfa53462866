// fsdp/models/model_family.h: a model family's spec. Each family (gpt_family.cpp, llama_family.cpp,
// ...) implements ModelFamily once, owning what is that family's: its named sizes, its [model]
// config fields, building the model, its FSDP units, LoRA targets, counts and FLOPs, its Hugging
// Face form (config.json and tensor names in and out, PEFT's names), the planner's terms. Callers ask
// family_of(config) and never branch on the family (registry.h keeps the free-function names).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/models/attention_kernel.h"
#include "fsdp/models/built_model.h"
#include "fsdp/models/model_config.h"
#include "fsdp/models/plan_terms.h"

namespace fsdp::models {

class HfConfigReader;  // hf_config_reader.h

// What one sample is and how the family's loss is formed; the trainer, the data and the planner
// follow it, not the family's name.
enum class ModelTask {
  Language,             // token ids -> next-token logits; the chunked loss_sum (GPT, Llama)
  ImageClassification,  // image -> class logits; cross-entropy over the classes (ViT)
  Contrastive,          // image-caption pairs -> two embeddings; the loss over the global batch (CLIP)
  ImageText,            // an image and token ids -> logits; the answer's tokens trained (LLaVA)
};
const char* to_string(ModelTask task);  // "language", "image classification", ...

// One shape field of a family's config, as a config file's [model] table reads it (model.<key>).
// The family declares it once; fsdp-train's reader, the resolved config.toml and --list-keys
// derive the key from it. A key several families have (dim) is one key that applies to each.
struct ModelField {
  std::string key;                                 // "dim": read as model.dim
  std::string help;                                // one line, for --list-keys
  std::variant<int64_t*, double*, bool*> address;  // into the config fields() was asked about
  // A switch read as one of two words instead of true / false (rope_scaling: "llama3" | "none").
  std::string on_word, off_word;
  // May be given beside a Hugging Face directory's config.json, which sets the others (freezing;
  // a Llama's context, its longest sequence).
  bool free_beside_hf_config = false;
  bool may_be_negative = false;  // an index from the end (LLaVA's vision_feature_layer)
  bool written = true;           // whether the resolved config.toml writes it for this config
  std::string default_text;      // --list-keys' default ("": "the model's")
};

// A field bound to `member`: field("dim", c.dim, "width of the residual stream").
template <class T>
ModelField field(std::string key, T& member, std::string help) {
  ModelField f;
  f.key = std::move(key);
  f.help = std::move(help);
  f.address = &member;
  return f;
}

// The images a family reads: square, `side` pixels, `channels` channels, read as `tokens` tokens
// (patches and a class token). All 0 for a family that reads no images.
struct ImageInput {
  int64_t side = 0;
  int64_t channels = 0;
  int64_t tokens = 0;
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  virtual const char* name() const = 0;          // model.family's value: "llama"
  virtual const char* display_name() const = 0;  // as people write it: "Llama", "LLaVA"
  virtual ModelTask task() const = 0;
  // The zoo's named sizes ("llama3-8b"), each named with the family's name first; the first is
  // the config model.family starts from before every field is set.
  virtual std::vector<std::pair<std::string, ModelConfig>> sizes() const = 0;
  // The fields of `config` that [model] keys read and write, in the order config.toml writes them.
  virtual std::vector<ModelField> fields(ModelConfig& config) const = 0;

  // Throws std::invalid_argument naming the bad field.
  virtual void validate(const ModelConfig& config) const = 0;
  virtual BuiltModel build(const ModelConfig& config) const = 0;

  virtual int64_t parameter_count(const ModelConfig& config) const = 0;  // the base, adapters not included
  // The vocabulary of the text read, and the longest text (a caption's for CLIP); 0 without text.
  virtual int64_t vocab_size(const ModelConfig& config) const = 0;
  virtual int64_t text_context(const ModelConfig& config) const = 0;
  // Training FLOPs per sample: per token at sequence length seq (Language), per image, per pair,
  // or per example of seq positions (ImageText).
  virtual double flops_per_sample(const ModelConfig& config, int64_t seq) const = 0;
  virtual ImageInput image_input(const ModelConfig&) const { return {}; }
  // Special tokens of the family's text (-1: none): the end-of-text token a caption's feature is
  // read at (Contrastive), the token each image feature replaces (ImageText).
  virtual int64_t end_of_text_token(const ModelConfig&) const { return -1; }
  virtual int64_t image_token(const ModelConfig&) const { return -1; }
  // A family whose vocabulary is its tokenizer's (a language model) takes the data's number of
  // token ids as its embedding rows; the others keep theirs (special tokens above the bytes).
  virtual void take_data_vocab(ModelConfig&, int64_t) const {}
  // The tokens per sample fsdp-plan assumes when none is given (a language model's usual training
  // length, at most its context); 0: the planner's default.
  virtual int64_t plan_sequence(const ModelConfig&) const { return 0; }
  // Its blocks' attention for one sample of `tokens` tokens (batch 1; masked where a sliding
  // window shorter than the sample masks most layers), for timing CUDA's attention kernels at
  // start (train.attention_kernel = "auto"); nullopt: none timed, libtorch's own order kept.
  virtual std::optional<AttentionCall> attention_call(const ModelConfig&, int64_t) const { return std::nullopt; }

  // FSDP units. The repeated blocks' type names ("LlamaBlock"); the paths of the modules holding
  // the token embedding and output head, which the model calls through fsdp::nn::call so each may
  // be a unit (a tied pair is one path); the towers fsdp.wrap = "tower" makes one unit each.
  virtual std::vector<std::string> block_type_names(const ModelConfig& config) const = 0;
  virtual std::vector<std::string> embedding_and_head_paths(const ModelConfig& config) const = 0;
  virtual std::vector<std::string> tower_paths(const ModelConfig&) const { return {}; }
  // The block types with blocks outside every tower, which stay units of their own under
  // fsdp.wrap = "tower" (LLaVA's Llama blocks); every block type when the family has no towers.
  virtual std::vector<std::string> block_types_outside_towers(const ModelConfig& config) const {
    return block_type_names(config);
  }

  // LoRA: the config's adapter settings (nullptr: the family takes no adapters), the linear
  // layers they may target by name, and those layers' weights over every block (a QLoRA base's
  // NF4 part; 0 where the base is not stored in NF4).
  virtual LoraSpec* lora(ModelConfig&) const { return nullptr; }
  virtual std::vector<std::string> linear_layers(const ModelConfig&) const { return {}; }
  virtual int64_t linear_weight_count(const ModelConfig&) const { return 0; }

  // Its Hugging Face form (checkpoint/hf_model_dir.h, hf_weights.h, peft_adapter.h). The
  // config.json model_type values it reads (empty: the family has no Hugging Face form); the
  // config a config.json describes (refusing, by name, a key whose value it does not implement);
  // and its keys written into `out`, which holds the tokenizer's ids (bos, eos, pad) taken from
  // `source` (the origin's config.json, or null) for the family to keep, move or drop.
  virtual std::vector<std::string> hf_model_types() const { return {}; }
  virtual ModelConfig read_hf_config(const HfConfigReader& config) const;
  virtual void write_hf_config(const ModelConfig& config, const nlohmann::json& source, nlohmann::json& out) const;
  // A parameter's name in Hugging Face's files, the names older files give it, and whether the
  // file stores it transposed (GPT-2's Conv1D).
  virtual std::string hf_name(const ModelConfig&, const std::string& name) const { return name; }
  virtual std::vector<std::string> hf_other_names(const ModelConfig&, const std::string&) const { return {}; }
  virtual bool hf_transposed(const ModelConfig&, const std::string&) const { return false; }
  // Tensors its files may hold that the model does not read (buffers transformers itself
  // recomputes: GPT-2's attention masks, rotary frequencies, CLIP's position ids).
  virtual bool hf_unread_buffer(const std::string&) const { return false; }
  // The transformers class whose files hold exactly the model's tensors, so that any other tensor
  // is a variant not implemented and refused ("CLIPModel"); "": others are left unread, and said.
  virtual std::string hf_exact_architecture() const { return ""; }
  // PEFT: where the causal LM's body sits under base_model.model. ("transformer." for GPT-2),
  // whether its linear weights are fan_in_fan_out, and why no adapter directory can be written
  // for this config ("": it can).
  virtual std::string peft_body_prefix() const { return ""; }
  virtual bool peft_fan_in_fan_out() const { return false; }
  virtual std::string peft_export_refusal(const ModelConfig&) const { return ""; }

  // The memory planner's terms (plan/memory_plan.h, plan_terms.h): why this config cannot be
  // planned yet ("": it can), its units, the parameters that get gradients and optimizer state, the
  // LoRA adapters' parameters, the activations a micro-batch keeps at its peak, and the largest
  // single module (DeepSpeed's "largest layer").
  virtual std::string plan_refusal(const ModelConfig&) const { return ""; }
  virtual PlanUnits plan_units(const ModelConfig& config) const = 0;
  virtual int64_t plan_trainable_params(const ModelConfig& config) const { return parameter_count(config); }
  virtual int64_t plan_adapter_params(const ModelConfig&) const { return 0; }
  virtual int64_t plan_activation_bytes(const ModelConfig& config, const ActivationSettings& settings) const = 0;
  virtual int64_t largest_module_params(const ModelConfig& config) const = 0;
};

// The base of a family whose config is `Config`: `of` gives that config out of a ModelConfig, and
// the config's own validate() and parameter_count() answer for the family.
template <class Config>
class FamilyOf : public ModelFamily {
 public:
  void validate(const ModelConfig& config) const override { of(config).validate(); }
  int64_t parameter_count(const ModelConfig& config) const override { return of(config).parameter_count(); }

 protected:
  static const Config& of(const ModelConfig& c) { return std::get<Config>(c); }
  static Config& of(ModelConfig& c) { return std::get<Config>(c); }
};

// The family whose hf_model_types() has `model_type`; nullptr for none.
const ModelFamily* family_of_hf_model_type(const std::string& model_type);

// The config's family, and every registered family in registration order (model_config.h).
const ModelFamily& family_of(const ModelConfig& config);
const std::vector<const ModelFamily*>& model_families();
// Throws std::invalid_argument "family 'x' (expected gpt, llama, ...)" naming the registered ones.
const ModelFamily& family_named(const std::string& name);
// The family's config with every field at its default (what model.family starts from).
ModelConfig default_model_config(const ModelFamily& family);

}  // namespace fsdp::models
