// fsdp-ckpt: inspect, export and import checkpoints. export and import are collective: run them
// under mpirun at any number of ranks (or as one process); each rank reads only its slice.
//
//   fsdp-ckpt inspect runs/gpt-fortunes-tiny/checkpoints/step-00000600
//   fsdp-ckpt export runs/.../step-00000600 --output gpt.safetensors [--dtype bf16]
//   fsdp-ckpt export runs/.../step-00000600 --output gpt-hf/ --max-file-size 2GB    # sharded set + index
//   fsdp-ckpt export runs/.../step-00000600 --hf-dir llama-tuned/   # a directory from_pretrained loads
//   fsdp-ckpt export runs/.../step-00000600 --peft-dir adapter/     # LoRA: the adapters, PEFT's format
//   fsdp-ckpt export runs/.../step-00000600 --hf-dir merged/ --merge  # LoRA: adapters merged into the weights
//   fsdp-ckpt import gpt.safetensors --config configs/gpt-fortunes-tiny.toml --output imported/
//   fsdp-ckpt import Llama-3.2-1B/ --output imported/               # a Hugging Face model directory
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "fsdp/checkpoint/hf_model_dir.h"
#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/peft_adapter.h"
#include "fsdp/checkpoint/published_files.h"
#include "fsdp/data/instructions.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/agreement.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

namespace {

int64_t vocab_of(const fsdp::train::TrainConfig& config) {
  if (!fsdp::models::is_language_model(config.model)) return 0;
  if (config.model_vocab > 0) return config.model_vocab;
  return fsdp::models::vocab_size(config.model);
}

int64_t parse_size(const std::string& text) {
  size_t used = 0;
  const double value = std::stod(text, &used);
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "B" ? 1
                       : unit == "KB"              ? 1e3
                       : unit == "MB"              ? 1e6
                       : unit == "GB"              ? 1e9
                                                   : -1;
  if (scale < 0 || value <= 0)
    throw std::invalid_argument("--max-file-size '" + text + "': expected e.g. 500MB or 5GB");
  return static_cast<int64_t>(value * scale);
}

namespace fs = std::filesystem;

// A Hugging Face model directory from an exported weight set in `dir`: config.json,
// generation_config.json and the tokenizer's files (the run's, or its init_from directory's).
void write_hf_metadata(const fsdp::train::TrainConfig& config, const fsdp::models::ModelConfig& model,
                       const std::string& dir, const std::string& dtype) {
  const auto& d = config.data;
  const bool from_hf_dir = fsdp::checkpoint::is_hf_model_dir(config.init_from);
  const std::string source_config = from_hf_dir ? config.init_from + "/config.json" : "";
  int64_t bos = -1, eos = -1;
  std::vector<std::string> files;
  std::vector<int64_t> extra_eos;
  if (d.tokenizer == fsdp::data::TokenizerKind::Hf) {
    files = fsdp::checkpoint::tokenizer_files_in(fs::path(d.tokenizer_json).parent_path().string());
    fsdp::data::HfTokenizer tokenizer(d.tokenizer_json);
    for (const char* begin : {"<|begin_of_text|>", "<s>", "<bos>"}) {  // Llama 3's, SentencePiece's, Gemma's
      if ((bos = tokenizer.token_id(begin)) >= 0) break;
    }
    eos = tokenizer.end_of_text();
    // Fine-tuned on a chat format: generation must also stop where an answer ends.
    if (d.source == fsdp::train::DataSource::Instructions) {
      const auto format = fsdp::data::resolve_chat_format(d.chat_format, tokenizer);
      const int32_t end_of_turn = fsdp::data::end_of_turn(format, tokenizer);
      if (format != fsdp::data::ChatFormat::Plain && end_of_turn >= 0 && end_of_turn != eos) {
        extra_eos.push_back(end_of_turn);
      }
    }
  } else if (d.tokenizer == fsdp::data::TokenizerKind::Gpt2) {
    files = {d.vocab_json, d.merges_txt};
    eos = bos = fsdp::data::Gpt2BpeTokenizer(d.vocab_json, d.merges_txt).end_of_text();
  }
  if (from_hf_dir) {
    // Files the tokenizer's own directory lacks (tokenizer_config.json with its chat template, say).
    for (const auto& file : fsdp::checkpoint::tokenizer_files_in(config.init_from)) {
      bool have = false;
      for (const auto& f : files) have = have || fs::path(f).filename() == fs::path(file).filename();
      if (!have) files.push_back(file);
    }
  }
  fsdp::checkpoint::write_text_file(dir + "/config.json",
                                    fsdp::checkpoint::hf_config_text(model, source_config, dtype));
  fsdp::checkpoint::write_text_file(dir + "/generation_config.json",
                                    fsdp::checkpoint::hf_generation_config_text(source_config, bos, eos, extra_eos));
  for (const auto& file : files)
    fs::copy_file(file, fs::path(dir) / fs::path(file).filename(), fs::copy_options::overwrite_existing);
}

// A run's checkpoints directory (what import --output and checkpoint.dir name) stands for its
// newest published checkpoint, as --resume latest takes it; `dir` itself otherwise (a checkpoint,
// or a directory without one, which the reader then refuses naming it).
std::string checkpoint_or_latest(const std::string& dir, bool say) {
  if (fsdp::checkpoint::is_checkpoint_dir(dir)) return dir;
  const std::string parent = fsdp::checkpoint::without_trailing_slashes(dir);
  std::error_code error;
  if (!fs::is_directory(parent, error)) return dir;
  const std::string latest = fsdp::checkpoint::find_latest_checkpoint(parent);
  if (latest.empty()) return dir;
  if (say)
    std::printf("fsdp-ckpt: %s holds checkpoints: taking its latest checkpoint, %s\n", dir.c_str(), latest.c_str());
  return latest;
}

// What `fsdp-ckpt export` was asked for (its flags).
struct ExportRequest {
  std::string checkpoint;  // a checkpoint, or a run's checkpoints directory (its latest)
  std::string output, hf_dir, peft_dir;
  std::string dtype = "fp32";
  std::string max_file_size;
  bool merge = false;
  bool overwrite = false;

  // The one file or directory written, as TARGET.partial renamed into place; DIR/ is DIR (its
  // .partial a sibling, never inside it).
  std::string target() const {
    return fsdp::checkpoint::without_trailing_slashes(!hf_dir.empty() ? hf_dir : !peft_dir.empty() ? peft_dir : output);
  }
};

// What `fsdp-ckpt import` was asked for.
struct ImportRequest {
  std::string weights, config, output;
  bool overwrite = false;
};

// The refusals that need no ranks: a message on stderr and false.
bool export_request_is_whole(const ExportRequest& r) {
  if (r.output.empty() && r.hf_dir.empty() && r.peft_dir.empty()) {
    std::fprintf(stderr, "fsdp-ckpt export: give --output FILE, --hf-dir DIR or --peft-dir DIR\n");
    return false;
  }
  // --hf-dir takes the size as is (its default: 5GB, as transformers'); a file cannot be split.
  if (r.max_file_size.empty() || !r.hf_dir.empty()) return true;
  const std::string target = r.target();
  std::error_code error;
  const bool names_a_file = r.output.empty() ||
                            (target.size() > 12 && target.rfind(".safetensors") == target.size() - 12) ||
                            fs::is_regular_file(target, error);
  if (names_a_file) {
    std::fprintf(stderr,
                 "fsdp-ckpt export: --max-file-size writes Hugging Face's sharded set (model-0000N-of-0000M."
                 "safetensors and model.safetensors.index.json) into a directory, and %s names a file: give --output "
                 "a directory, or leave out --max-file-size for one file\n",
                 r.output.empty() ? "--peft-dir" : ("--output '" + r.output + "'").c_str());
    return false;
  }
  return true;
}

bool import_request_is_whole(const ImportRequest& r) {
  if (r.config.empty() && !fsdp::checkpoint::is_hf_model_dir(r.weights)) {
    std::fprintf(stderr,
                 "fsdp-ckpt import: --config is needed: '%s' is not a Hugging Face model directory (no config.json)\n",
                 r.weights.c_str());
    return false;
  }
  return true;
}

// The checkpoint's weights gathered unit by unit and written by rank 0 into TARGET.partial, then
// published: nothing half-written, an existing output (--overwrite) swapped out in one step.
void export_checkpoint(ExportRequest r, const fsdp::comm::ProcessGroupPtr& world) {
  r.checkpoint = checkpoint_or_latest(r.checkpoint, world->rank() == 0);
  const std::string target = r.target();
  fsdp::train::TrainConfig config;
  fsdp::comm::on_every_rank(world, "reading the configuration", [&] {
    config = fsdp::train::parse_train_config(fsdp::checkpoint::read_checkpoint_info(r.checkpoint).config_toml,
                                             r.checkpoint + "/manifest.json");
    if (!r.overwrite)
      fsdp::checkpoint::refuse_existing(target, "the export's output", "give a new path, or --overwrite to replace it");
  });
  auto sharded = fsdp::train::build_sharded_model(config, vocab_of(config), world);
  fsdp::checkpoint::load_checkpoint(r.checkpoint, *sharded.state, nullptr);
  fsdp::checkpoint::ExportOptions options;
  options.dtype = r.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  options.merge_lora = r.merge;
  if (!r.max_file_size.empty()) options.max_file_bytes = parse_size(r.max_file_size);
  // transformers' default shard size for a model directory.
  if (!r.hf_dir.empty() && options.max_file_bytes == 0) options.max_file_bytes = static_cast<int64_t>(5e9);
  const std::string partial = target + ".partial";
  fsdp::comm::on_every_rank(world, "preparing " + partial, [&] {
    // Never removed: it may be a user's; an interrupted export's is the user's to remove.
    if (world->rank() == 0) {
      fsdp::checkpoint::refuse_existing(partial, "the export's scratch output",
                                        "left by an interrupted export? remove it, then export again");
    }
  });
  int64_t bytes = 0;
  if (!r.peft_dir.empty()) {
    const std::string base = config.init_from.empty() ? config.model_name : config.init_from;
    bytes = fsdp::checkpoint::export_peft_adapter(*sharded.state, sharded.config, partial, base);
  } else {
    bytes = fsdp::checkpoint::export_weights(*sharded.state, sharded.config, partial, options);
  }
  fsdp::comm::on_every_rank(world, "publishing " + target, [&] {
    if (world->rank() != 0) return;
    try {
      if (!r.hf_dir.empty())
        write_hf_metadata(config, sharded.config, partial, r.dtype == "bf16" ? "bfloat16" : "float32");
      fsdp::checkpoint::publish(partial, target, r.overwrite);
    } catch (...) {
      std::error_code ignored;
      fs::remove_all(partial, ignored);
      throw;
    }
  });
  if (world->rank() != 0) return;
  const auto shown_bytes = static_cast<long long>(bytes);
  if (!r.peft_dir.empty()) {
    std::printf("exported %lld bytes of LoRA adapters (PEFT format) to %s\n", shown_bytes, target.c_str());
  } else if (!r.hf_dir.empty()) {
    std::printf("exported %lld bytes of %s weights, config.json and tokenizer files to %s\n", shown_bytes,
                r.dtype.c_str(), target.c_str());
  } else {
    std::printf("exported %lld bytes of %s weights to %s\n", shown_bytes, r.dtype.c_str(), target.c_str());
  }
}

// Weights (a safetensors file with a config, or a Hugging Face directory) read by each rank's slice
// into a sharded checkpoint at step 0.
void import_checkpoint(const ImportRequest& r, const fsdp::comm::ProcessGroupPtr& world) {
  fsdp::train::TrainConfig config;
  fsdp::comm::on_every_rank(world, "reading the configuration", [&] {
    if (!r.config.empty()) {
      config = fsdp::train::load_train_config(r.config);
    } else {
      config = fsdp::train::parse_train_config("[model]\ninit_from = " + fsdp::train::toml_string(r.weights) + "\n",
                                               r.weights + "/config.json");
    }
    if (!r.overwrite) {
      fsdp::checkpoint::refuse_existing(fs::path(r.output) / "step-00000000", "the import's output",
                                        "give another --output, or --overwrite to replace it");
    }
  });
  auto sharded = fsdp::train::build_sharded_model(config, vocab_of(config), world);
  fsdp::checkpoint::import_weights(*sharded.state, sharded.config, r.weights);
  const std::string dir = fsdp::checkpoint::save_checkpoint(r.output, *sharded.state, nullptr,
                                                            {0, config.model_name, fsdp::train::to_toml(config)});
  if (world->rank() == 0)
    std::printf("imported %s into %s (use it as model.init_from)\n", r.weights.c_str(), dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "fsdp-ckpt: inspect sharded checkpoints, export them as safetensors with Hugging Face names,\n"
      "and import such weights. export/import run under mpirun at any rank count."};
  app.require_subcommand(1);
  auto* inspect = app.add_subcommand("inspect", "summarise a checkpoint's manifest");
  std::string inspect_dir;
  inspect->add_option("checkpoint", inspect_dir, "checkpoint directory (step-NNNNNNNN), or a run's checkpoints")
      ->required();

  auto* exporter = app.add_subcommand("export", "write a checkpoint's weights as safetensors (Hugging Face names)");
  ExportRequest ex;
  exporter->add_option("checkpoint", ex.checkpoint, "checkpoint directory, or a run's checkpoints (its latest)")
      ->required();
  auto* output_option =
      exporter->add_option("--output", ex.output, "a .safetensors file, or a directory with --max-file-size");
  auto* hf_dir_option =
      exporter->add_option("--hf-dir", ex.hf_dir,
                           "a Hugging Face model directory (config.json, sharded safetensors + index, "
                           "generation_config.json, tokenizer files) that transformers' from_pretrained loads");
  output_option->excludes(hf_dir_option);
  auto* peft_option = exporter->add_option("--peft-dir", ex.peft_dir,
                                           "LoRA: the adapters alone in PEFT's format (adapter_model.safetensors, "
                                           "adapter_config.json), for peft's PeftModel.from_pretrained");
  peft_option->excludes(output_option)->excludes(hf_dir_option);
  exporter->add_flag("--merge", ex.merge, "LoRA: write the weights with the adapters merged in, W + (alpha / r) B A");
  exporter->add_option("--dtype", ex.dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  exporter->add_option(
      "--max-file-size", ex.max_file_size,
      "with --output DIR: write Hugging Face's sharded set of files of at most this size (and its index)");
  exporter->add_flag("--overwrite", ex.overwrite,
                     "replace an existing output (the new one is written beside it, then swapped in); without it an "
                     "existing output is refused");

  auto* importer =
      app.add_subcommand("import", "load safetensors weights into a sharded checkpoint (step 0, no optimizer)");
  ImportRequest im;
  importer->add_option("weights", im.weights, "a .safetensors file or a directory with an index")->required();
  importer->add_option("--config", im.config,
                       "training config naming the model (not needed for a Hugging Face directory with config.json)");
  importer->add_option("--output", im.output, "directory to write the checkpoint into")->required();
  importer->add_flag("--overwrite", im.overwrite, "replace an existing step-00000000 under --output");
  CLI11_PARSE(app, argc, argv);
  if (exporter->parsed() && !export_request_is_whole(ex)) return 2;
  if (importer->parsed() && !import_request_is_whole(im)) return 2;

  if (inspect->parsed()) {
    try {
      std::printf("%s", fsdp::checkpoint::describe_checkpoint(checkpoint_or_latest(inspect_dir, true)).c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fsdp-ckpt: error: %s\n", e.what());
      return 1;
    }
  }

  auto world = fsdp::comm::init_world();
  try {
    if (exporter->parsed()) {
      export_checkpoint(ex, world);
    } else {
      import_checkpoint(im, world);
    }
    return 0;
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report()) std::fprintf(stderr, "fsdp-ckpt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-ckpt: error: %s\n", e.what());
    if (world->size() > 1) world->abort(e.what());
    return 1;
  }
}
