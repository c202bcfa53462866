// Corpora larger than a test: token shards read as one sequence (data/token_shards.h) and a corpus
// tokenized by several threads into shards (data/corpus_tokenizer.h).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "fsdp/data/corpus_tokenizer.h"
#include "fsdp/data/text_corpus.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/token_shards.h"
#include "fsdp/data/tokenizer.h"
#include "temp_dir.h"

namespace corpus_tests {

namespace fs = std::filesystem;
using namespace fsdp::data;
using fsdp_tests::TempDir;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

std::vector<int32_t> all_tokens(const TokenSource& source) {
  at::Tensor read = source.read(0, source.size());
  return std::vector<int32_t>(read.data_ptr<int64_t>(), read.data_ptr<int64_t>() + read.numel());
}

// Three shards of 5, 1 and 7 tokens: every span, across one or two boundaries, reads as the
// concatenation would; a directory, a glob and a single file name them.
TEST(TokenShards, ReadAcrossShardsAsOneSequence) {
  TempDir dir;
  fs::create_directories(dir.file("c"));
  std::vector<int32_t> all;
  const std::vector<std::vector<int32_t>> shards = {{1, 2, 3, 4, 5}, {6}, {7, 8, 9, 10, 11, 12, 13}};
  for (size_t i = 0; i < shards.size(); ++i) {
    write_token_file(dir.file("c/shard-0000" + std::to_string(i) + ".tok"), shards[i], 300);
    all.insert(all.end(), shards[i].begin(), shards[i].end());
  }
  std::ofstream(dir.file("c/README")) << "not a shard";  // other files in the directory are not shards
  for (const std::string& spec : {dir.file("c"), dir.file("c/shard-*.tok")}) {
    TokenShards source(spec);
    EXPECT_EQ(source.shard_count(), 3u) << spec;
    EXPECT_EQ(source.size(), 13);
    EXPECT_EQ(source.vocab_size(), 300);
    EXPECT_EQ(all_tokens(source), all);
    for (int64_t start = 0; start < 13; ++start) {
      for (int64_t length = 0; start + length <= 13; ++length) {
        at::Tensor got = source.read(start, length);
        ASSERT_EQ(got.numel(), length);
        for (int64_t k = 0; k < length; ++k)
          ASSERT_EQ(got[k].item<int64_t>(), all[static_cast<size_t>(start + k)]) << start << "+" << k;
      }
    }
    EXPECT_THROW(source.read(10, 4), std::out_of_range);
  }
  EXPECT_EQ(TokenShards(dir.file("c/shard-00002.tok")).size(), 7);
}

TEST(TokenShards, RefuseWhatIsNotOneCorpus) {
  TempDir dir;
  EXPECT_NE(error_of([&] { TokenShards s(dir.file("none-*.tok")); }).find("matches no file"), std::string::npos);
  EXPECT_NE(error_of([&] { TokenShards s(dir.path().string()); }).find("holds no .tok file"), std::string::npos);
  EXPECT_NE(error_of([&] { TokenShards s(dir.file("missing.tok")); }).find("missing.tok': cannot open"),
            std::string::npos);
  fs::create_directories(dir.file("empty"));
  write_token_file(dir.file("empty/a.tok"), {1, 2}, 256);
  write_token_file(dir.file("empty/b.tok"), {}, 256);
  const std::string empty = error_of([&] { TokenShards s(dir.file("empty")); });
  EXPECT_NE(empty.find("b.tok' holds no tokens"), std::string::npos) << empty;
  fs::create_directories(dir.file("mixed"));
  write_token_file(dir.file("mixed/a.tok"), {1, 2}, 256);
  write_token_file(dir.file("mixed/b.tok"), {1, 2}, 70000);
  const std::string mixed = error_of([&] { TokenShards s(dir.file("mixed")); });
  EXPECT_NE(mixed.find("vocabulary 256 in 2-byte tokens"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("vocabulary 70000 in 4-byte tokens"), std::string::npos) << mixed;
}

// 300 documents (text files and JSON lines) through the corpus tokenizer: the same shards with 1
// and 3 threads and any batch size; the train shards hold tokenize_documents of the train split
// (the fortunes' split, by text hash), the validation shards that of the rest.
TEST(CorpusTokenizer, ShardsAreTheSameWithAnyThreadsAndEqualTheOneProcessTokens) {
  TempDir dir;
  fs::create_directories(dir.file("in/more"));
  std::vector<Document> documents;
  {
    std::ofstream lines(dir.file("in/a.jsonl"));
    for (int i = 0; i < 250; ++i) {
      std::string text =
          "document " + std::to_string(i) + ": " + std::string(static_cast<size_t>(i % 37), 'x') + " é ✓\n";
      lines << nlohmann::json{{"text", text}}.dump() << "\n";
      if (i % 50 == 7) lines << "\n";  // blank lines are skipped
      documents.push_back({"", text});
    }
  }
  for (int i = 0; i < 50; ++i) {
    const std::string text = "file " + std::to_string(i) + "\nwith two lines";
    std::ofstream(dir.file("in/more/f" + std::to_string(100 + i) + ".txt")) << text;
    documents.push_back({"", text});
  }
  const auto tokenizer = make_tokenizer("byte");
  const CorpusSplit split = split_documents(documents, 10);
  ASSERT_GT(split.validation.size(), 10u);
  const std::vector<int32_t> train = tokenize_documents(split.train, *tokenizer);
  const std::vector<int32_t> validation = tokenize_documents(split.validation, *tokenizer);
  for (const auto& [threads, batch_bytes] :
       std::vector<std::pair<int, int64_t>>{{1, 16 << 20}, {3, 16 << 20}, {3, 500}, {2, 1}}) {
    CorpusOptions options;
    options.output_dir = dir.file("out-" + std::to_string(threads) + "-" + std::to_string(batch_bytes));
    options.threads = threads;
    options.shard_tokens = 1000;
    options.validation_percent = 10;
    options.batch_bytes = batch_bytes;
    int calls = 0;
    const CorpusSummary summary =
        tokenize_corpus({dir.file("in")}, *tokenizer, options, [&](const CorpusProgress&) { ++calls; });
    EXPECT_EQ(summary.documents, 300);
    EXPECT_GE(calls, 1);
    EXPECT_EQ(summary.train_tokens, static_cast<int64_t>(train.size()));
    EXPECT_EQ(summary.train_shards, static_cast<int>((train.size() + 999) / 1000));
    EXPECT_EQ(all_tokens(TokenShards(options.output_dir + "/train")), train)
        << threads << " threads, batches of " << batch_bytes;
    EXPECT_EQ(all_tokens(TokenShards(options.output_dir + "/validation")), validation) << threads << " threads";
    EXPECT_EQ(TokenFile(options.output_dir + "/train/shard-00000.tok").size(), 1000);
    EXPECT_FALSE(fs::exists(options.output_dir + ".partial"));
  }
}

// A bad line stops the pass naming its file and line, and leaves nothing on disk; an existing
// output is refused rather than overwritten.
TEST(CorpusTokenizer, BadInputLeavesNothing) {
  TempDir dir;
  std::ofstream(dir.file("bad.jsonl")) << "{\"text\": \"fine\"}\n{\"txt\": \"no text\"}\n";
  const auto tokenizer = make_tokenizer("byte");
  CorpusOptions options;
  options.output_dir = dir.file("out");
  options.threads = 2;
  const std::string bad = error_of([&] { tokenize_corpus({dir.file("bad.jsonl")}, *tokenizer, options); });
  EXPECT_NE(bad.find("bad.jsonl:2"), std::string::npos) << bad;
  EXPECT_FALSE(fs::exists(options.output_dir));
  EXPECT_FALSE(fs::exists(options.output_dir + ".partial"));
  EXPECT_NE(error_of([&] { tokenize_corpus({dir.file("missing")}, *tokenizer, options); }).find("is neither a file"),
            std::string::npos);
  std::ofstream(dir.file("blank.jsonl")) << "\n\n";
  EXPECT_NE(error_of([&] { tokenize_corpus({dir.file("blank.jsonl")}, *tokenizer, options); }).find("no document"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(options.output_dir + ".partial"));
  fs::create_directories(options.output_dir);
  std::ofstream(dir.file("good.jsonl")) << "{\"text\": \"fine\"}\n";
  EXPECT_NE(error_of([&] { tokenize_corpus({dir.file("good.jsonl")}, *tokenizer, options); }).find("exists"),
            std::string::npos);
}

// Review findings: a hidden directory (.git) in the input is not the corpus; "out/" writes "out"
// with its .partial beside it, not inside; a shard whose name has glob characters is read as the
// file it is; a corpus of more shards than a process may hold descriptors opens (a file's
// descriptor is closed once it is mapped).
TEST(CorpusTokenizer, HiddenDirectoriesTrailingSlashesAndManyShards) {
  TempDir dir;
  fs::create_directories(dir.file("in/.git/objects"));
  std::ofstream(dir.file("in/doc.txt")) << "one document";
  std::ofstream(dir.file("in/.git/objects/blob")) << "not a document";
  const auto tokenizer = make_tokenizer("byte");
  CorpusOptions options;
  options.output_dir = dir.file("out") + "/";
  const CorpusSummary summary = tokenize_corpus({dir.file("in")}, *tokenizer, options);
  EXPECT_EQ(summary.documents, 1);
  EXPECT_TRUE(fs::is_directory(dir.file("out/train")));
  EXPECT_FALSE(fs::exists(dir.file("out/.partial")));
  EXPECT_FALSE(fs::exists(dir.file("out.partial")));

  fs::create_directories(dir.file("odd[1]"));
  fs::copy_file(dir.file("out/train/shard-00000.tok"), dir.file("odd[1]/x.tok"));
  EXPECT_EQ(TokenShards(dir.file("odd[1]/x.tok")).size(), summary.train_tokens);

  fs::create_directories(dir.file("order"));
  for (const char* name : {"shard-100000.tok", "shard-99999.tok", "shard-00002.tok", "shard-10001.tok"}) {
    std::ofstream(dir.file(std::string("order/") + name)) << "";
  }
  std::vector<std::string> names;
  for (const std::string& path : token_shard_paths(dir.file("order")))
    names.push_back(fs::path(path).filename().string());
  EXPECT_EQ(names,
            (std::vector<std::string>{"shard-00002.tok", "shard-10001.tok", "shard-99999.tok", "shard-100000.tok"}));

  std::ofstream(dir.file("many.txt")) << std::string(3000, 'a');
  CorpusOptions many;
  many.output_dir = dir.file("many");
  many.shard_tokens = 1;
  many.validation_percent = 0;
  const CorpusSummary lots = tokenize_corpus({dir.file("many.txt")}, *tokenizer, many);
  ASSERT_GT(lots.train_shards, 2048);
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  const rlimit lowered{1024, limit.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  std::string opened;
  try {
    opened = std::to_string(TokenShards(many.output_dir + "/train").size());
  } catch (const std::exception& e) {
    opened = e.what();
  }
  ::setrlimit(RLIMIT_NOFILE, &limit);
  EXPECT_EQ(opened, std::to_string(lots.train_tokens));
}

}  // namespace corpus_tests
