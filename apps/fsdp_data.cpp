// fsdp-data: turns text into token files that fsdp-train memory-maps.
//
//   fsdp-data fortunes --output-dir data/fortunes        # Debian's fortunes, train/validation split
//   fsdp-data encode --output notes.tok notes/*.txt      # any text files, one document each
//   fsdp-data encode --tokenizer gpt2 --vocab-json vocab.json --merges-txt merges.txt --output x.tok in.txt
//   fsdp-data inspect data/fortunes/train.tok
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "fsdp/data/text_corpus.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/tokenizer.h"

namespace {

struct TokenizerArgs {
  std::string kind = "byte";
  std::string vocab_json, merges_txt;
  void add_to(CLI::App& command) {
    command.add_option("--tokenizer", kind, "byte (vocab 256, built in) or gpt2 (needs --vocab-json, --merges-txt)")
        ->check(CLI::IsMember({"byte", "gpt2"}));
    command.add_option("--vocab-json", vocab_json, "GPT-2 BPE vocabulary (token -> id JSON)");
    command.add_option("--merges-txt", merges_txt, "GPT-2 BPE merges, one pair per line");
  }
};

void write(const std::string& path, const std::vector<int32_t>& tokens, const fsdp::data::Tokenizer& tokenizer,
           size_t documents) {
  fsdp::data::write_token_file(path, tokens, tokenizer.vocab_size());
  std::printf("%s: %zu documents, %zu tokens (%s tokenizer, vocab %lld)\n", path.c_str(), documents, tokens.size(),
              tokenizer.name().c_str(), static_cast<long long>(tokenizer.vocab_size()));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-data: make token files for fsdp-train (a 32-byte header, then uint16 or uint32 tokens)."};
  app.require_subcommand(1);

  auto* fortunes = app.add_subcommand("fortunes", "tokenize Debian's fortunes corpus into train.tok and validation.tok");
  std::string fortunes_dir = fsdp::data::kFortunesDir, output_dir;
  int validation_percent = 5;
  TokenizerArgs fortunes_tokenizer;
  fortunes->add_option("--dir", fortunes_dir, "fortune files")->capture_default_str();
  fortunes->add_option("--output-dir", output_dir, "where to write train.tok and validation.tok")->required();
  fortunes->add_option("--validation-percent", validation_percent, "share of documents held out (by text hash)")
      ->check(CLI::Range(1, 50))
      ->capture_default_str();
  fortunes_tokenizer.add_to(*fortunes);

  auto* encode = app.add_subcommand("encode", "tokenize text files (each one document) into one token file");
  std::vector<std::string> inputs;
  std::string output;
  TokenizerArgs encode_tokenizer;
  encode->add_option("inputs", inputs, "text files or directories")->required();
  encode->add_option("--output", output, "token file to write")->required();
  encode_tokenizer.add_to(*encode);

  auto* inspect = app.add_subcommand("inspect", "print a token file's header and its first tokens");
  std::string inspect_path;
  int64_t show = 64;
  TokenizerArgs inspect_tokenizer;
  inspect->add_option("file", inspect_path, "token file")->required();
  inspect->add_option("--show", show, "tokens to decode")->capture_default_str();
  inspect_tokenizer.add_to(*inspect);

  CLI11_PARSE(app, argc, argv);
  try {
    if (fortunes->parsed()) {
      auto tokenizer = fsdp::data::make_tokenizer(fortunes_tokenizer.kind, fortunes_tokenizer.vocab_json,
                                                  fortunes_tokenizer.merges_txt);
      auto split = fsdp::data::split_documents(fsdp::data::read_fortunes(fortunes_dir), validation_percent);
      auto train = fsdp::data::tokenize_documents(split.train, *tokenizer);
      auto validation = fsdp::data::tokenize_documents(split.validation, *tokenizer);
      std::filesystem::create_directories(output_dir);
      write(output_dir + "/train.tok", train, *tokenizer, split.train.size());
      write(output_dir + "/validation.tok", validation, *tokenizer, split.validation.size());
    } else if (encode->parsed()) {
      auto tokenizer = fsdp::data::make_tokenizer(encode_tokenizer.kind, encode_tokenizer.vocab_json,
                                                  encode_tokenizer.merges_txt);
      auto documents = fsdp::data::read_text_files(inputs);
      write(output, fsdp::data::tokenize_documents(documents, *tokenizer), *tokenizer, documents.size());
    } else if (inspect->parsed()) {
      fsdp::data::TokenFile file(inspect_path);
      std::printf("%s: %lld tokens, vocab %lld, %d bytes per token\n", inspect_path.c_str(),
                  static_cast<long long>(file.size()), static_cast<long long>(file.vocab_size()), file.bytes_per_token());
      const int64_t n = std::min(show, file.size());
      at::Tensor first = file.read(0, n);
      std::vector<int32_t> ids(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + n);
      std::printf("first %lld ids:", static_cast<long long>(n));
      for (int32_t id : ids) std::printf(" %d", id);
      std::printf("\n");
      auto tokenizer = fsdp::data::make_tokenizer(inspect_tokenizer.kind, inspect_tokenizer.vocab_json,
                                                  inspect_tokenizer.merges_txt);
      if (tokenizer->vocab_size() >= file.vocab_size()) {
        std::printf("decoded (%s): %s\n", tokenizer->name().c_str(), tokenizer->decode(ids).c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
