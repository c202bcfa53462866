// fsdp/train/config.h: the training configuration: a TOML file plus command-line overrides.
//
// Its keys are not listed here (such a list drifts): `fsdp-train --list-keys` prints every key with
// its type, help and default, from the one declaration each has. The sections: top level (name,
// seed, output_dir), [model], [data], [train], [optimizer], [fsdp], [loss_scale], [eval],
// [checkpoint], [guard], [lora], [targets]. [model] takes the model from the zoo (name), a Hugging
// Face directory (init_from) or a family with every shape key (family, as a resolved config.toml
// writes it); its shape keys are the families' fields (models::ModelFamily::fields).
// Every key is declared once (src/train/config_keys.cpp: name, member, type, help, check). Every
// key is optional except model.name (or init_from, or family). Unknown keys, values of the wrong type and impossible
// values are errors that name the key and the file. Overrides use the same dotted keys: `--set train.steps=50 --set
// optimizer.lr=1e-3`; the value is read as TOML (a bare word that is not TOML is taken as a string).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include "fsdp/data/chat_format.h"
#include "fsdp/data/image_augment.h"
#include "fsdp/data/tokenizer_kind.h"
#include "fsdp/models/attention.h"
#include "fsdp/models/attention_kernel.h"
#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/lora_base_dtype.h"
#include "fsdp/models/registry.h"
#include "fsdp/optim/adamw_kernel.h"
#include "fsdp/optim/optimizer_kind.h"
#include "fsdp/runtime/device_names.h"
#include "fsdp/runtime/dtype_names.h"
#include "fsdp/runtime/sharding_settings.h"
#include "fsdp/train/data_source.h"

namespace fsdp::train {

// Bad configuration: the message names the file (or override) and the key.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct DataConfig {
  DataSource source = DataSource::Fortunes;
  std::string dir;                                            // fortunes or Fashion-MNIST directory ("" = Debian's)
  data::TokenizerKind tokenizer = data::TokenizerKind::Byte;  // byte | gpt2 | hf (fortunes source)
  std::string vocab_json, merges_txt;                         // gpt2 tokenizer files
  std::string tokenizer_json;                                 // hf: a Hugging Face tokenizer.json (byte-level BPE)
  int validation_percent = 5;                                 // fortunes: share of documents held out
  std::string train_tokens, validation_tokens;                // token_files: files made by fsdp-data
  // images: none | hflip (mirror half) | shift (up to 2 px) | shift+hflip
  data::ImageAugment augment = data::ImageAugment::None;
  // instructions: JSONL of {"messages": [{"role", "content"}, ...]} or {"prompt", "completion"}
  // (data/instructions.h); without validation_jsonl, validation_percent of the examples are held out.
  std::string train_jsonl, validation_jsonl;
  // instructions: the chat format (data/instructions.h); empty is "auto": the one the tokenizer's tokens tell
  std::optional<data::ChatFormat> chat_format;
  // instructions: several examples to a row, each attending only to itself (data/packed_instructions.h)
  bool packing = false;
  // fortunes and token_files: a window's documents (ended by the end-of-text token) attend only to
  // themselves, positions restarting at each, as packed examples do
  bool document_masking = false;
  // instructions: special-token text in a message ("<|eot_id|>") stays text (true) instead of
  // becoming the control token (false, transformers' default)
  bool split_special_tokens = false;
};

struct OptimizerConfig {
  optim::OptimizerKind name = optim::OptimizerKind::AdamW;  // adamw | sgd
  double lr = 1e-3;                                         // peak learning rate
  double min_lr = 1e-4;                                     // end of the cosine decay
  int64_t warmup_steps = 0;
  double weight_decay = 0.1;  // matrices only (biases and norms get none)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double momentum = 0.9;                     // sgd
  std::optional<optim::AdamWKernel> kernel;  // adamw's update; empty: auto (AdamWOptions::kernel)
};

// fsdp.wrap: what a unit is. Block: each transformer block (and, with embedding_units, the token
// embedding and the head); Root: the whole model one unit; MinParams: modules of at least
// fsdp.min_params parameters; Tower: each image or text tower (models::tower_paths).
enum class UnitWrap { Block, Root, MinParams, Tower };

// [fsdp]: the sharding settings (runtime/sharding_settings.h, fsdp.<name> each), and how the
// model's units are chosen.
struct FsdpConfig : runtime::ShardingSettings {
  UnitWrap wrap = UnitWrap::Block;
  int64_t min_params = 0;
  // block and min_params: the token embedding and the output head are units of their own (tied:
  // one), so they are gathered only while used instead of all step in the root (as torchtitan).
  bool embedding_units = true;
};

struct EvalConfig {
  int64_t every = 100;          // steps between evaluations (also at the start and the end); 0 = ends only
  int64_t batches = 8;          // language models: global batches of validation windows per evaluation
  int64_t max_items = 0;        // images: test images per evaluation (0 = the whole test set)
  int64_t sample_tokens = 200;  // language models: tokens generated at the end (0 = none)
  std::string prompt = "";
  double temperature = 0.8;
  int64_t top_k = 40;
};

struct CheckpointConfig {
  int64_t every = 0;  // save every this many steps, and at the end (0: only when preempted)
  int64_t keep = 3;   // newest checkpoints kept (0: all)
  std::string dir;    // "" = <output_dir>/checkpoints
  // The step waits only while the shards are copied to host staging buffers; a thread writes the
  // files, and the checkpoint is published at a later step boundary once every rank has written
  // (checkpoint/sharded_checkpoint.h's CheckpointSave). At most one in flight.
  bool async = false;
};

// Targets set before the run and checked as it goes ([targets]; 0 or "" = not set). A missed
// target prints one line, is recorded in metrics.jsonl and marked in the report; with stop = true
// the run then saves a checkpoint and ends.
struct TargetsConfig {
  double min_tokens_per_second = 0;  // median of the last 10 steps (images/s for image models)
  double max_step_seconds = 0;       // median of the last 10 steps
  int64_t max_memory_per_rank = 0;   // bytes ("8GiB" in the file): the largest rank's peak
  double max_validation_loss = 0;    // by step max_validation_loss_step (the first evaluation at or after it)
  int64_t max_validation_loss_step = 0;
  double price_per_device_hour = 0;  // cost = elapsed hours x ranks x this price
  double max_cost = 0;
  bool stop = false;
  bool any() const {
    return min_tokens_per_second > 0 || max_step_seconds > 0 || max_memory_per_rank > 0 || max_validation_loss > 0 ||
           max_cost > 0;
  }
};

// Dynamic loss scaling for fsdp.param_dtype = "float16" ([loss_scale]; torch.amp.GradScaler's
// defaults): the loss is multiplied by the scale before backward, the gradient shards divided by
// it after; a step whose gradients overflow is skipped and the scale multiplied by backoff_factor,
// and growth_interval clean steps in a row multiply it by growth_factor. A backoff below `min`
// stops the run (as DeepSpeed's min_loss_scale): gradients that overflow at the floor do not fit fp16.
struct LossScaleConfig {
  double init = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min = 1.0;
};

// Guardrails against bad batches ([guard]). A step whose loss spikes is skipped on every rank like
// a non-finite one; after rollback_after skipped steps in a row the run goes back to the last
// checkpoint saved before them and skips their batches (as large runs have done by hand).
struct GuardConfig {
  // Skip a step whose loss is more than this many standard deviations above the mean of the last
  // `window` applied steps' losses (judged once the window is full). 0: off.
  double spike_zscore = 0;
  int64_t window = 50;
  // Skipped steps in a row (non-finite or spikes) that roll the run back (0: never; needs
  // checkpoint.every). Below train.max_nonfinite_steps to act before that stops the run.
  int64_t rollback_after = 0;
  int64_t max_rollbacks = 3;  // rollbacks in one run before it stops
  bool any() const { return spike_zscore > 0 || rollback_after > 0; }
};

struct TrainConfig {
  std::string source;  // where it was read from, for messages
  // The keys the file and the --set overrides give ("fsdp.strategy", ...), the rest being defaults
  // or derived: what a user fixed (fsdp-plan --fit searches the others).
  std::set<std::string> keys_given;
  std::string name = "run";
  uint64_t seed = 1234;
  std::string output_dir;  // default runs/<name>
  std::string model_name;
  models::ModelConfig model;
  // model.vocab: 0 = the data's; otherwise at least the data's (a Hugging Face model's embedding
  // may have more rows than its tokenizer has tokens).
  int64_t model_vocab = 0;
  // model.init_from: initial weights (fine-tuning): a Hugging Face model directory (config.json,
  // safetensors, tokenizer; fsdp-ckpt export --hf-dir writes one), a safetensors file or directory
  // under Hugging Face names, or a checkpoint directory. "" = random init.
  std::string init_from;
  DataConfig data;
  int64_t steps = 100;
  int64_t global_batch = 32;          // samples (token windows or images) per step, all ranks together
  int64_t micro_batches = 1;          // per rank per step (gradient accumulation)
  int64_t seq_len = 0;                // tokens per window (language models); 0: the model's context
  bool sync_each_micro_batch = true;  // false: accumulate unsharded grads, reduce once per step
  double grad_clip = 1.0;             // global gradient norm (0 = off)
  // A step whose gradient norm is NaN or inf is skipped; this many such steps in a row stop the run.
  int64_t max_nonfinite_steps = 5;
  int64_t log_every = 10;  // plain-text log cadence when not on a terminal
  int64_t threads = 0;     // intra-op threads per rank (0 = cores / ranks on this machine)
  c10::DeviceType device =
      c10::DeviceType::CPU;             // cpu (MPI) or cuda (NCCL; one GPU per rank by local rank; FSDP_CUDA builds)
  double device_memory_fraction = 0.0;  // cuda: cap the caching allocator at this share of the GPU (0 = no cap)
  OptimizerConfig optimizer;
  FsdpConfig fsdp;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  TargetsConfig targets;
  GuardConfig guard;
  LossScaleConfig loss_scale;  // float16 compute only
  // [lora] rank, alpha, dropout, rslora, targets ("q_proj v_proj" or "all-linear"): the adapters
  // go into the model's config (LoraSpec); the frozen base's shards are kept in base_dtype:
  // "auto" (resolved when read: the dtype of model.init_from's weights, bfloat16 only when they are,
  // float32 for a random base), "bfloat16", "float32", or "nf4" (QLoRA: the blocks' linear
  // weights in bitsandbytes' NF4 with double quantization, the rest of the base in bfloat16).
  models::LoraBaseDtype lora_base_dtype = models::LoraBaseDtype::Auto;
  // lora.init_adapter: a PEFT adapter directory (adapter_config.json, adapter_model.safetensors)
  // whose lora_A/lora_B start the adapters, to continue training one. Its r, lora_alpha,
  // lora_dropout and target_modules fill the [lora] keys left out (and must equal those given).
  std::string lora_init_adapter;
  // train.loss_chunk_tokens: language models compute the head and the loss this many tokens at a
  // time (models/linear_cross_entropy.h), never holding [tokens, vocab] logits; 0: the composed
  // head (logits, then cross-entropy).
  int64_t loss_chunk_tokens = 1024;
  // train.fused_ops: the decoder's RMSNorm, rotary, SwiGLU and residual add + RMSNorm as fused
  // operations (models/fused_ops.h: one kernel each way on a GPU, fewer saved activations
  // everywhere), and q, k, v and gate, up as one GEMM each where an FSDP unit's weights stack
  // (models/stacked_linear.h); false: the composed references, for comparison.
  bool fused_ops = true;
  // train.attention: how attention computes in the compute dtype (models/attention.h); nullopt is
  // "auto" (resolved by train::attention_path_for: fused_fp32 for bf16 and fp16 compute on the CPU, where
  // libtorch's bf16 flash backward is slow; fused otherwise).
  std::optional<models::AttentionPath> attention;
  // train.bf16_matmul: how bf16 linear layers and the head multiply (models/bf16_matmul.h); nullopt
  // is "auto" (fp32 GEMMs on bf16 operands on a CPU without bf16 instructions, else native).
  std::optional<models::Bf16Matmul> bf16_matmul;
  // train.attention_kernel: which of CUDA's fused attention kernels libtorch tries first
  // (models/attention_kernel.h); nullopt is "auto": on a GPU the fastest for the model's attention,
  // measured at start (train/attention_kernel_choice.h); libtorch's own order on the CPU.
  std::optional<models::AttentionKernel> attention_kernel;
  int64_t report_every =
      50;  // train.report_every: rewrite <output_dir>/report.html every this many steps (0: at the end only)
};

// Reads and checks a config. Throws ConfigError naming the file or override and the key.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});
TrainConfig parse_train_config(const std::string& toml_text, const std::string& source_name,
                               const std::vector<std::string>& overrides = {});

// Checks what depends on the world size (batch divisible by ranks x micro-batches).
void validate_for_world(const TrainConfig& config, int world_size);

// Throws ConfigError when this binary cannot run the config: train.device 'cuda' on a CPU build.
// Not part of reading a config: fsdp-plan and fsdp-train --check take a GPU run's config anywhere.
void check_this_build_runs(const TrainConfig& config);

std::string checkpoints_dir(const TrainConfig& config);  // checkpoint.dir or <output_dir>/checkpoints

// lora.base_dtype with "auto" resolved: the dtype of model.init_from's weights where every one is
// bf16 ("bfloat16"), else "float32" (a random base, fp32 or fp16 weights). Reads the weights'
// headers; throws ConfigError when they cannot be read.
models::LoraBaseDtype resolved_lora_base_dtype(const TrainConfig& config);

// The resolved configuration as TOML (written beside the run's metrics): every key that applies,
// numbers as written (0.95, not 0.9499999999999996).
std::string to_toml(const TrainConfig& config);
// `text` as a TOML basic string, quotes, backslashes and control characters escaped: for building
// an override (--output-dir DIR) or a config from text a user gave.
std::string toml_string(const std::string& text);

// Every key with its type, one line of help and its default, section by section (--list-keys).
std::string list_config_keys();

}  // namespace fsdp::train

namespace fsdp {
template <>
struct EnumNames<train::UnitWrap> {
  static constexpr std::pair<train::UnitWrap, const char*> values[] = {
      {train::UnitWrap::Block, "block"},
      {train::UnitWrap::Root, "root"},
      {train::UnitWrap::MinParams, "min_params"},
      {train::UnitWrap::Tower, "tower"},
  };
};
}  // namespace fsdp
