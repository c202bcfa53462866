// fsdp-data: turns text into token files that fsdp-train memory-maps.
//
//   fsdp-data fortunes --output-dir data/fortunes        # Debian's fortunes, train/validation split
//   fsdp-data encode --output notes.tok notes/*.txt      # any text files, one document each
//   fsdp-data corpus --output-dir data/web --tokenizer hf --tokenizer-json tokenizer.json web/   # any size, every
//   core, shards fsdp-data encode --tokenizer gpt2 --vocab-json vocab.json --merges-txt merges.txt --output x.tok
//   in.txt fsdp-data inspect data/fortunes/train.tok fsdp-data tokenize --tokenizer hf --tokenizer-json tokenizer.json
//   --input texts.jsonl --output ids.jsonl fsdp-data instructions --output data/fortune-chat.jsonl   # an instruction
//   set: a request, a fortune fsdp-data render --tokenizer hf --tokenizer-json tokenizer.json --input chat.jsonl
//   --output rendered.jsonl fsdp-data train-tokenizer --output-dir runs/tokenizer --vocab-size 4096   # byte-level BPE
//   on the fortunes
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <filesystem>
#include <memory>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp/checkpoint/published_files.h"
#include "fsdp/data/bpe_training.h"
#include "fsdp/data/corpus_tokenizer.h"
#include "fsdp/data/instructions.h"
#include "fsdp/enum_names.h"
#include "fsdp/data/text_corpus.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/tokenizer.h"

namespace {

struct TokenizerArgs {
  fsdp::data::TokenizerKind kind = fsdp::data::TokenizerKind::Byte;
  std::string vocab_json, merges_txt, tokenizer_json;
  void add_to(CLI::App& command) {
    command
        .add_option_function<std::string>(
            "--tokenizer",
            [this](const std::string& name) { kind = fsdp::enum_from_name<fsdp::data::TokenizerKind>(name); },
            "byte (vocab 256, built in), gpt2 (needs --vocab-json, --merges-txt) or hf (needs --tokenizer-json)")
        ->check(CLI::IsMember(fsdp::enum_names<fsdp::data::TokenizerKind>()));
    command.add_option("--vocab-json", vocab_json, "GPT-2 BPE vocabulary (token -> id JSON)");
    command.add_option("--merges-txt", merges_txt, "GPT-2 BPE merges, one pair per line");
    command.add_option("--tokenizer-json", tokenizer_json, "a Hugging Face tokenizer.json (byte-level BPE)");
  }
  std::unique_ptr<fsdp::data::Tokenizer> make() const {
    return fsdp::data::make_tokenizer(kind, vocab_json, merges_txt, tokenizer_json);
  }
  // The same tokenizer as fsdp-train's --set flags (the byte tokenizer is its default: none).
  std::string train_settings() const {
    auto set = [](const std::string& key, const std::string& value) {
      return " --set " + key + "='\"" + value + "\"'";
    };
    const std::string name = fsdp::data::tokenizer_kind_name(kind);
    switch (kind) {
      case fsdp::data::TokenizerKind::Gpt2:
        return set("data.tokenizer", name) + set("data.vocab_json", vocab_json) + set("data.merges_txt", merges_txt);
      case fsdp::data::TokenizerKind::Hf:
        return set("data.tokenizer", name) + set("data.tokenizer_json", tokenizer_json);
      default: return "";
    }
  }
};

// Each line {"text": "..."} -> {"ids": [...]} (and "decoded" with --decode), written beside the
// output, then renamed into place: never half a file.
void write_tokenized_lines(const fsdp::data::Tokenizer& tokenizer, const std::string& input, const std::string& output,
                           const std::string& partial, bool decode) {
  std::ifstream in(input);
  if (!in) throw std::runtime_error("tokenize: cannot open '" + input + "'");
  std::ofstream out(partial);
  if (!out) throw std::runtime_error("tokenize: cannot write '" + partial + "': " + std::strerror(errno));
  std::string line;
  int64_t number = 0, tokens = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    std::string text;
    try {
      text = nlohmann::json::parse(line).at("text").get<std::string>();
    } catch (const std::exception& e) {
      throw std::runtime_error("tokenize: " + input + ":" + std::to_string(number) +
                               ": expected {\"text\": ...}: " + e.what());
    }
    std::vector<int32_t> ids;
    try {
      ids = tokenizer.encode(text);
    } catch (const std::exception& e) {
      throw std::runtime_error("tokenize: " + input + ":" + std::to_string(number) + ": " + e.what());
    }
    tokens += static_cast<int64_t>(ids.size());
    nlohmann::json record = {{"ids", ids}};
    if (decode) record["decoded"] = tokenizer.decode(ids);
    out << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  out.close();
  if (!out) throw std::runtime_error("tokenize: writing '" + partial + "' failed");
  std::filesystem::rename(partial, output);
  std::printf("%s: %lld texts, %lld tokens (%s tokenizer, vocab %lld)\n", output.c_str(),
              static_cast<long long>(number), static_cast<long long>(tokens), tokenizer.name().c_str(),
              static_cast<long long>(tokenizer.vocab_size()));
}

void tokenize_lines(const fsdp::data::Tokenizer& tokenizer, const std::string& input, const std::string& output,
                    bool decode) {
  const std::string partial = output + ".partial";
  try {
    write_tokenized_lines(tokenizer, input, output, partial, decode);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);  // a failed run leaves nothing behind
    throw;
  }
}

// Writes lines to `output` through `output`.partial, renamed into place when complete; a failure
// leaves nothing behind.
template <class WriteLines>
void write_lines_atomically(const std::string& output, WriteLines&& write_lines) {
  const std::string partial = output + ".partial";
  try {
    std::ofstream out(partial);
    if (!out) throw std::runtime_error("cannot write '" + partial + "': " + std::strerror(errno));
    write_lines(out);
    out.close();
    if (!out) throw std::runtime_error("writing '" + partial + "' failed");
    std::filesystem::rename(partial, output);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
}

// An instruction set from the fortunes: a request naming the fortune's file (its topic), and the
// fortune as the answer. The request's wording varies with a hash of the fortune (deterministic).
void write_fortune_instructions(const std::string& dir, const std::string& output, const std::string& format,
                                const std::string& system) {
  static const char* requests[] = {"Tell me a fortune about %s.", "Give me a %s fortune.",
                                   "Share a fortune on the topic of %s.", "I would like a fortune about %s, please."};
  const auto documents = fsdp::data::read_fortunes(dir);
  write_lines_atomically(output, [&](std::ofstream& out) {
    for (const auto& document : documents) {
      const std::string topic = std::filesystem::path(document.source).filename().string();
      char request[256];
      std::snprintf(request, sizeof(request), requests[fsdp::data::fnv1a64(document.text) % 4], topic.c_str());
      std::string answer = document.text;
      while (!answer.empty() && (answer.back() == '\n' || answer.back() == ' ')) answer.pop_back();
      nlohmann::json record;
      if (format == "prompt-completion") {
        record = {{"prompt", std::string(request)}, {"completion", answer}};
      } else {
        record["messages"] = nlohmann::json::array();
        if (!system.empty()) record["messages"].push_back({{"role", "system"}, {"content", system}});
        record["messages"].push_back({{"role", "user"}, {"content", std::string(request)}});
        record["messages"].push_back({{"role", "assistant"}, {"content", answer}});
      }
      out << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
  });
  std::printf("%s: %zu instruction examples (%s) from %s\n", output.c_str(), documents.size(), format.c_str(),
              dir.c_str());
}

// Each instruction example rendered in the chat format: {"ids": [...], "trained": [0/1, ...],
// "prompt_ids": [...]} (prompt_ids: the messages before the last, with the assistant's header),
// what the trainer sees, for checking against transformers' apply_chat_template.
void render_instructions(const fsdp::data::Tokenizer& tokenizer, const std::string& chat_format,
                         bool split_special_tokens, const std::string& input, const std::string& output) {
  std::optional<fsdp::data::ChatFormat> requested;
  try {
    requested = fsdp::optional_enum_from_name<fsdp::data::ChatFormat>(chat_format);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--chat-format ") + e.what());
  }
  const auto format = fsdp::data::resolve_chat_format(requested, tokenizer);
  const auto content =
      split_special_tokens ? fsdp::data::ContentSpecialTokens::Text : fsdp::data::ContentSpecialTokens::Control;
  const auto examples = fsdp::data::read_instruction_jsonl(input);
  write_lines_atomically(output, [&](std::ofstream& out) {
    for (const auto& example : examples) {
      const auto rendered = fsdp::data::render_chat(example, format, tokenizer, content);
      std::vector<int> trained(rendered.trained.begin(), rendered.trained.end());
      std::vector<fsdp::data::ChatMessage> before(example.messages.begin(), example.messages.end() - 1);
      nlohmann::json record = {{"ids", rendered.tokens},
                               {"trained", trained},
                               {"prompt_ids", fsdp::data::render_prompt(before, format, tokenizer, content)}};
      out << record.dump() << "\n";
    }
  });
  std::printf("%s: %zu examples rendered (%s format)\n", output.c_str(), examples.size(), fsdp::enum_name(format));
}

// A byte-level BPE tokenizer trained on the fortunes' training split (or on text files), written as
// a Hugging Face directory's tokenizer files: DIR/tokenizer.json and DIR/tokenizer_config.json,
// into DIR.partial first and renamed into place. DIR must be new or empty.
void train_tokenizer(const std::string& output_dir, const std::vector<std::string>& inputs,
                     const std::string& fortunes_dir, int64_t vocab_size) {
  std::vector<std::string> texts;
  std::string source;
  if (inputs.empty()) {
    // The training split only: a model validated on the held-out fortunes must not have had its
    // tokenizer fitted to them.
    for (const auto& document : fsdp::data::split_documents(fsdp::data::read_fortunes(fortunes_dir), 5).train) {
      texts.push_back(document.text);
    }
    source = "the fortunes' training split (" + fortunes_dir + ")";
  } else {
    for (const auto& document : fsdp::data::read_text_files(inputs)) texts.push_back(document.text);
    source = std::to_string(inputs.size()) + " input(s)";
  }
  fsdp::data::BpeTrainingOptions options;
  options.vocab_size = vocab_size;
  // "out/" names the directory "out": its .partial is a sibling, never inside it. A directory that
  // holds anything is refused before the work, not emptied: it may be a model's or a run's.
  const std::string target = fsdp::checkpoint::without_trailing_slashes(output_dir);
  const std::filesystem::path dir(target), partial(target + ".partial");
  fsdp::checkpoint::refuse_existing(dir, "train-tokenizer: --output-dir",
                                    "it holds files this command did not write; name a new or empty directory");
  fsdp::checkpoint::refuse_existing(partial, "train-tokenizer: the scratch directory",
                                    "left by an interrupted run? remove it, then run again");
  const fsdp::data::TrainedBpe trained = fsdp::data::train_byte_level_bpe(texts, options);
  std::filesystem::create_directories(partial);
  for (const auto& [name, text] : {std::pair<std::string, std::string>{"tokenizer.json", trained.tokenizer_json},
                                   {"tokenizer_config.json", trained.tokenizer_config_json}}) {
    std::ofstream out(partial / name);
    out << text;
    out.close();
    if (!out) throw std::runtime_error("train-tokenizer: writing '" + (partial / name).string() + "' failed");
  }
  fsdp::checkpoint::publish(partial, dir, /*replace=*/false);
  std::printf(
      "%s: byte-level BPE, vocab %lld (%lld merges, %d special tokens) from %zu documents of %s, %lld distinct words\n",
      (dir / "tokenizer.json").string().c_str(), static_cast<long long>(trained.vocab_size),
      static_cast<long long>(trained.merges), static_cast<int>(options.special_tokens.size()), texts.size(),
      source.c_str(), static_cast<long long>(trained.words));
}

// fsdp-data corpus: the progress on standard error (a bar redrawn in place on a terminal, else a
// line each tenth), then the summary and the config lines that train on it.
void run_corpus(const std::vector<std::string>& inputs, const fsdp::data::Tokenizer& tokenizer,
                const fsdp::data::CorpusOptions& options, const std::string& tokenizer_settings) {
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  int64_t printed_tenth = 0;
  auto progress = [&](const fsdp::data::CorpusProgress& p) {
    const double mib = p.bytes_read / 1048576.0, rate = p.seconds > 0 ? mib / p.seconds : 0.0;
    char line[256];
    if (p.bytes_total > 0) {
      // A file that grows while read can make bytes_read pass the total taken at start.
      const double fraction = std::min(1.0, static_cast<double>(p.bytes_read) / static_cast<double>(p.bytes_total));
      const int width = 30, filled = static_cast<int>(fraction * width);
      std::snprintf(line, sizeof(line),
                    "[%s%s] %5.1f%% %.1f of %.1f MiB, %.1f MiB/s, %lld documents, %lld tokens, ETA %.0f s",
                    std::string(static_cast<size_t>(filled), '#').c_str(),
                    std::string(static_cast<size_t>(width - filled), ' ').c_str(), 100.0 * fraction, mib,
                    p.bytes_total / 1048576.0, rate, static_cast<long long>(p.documents),
                    static_cast<long long>(p.tokens), rate > 0 ? (p.bytes_total / 1048576.0 - mib) / rate : 0.0);
      if (!terminal) {
        const int64_t tenth = static_cast<int64_t>(fraction * 10);
        if (tenth == printed_tenth) return;
        printed_tenth = tenth;
      }
    } else {
      std::snprintf(line, sizeof(line), "%.1f MiB, %.1f MiB/s, %lld documents, %lld tokens", mib, rate,
                    static_cast<long long>(p.documents), static_cast<long long>(p.tokens));
    }
    std::fprintf(stderr, terminal ? "\r%s\033[K" : "%s\n", line);
  };
  const fsdp::data::CorpusSummary s = fsdp::data::tokenize_corpus(inputs, tokenizer, options, progress);
  if (terminal) std::fprintf(stderr, "\n");
  std::printf(
      "%s: %lld documents, %.1f MiB of text in %.2f s on %d thread%s (%.1f MiB/s); %s tokenizer, vocab %lld, %s "
      "tokens\n"
      "  train: %lld tokens in %d shard%s; validation: %lld tokens in %d shard%s\n",
      options.output_dir.c_str(), static_cast<long long>(s.documents), s.bytes / 1048576.0, s.seconds, s.threads,
      s.threads == 1 ? "" : "s", s.seconds > 0 ? s.bytes / 1048576.0 / s.seconds : 0.0, tokenizer.name().c_str(),
      static_cast<long long>(tokenizer.vocab_size()), tokenizer.vocab_size() <= 65536 ? "uint16" : "uint32",
      static_cast<long long>(s.train_tokens), s.train_shards, s.train_shards == 1 ? "" : "s",
      static_cast<long long>(s.validation_tokens), s.validation_shards, s.validation_shards == 1 ? "" : "s");
  if (s.validation_shards > 0) {
    // The tokenizer too: a run with another (the byte default) would be refused (the shards say
    // which made them), and the sample needs it.
    std::printf(
        "train on it with: --set data.source='\"token_files\"' --set data.train_tokens='\"%s/train\"' "
        "--set data.validation_tokens='\"%s/validation\"'%s\n",
        options.output_dir.c_str(), options.output_dir.c_str(), tokenizer_settings.c_str());
  }
}

void write(const std::string& path, const std::vector<int32_t>& tokens, const fsdp::data::Tokenizer& tokenizer,
           size_t documents) {
  fsdp::data::write_token_file(path, tokens, tokenizer.vocab_size(), tokenizer.stamp());
  std::printf("%s: %zu documents, %zu tokens (%s tokenizer, vocab %lld)\n", path.c_str(), documents, tokens.size(),
              tokenizer.name().c_str(), static_cast<long long>(tokenizer.vocab_size()));
}

// Each subcommand declares its options on `app` and its work as the subcommand's callback, which
// CLI11 runs once the command line is parsed; the options live in a struct the callback shares.

void add_fortunes_command(CLI::App& app) {
  struct Options {
    std::string dir = fsdp::data::kFortunesDir, output_dir;
    int validation_percent = 5;
    TokenizerArgs tokenizer;
  };
  auto o = std::make_shared<Options>();
  auto* command = app.add_subcommand("fortunes", "tokenize Debian's fortunes corpus into train.tok and validation.tok");
  command->add_option("--dir", o->dir, "fortune files")->capture_default_str();
  command->add_option("--output-dir", o->output_dir, "where to write train.tok and validation.tok")->required();
  command->add_option("--validation-percent", o->validation_percent, "share of documents held out (by text hash)")
      ->check(CLI::Range(1, 50))
      ->capture_default_str();
  o->tokenizer.add_to(*command);
  command->callback([o] {
    auto tokenizer = o->tokenizer.make();
    auto split = fsdp::data::split_documents(fsdp::data::read_fortunes(o->dir), o->validation_percent);
    auto train = fsdp::data::tokenize_documents(split.train, *tokenizer);
    auto validation = fsdp::data::tokenize_documents(split.validation, *tokenizer);
    std::filesystem::create_directories(o->output_dir);
    write(o->output_dir + "/train.tok", train, *tokenizer, split.train.size());
    write(o->output_dir + "/validation.tok", validation, *tokenizer, split.validation.size());
  });
}

void add_encode_command(CLI::App& app) {
  struct Options {
    std::vector<std::string> inputs;
    std::string output;
    TokenizerArgs tokenizer;
  };
  auto o = std::make_shared<Options>();
  auto* command = app.add_subcommand("encode", "tokenize text files (each one document) into one token file");
  command->add_option("inputs", o->inputs, "text files or directories")->required();
  command->add_option("--output", o->output, "token file to write")->required();
  o->tokenizer.add_to(*command);
  command->callback([o] {
    auto tokenizer = o->tokenizer.make();
    auto documents = fsdp::data::read_text_files(o->inputs);
    write(o->output, fsdp::data::tokenize_documents(documents, *tokenizer), *tokenizer, documents.size());
  });
}

void add_corpus_command(CLI::App& app) {
  struct Options {
    std::vector<std::string> inputs;
    fsdp::data::CorpusOptions corpus;
    TokenizerArgs tokenizer;
  };
  auto o = std::make_shared<Options>();
  o->corpus.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto* command = app.add_subcommand("corpus",
                                     "tokenize a corpus of any size on every core into token shards "
                                     "(OUTPUT/train/shard-*.tok, OUTPUT/validation/shard-*.tok)");
  command
      ->add_option("inputs", o->inputs,
                   "text files (one document each), JSON-lines files (*.jsonl, {\"text\": ...} a line), directories "
                   "of them, or - (JSON lines on standard input)")
      ->required();
  command->add_option("--output-dir", o->corpus.output_dir, "where train/ and validation/ go (must not exist)")
      ->required();
  command->add_option("--threads", o->corpus.threads, "tokenizing threads (default: every core)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  command->add_option("--shard-tokens", o->corpus.shard_tokens, "tokens per shard")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  command
      ->add_option("--validation-percent", o->corpus.validation_percent,
                   "share of documents held out for validation, by text hash (0: none)")
      ->check(CLI::Range(0, 50))
      ->capture_default_str();
  o->tokenizer.add_to(*command);
  command->callback([o] { run_corpus(o->inputs, *o->tokenizer.make(), o->corpus, o->tokenizer.train_settings()); });
}

void add_inspect_command(CLI::App& app) {
  struct Options {
    std::string path;
    int64_t show = 64;
    TokenizerArgs tokenizer;
  };
  auto o = std::make_shared<Options>();
  auto* command = app.add_subcommand("inspect", "print a token file's header and its first tokens");
  command->add_option("file", o->path, "token file")->required();
  command->add_option("--show", o->show, "tokens to decode")->capture_default_str();
  o->tokenizer.add_to(*command);
  command->callback([o] {
    fsdp::data::TokenFile file(o->path);
    std::printf("%s: %lld tokens, vocab %lld, %d bytes per token, made with %s\n", o->path.c_str(),
                static_cast<long long>(file.size()), static_cast<long long>(file.vocab_size()), file.bytes_per_token(),
                file.tokenizer_stamp().describe().c_str());
    const int64_t n = std::min(o->show, file.size());
    at::Tensor first = file.read(0, n);
    std::vector<int32_t> ids(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + n);
    std::printf("first %lld ids:", static_cast<long long>(n));
    for (int32_t id : ids) std::printf(" %d", id);
    std::printf("\n");
    auto tokenizer = o->tokenizer.make();
    if (tokenizer->vocab_size() >= file.vocab_size()) {
      std::printf("decoded (%s): %s\n", tokenizer->name().c_str(), tokenizer->decode(ids).c_str());
    }
  });
}

void add_tokenize_command(CLI::App& app) {
  struct Options {
    std::string input, output;
    bool decode = false;
    TokenizerArgs tokenizer;
  };
  auto o = std::make_shared<Options>();
  auto* command = app.add_subcommand("tokenize", "encode JSON lines {\"text\": ...} into {\"ids\": [...]} lines");
  command->add_option("--input", o->input, "JSON lines, each {\"text\": ...}")->required();
  command->add_option("--output", o->output, "JSON lines, each {\"ids\": [...]}")->required();
  command->add_flag("--decode", o->decode, "also write \"decoded\": the ids decoded again");
  o->tokenizer.add_to(*command);
  command->callback([o] { tokenize_lines(*o->tokenizer.make(), o->input, o->output, o->decode); });
}

void add_instructions_command(CLI::App& app) {
  struct Options {
    std::string dir = fsdp::data::kFortunesDir, output, format = "messages", system_prompt;
  };
  auto o = std::make_shared<Options>();
  auto* command = app.add_subcommand("instructions",
                                     "make an instruction set (JSONL) from Debian's fortunes: a request "
                                     "naming the fortune's topic, and the fortune as the answer");
  command->add_option("--dir", o->dir, "fortune files")->capture_default_str();
  command->add_option("--output", o->output, "JSONL file to write")->required();
  command->add_option("--format", o->format, "messages ({\"messages\": [...]}) or prompt-completion")
      ->check(CLI::IsMember({"messages", "prompt-completion"}))
      ->capture_default_str();
  command->add_option("--system", o->system_prompt, "a system message opening each example (messages format)");
  command->callback([o] {
    if (!o->system_prompt.empty() && o->format != "messages") {
      throw std::invalid_argument(
          "instructions: --system needs --format messages (prompt-completion has no system turn)");
    }
    write_fortune_instructions(o->dir, o->output, o->format, o->system_prompt);
  });
}

void add_render_command(CLI::App& app) {
  struct Options {
    std::string input, output, format = "auto";
    bool split_special_tokens = false;
    TokenizerArgs tokenizer;
  };
  auto o = std::make_shared<Options>();
  auto* command =
      app.add_subcommand("render", "render instruction JSONL in the chat format: ids and trained-token masks");
  command->add_option("--input", o->input, "instruction JSONL")->required();
  command->add_option("--output", o->output, "JSON lines {\"ids\", \"trained\", \"prompt_ids\"}")->required();
  command
      ->add_option("--chat-format", o->format,
                   fsdp::names_listed(fsdp::enum_names_with_auto<fsdp::data::ChatFormat>(), ", "))
      ->capture_default_str();
  command->add_flag("--split-special-tokens", o->split_special_tokens,
                    "special-token text in a message stays text (data.split_special_tokens)");
  o->tokenizer.add_to(*command);
  command->callback(
      [o] { render_instructions(*o->tokenizer.make(), o->format, o->split_special_tokens, o->input, o->output); });
}

void add_train_tokenizer_command(CLI::App& app) {
  struct Options {
    std::string output_dir, fortunes = fsdp::data::kFortunesDir;
    std::vector<std::string> inputs;
    int64_t vocab = 4096;
  };
  auto o = std::make_shared<Options>();
  auto* command = app.add_subcommand("train-tokenizer",
                                     "train a byte-level BPE tokenizer (Hugging Face tokenizer.json, "
                                     "Llama 3's layout and chat tokens) on the fortunes or on text files");
  command->add_option("inputs", o->inputs, "text files or directories (default: the fortunes' training split)");
  command->add_option("--output-dir", o->output_dir, "where tokenizer.json and tokenizer_config.json go")->required();
  command->add_option("--vocab-size", o->vocab, "tokens in all: 256 bytes, merges, 5 special tokens")
      ->check(CLI::Range(int64_t{261}, int64_t{1} << 24))
      ->capture_default_str();
  command->add_option("--dir", o->fortunes, "fortune files (without inputs)")->capture_default_str();
  command->callback([o] { train_tokenizer(o->output_dir, o->inputs, o->fortunes, o->vocab); });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-data: make token files for fsdp-train (a 32-byte header, then uint16 or uint32 tokens)."};
  app.require_subcommand(1);
  add_fortunes_command(app);
  add_encode_command(app);
  add_corpus_command(app);
  add_inspect_command(app);
  add_tokenize_command(app);
  add_instructions_command(app);
  add_render_command(app);
  add_train_tokenizer_command(app);
  try {
    app.parse(argc, argv);  // runs the chosen subcommand's callback
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
