#include "fsdp/data/corpus_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <thread>

#include "fsdp/data/text_corpus.h"
#include "fsdp/data/token_file.h"

namespace fsdp::data {

namespace {

namespace fs = std::filesystem;

// A document as read: a whole text file, or one JSON line still to parse (a worker parses it).
struct RawDocument {
  std::string payload;
  bool json = false;
  std::string where;  // "file" or "file:line", for errors
};

// The inputs' documents, a batch at a time, in order.
class DocumentReader {
 public:
  explicit DocumentReader(const std::vector<std::string>& inputs) {
    for (const std::string& input : inputs) {
      std::error_code error;
      if (input == "-") {
        files_.emplace_back("-");
        reads_stdin_ = true;
      } else if (fs::is_directory(input, error)) {
        std::vector<fs::path> found;
        // Hidden files and directories (.git, editors' swap files) are not the corpus.
        for (auto entry = fs::recursive_directory_iterator(input); entry != fs::recursive_directory_iterator();
             ++entry) {
          const bool hidden = entry->path().filename().string().front() == '.';
          if (hidden && entry->is_directory()) entry.disable_recursion_pending();
          if (!hidden && entry->is_regular_file()) found.push_back(entry->path());
        }
        if (found.empty()) throw std::runtime_error("corpus: directory '" + input + "' holds no file");
        std::sort(found.begin(), found.end());
        files_.insert(files_.end(), found.begin(), found.end());
      } else if (fs::is_regular_file(input, error)) {
        files_.emplace_back(input);
      } else {
        throw std::runtime_error("corpus: input '" + input + "' is neither a file, a directory nor - (standard input)");
      }
    }
    if (files_.empty()) throw std::runtime_error("corpus: no input (files, directories, or - for standard input)");
    for (const auto& file : files_) {
      std::error_code error;
      if (file != "-") bytes_total_ += static_cast<int64_t>(fs::file_size(file, error));
    }
  }

  int64_t bytes_total() const { return reads_stdin_ ? 0 : bytes_total_; }
  int64_t bytes_read() const { return bytes_read_; }

  // About `max_bytes` of documents (at least one, if any is left); false when none is left.
  bool next_batch(int64_t max_bytes, std::vector<RawDocument>& batch) {
    batch.clear();
    int64_t bytes = 0;
    while (bytes < max_bytes) {
      if (lines_ == nullptr) {
        if (next_file_ == files_.size()) break;
        current_ = files_[next_file_++];
        line_number_ = 0;
        if (current_ == "-") {
          lines_ = &std::cin;
        } else if (current_.extension() == ".jsonl") {
          file_ = std::make_unique<std::ifstream>(current_, std::ios::binary);
          if (!*file_) throw std::runtime_error("corpus: cannot open '" + current_.string() + "'");
          lines_ = file_.get();
        } else {
          std::ifstream in(current_, std::ios::binary);
          if (!in) throw std::runtime_error("corpus: cannot open '" + current_.string() + "'");
          std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          bytes_read_ += static_cast<int64_t>(text.size());
          bytes += static_cast<int64_t>(text.size());
          batch.push_back({std::move(text), false, current_.string()});
        }
        continue;
      }
      std::string line;
      if (!std::getline(*lines_, line)) {
        if (lines_->bad()) throw std::runtime_error("corpus: reading '" + current_.string() + "' failed");
        lines_ = nullptr;
        file_.reset();
        continue;
      }
      ++line_number_;
      bytes_read_ += static_cast<int64_t>(line.size()) + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      bytes += static_cast<int64_t>(line.size());
      batch.push_back({std::move(line), true,
                       (current_ == "-" ? "standard input" : current_.string()) + ":" + std::to_string(line_number_)});
    }
    return !batch.empty();
  }

 private:
  std::vector<fs::path> files_;
  bool reads_stdin_ = false;
  size_t next_file_ = 0;
  fs::path current_;
  std::unique_ptr<std::ifstream> file_;
  std::istream* lines_ = nullptr;  // the JSON-lines input being read, if any
  int64_t line_number_ = 0;
  int64_t bytes_total_ = 0, bytes_read_ = 0;
};

// One split's shards: tokens are appended in order and written shard_tokens at a time.
class ShardWriter {
 public:
  ShardWriter(fs::path dir, int64_t vocab, int64_t shard_tokens, TokenizerStamp made_by)
      : dir_(std::move(dir)), vocab_(vocab), shard_tokens_(shard_tokens), made_by_(made_by) {}

  void append(const std::vector<int32_t>& tokens) {
    buffer_.insert(buffer_.end(), tokens.begin(), tokens.end());
    total_ += static_cast<int64_t>(tokens.size());
    // Whole shards from the front, then the rest moved down once: linear in the tokens appended.
    const auto shard = static_cast<size_t>(shard_tokens_);
    size_t written = 0;
    while (buffer_.size() - written >= shard) {
      write_shard(std::vector<int32_t>(buffer_.begin() + static_cast<std::ptrdiff_t>(written),
                                       buffer_.begin() + static_cast<std::ptrdiff_t>(written + shard)));
      written += shard;
    }
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(written));
  }
  void finish() {
    if (!buffer_.empty()) write_shard(buffer_);
    buffer_.clear();
  }
  int64_t total() const { return total_; }
  int shards() const { return shards_; }

 private:
  // Names count from shard-00000.tok and widen past 99999; readers order them by number
  // (token_shards.h), so shard-100000 follows shard-99999.
  void write_shard(const std::vector<int32_t>& tokens) {
    if (shards_ == 0) fs::create_directories(dir_);
    char name[32];
    std::snprintf(name, sizeof(name), "shard-%05d.tok", shards_++);
    write_token_file((dir_ / name).string(), tokens, vocab_, made_by_);
  }

  fs::path dir_;
  int64_t vocab_, shard_tokens_;
  std::vector<int32_t> buffer_;  // int32 tokens not yet in a shard (< shard_tokens between appends)
  int64_t total_ = 0;
  int shards_ = 0;
  TokenizerStamp made_by_;  // written into every shard's header
};

// Tokens of documents [begin, end) of a batch, each followed by the separator, by split.
struct TokenizedRange {
  std::vector<int32_t> train, validation;
  int64_t documents = 0;
  std::exception_ptr error;
};

void tokenize_range(const std::vector<RawDocument>& batch, size_t begin, size_t end, const Tokenizer& tokenizer,
                    const std::vector<int32_t>& separator, int validation_percent, TokenizedRange& out) {
  size_t i = begin;
  try {
    for (; i < end; ++i) {
      const RawDocument& raw = batch[i];
      std::string parsed;
      if (raw.json) {
        try {
          parsed = nlohmann::json::parse(raw.payload).at("text").get<std::string>();
        } catch (const std::exception& e) {
          throw std::runtime_error(std::string("expected a JSON line {\"text\": ...}: ") + e.what());
        }
      }
      const std::string& text = raw.json ? parsed : raw.payload;
      const bool validation = static_cast<int>(fnv1a64(text) % 100) < validation_percent;
      std::vector<int32_t>& tokens = validation ? out.validation : out.train;
      const std::vector<int32_t> ids = tokenizer.encode(text);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      tokens.insert(tokens.end(), separator.begin(), separator.end());
      ++out.documents;
    }
  } catch (const std::exception& e) {
    out.error = std::make_exception_ptr(std::runtime_error("corpus: " + batch[i].where + ": " + e.what()));
  } catch (...) {  // nothing may leave a thread's function: it would end the process
    out.error = std::make_exception_ptr(std::runtime_error("corpus: " + batch[i].where + ": an unknown error"));
  }
}

}  // namespace

CorpusSummary tokenize_corpus(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                              const CorpusOptions& options,
                              const std::function<void(const CorpusProgress&)>& progress) {
  if (options.output_dir.empty()) throw std::invalid_argument("corpus: no output directory");
  if (options.threads < 1)
    throw std::invalid_argument("corpus: threads must be 1 or more, got " + std::to_string(options.threads));
  if (options.shard_tokens < 1) throw std::invalid_argument("corpus: shard tokens must be 1 or more");
  if (options.validation_percent < 0 || options.validation_percent > 50) {
    throw std::invalid_argument("corpus: validation percent " + std::to_string(options.validation_percent) +
                                " outside [0, 50]");
  }
  // "out/" names the directory "out": its .partial is a sibling, not a file inside it.
  std::string output_dir = options.output_dir;
  while (output_dir.size() > 1 && output_dir.back() == '/') output_dir.pop_back();
  const fs::path output(output_dir), partial(output_dir + ".partial");
  std::error_code error;
  if (fs::exists(output, error)) {
    throw std::runtime_error("corpus: output directory '" + options.output_dir +
                             "' exists (remove it, or name another)");
  }
  DocumentReader reader(inputs);
  const auto start = std::chrono::steady_clock::now();
  CorpusSummary summary;
  summary.threads = options.threads;
  fs::remove_all(partial);
  try {
    fs::create_directories(partial);
    const std::vector<int32_t> separator = document_separator(tokenizer);
    ShardWriter train(partial / "train", tokenizer.vocab_size(), options.shard_tokens, tokenizer.stamp());
    ShardWriter validation(partial / "validation", tokenizer.vocab_size(), options.shard_tokens, tokenizer.stamp());
    std::vector<RawDocument> batch;
    while (reader.next_batch(options.batch_bytes, batch)) {
      // Contiguous ranges of about equal bytes, one a thread; the calling thread takes the first.
      int64_t batch_bytes = 0;
      for (const auto& doc : batch) batch_bytes += static_cast<int64_t>(doc.payload.size());
      const int ranges = std::max(1, std::min<int>(options.threads, static_cast<int>(batch.size())));
      std::vector<size_t> bounds{0};
      int64_t bytes = 0;
      for (size_t i = 0; i < batch.size() && static_cast<int>(bounds.size()) < ranges; ++i) {
        bytes += static_cast<int64_t>(batch[i].payload.size());
        if (bytes * ranges >= batch_bytes * static_cast<int64_t>(bounds.size())) bounds.push_back(i + 1);
      }
      while (static_cast<int>(bounds.size()) <= ranges) bounds.push_back(batch.size());
      bounds.back() = batch.size();
      std::vector<TokenizedRange> results(static_cast<size_t>(ranges));
      // Worker threads take ranges 1.. (joined on every path out); a range whose thread cannot be
      // had is tokenized by the calling thread, after its own.
      struct JoinAll {
        std::vector<std::thread> threads;
        ~JoinAll() {
          for (auto& thread : threads) thread.join();
        }
      } workers;
      std::vector<int> inline_ranges{0};
      for (int r = 1; r < ranges; ++r) {
        try {
          workers.threads.emplace_back(tokenize_range, std::cref(batch), bounds[r], bounds[r + 1], std::cref(tokenizer),
                                       std::cref(separator), options.validation_percent, std::ref(results[r]));
        } catch (const std::system_error&) {
          inline_ranges.push_back(r);
        }
      }
      for (int r : inline_ranges) {
        tokenize_range(batch, bounds[r], bounds[r + 1], tokenizer, separator, options.validation_percent, results[r]);
      }
      for (auto& worker : workers.threads) worker.join();
      workers.threads.clear();
      for (auto& result : results) {
        if (result.error) std::rethrow_exception(result.error);
        train.append(result.train);
        validation.append(result.validation);
        summary.documents += result.documents;
      }
      if (progress) {
        CorpusProgress now;
        now.bytes_read = reader.bytes_read();
        now.bytes_total = reader.bytes_total();
        now.documents = summary.documents;
        now.tokens = train.total() + validation.total();
        now.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        progress(now);
      }
    }
    if (summary.documents == 0) throw std::runtime_error("corpus: the inputs hold no document");
    train.finish();
    validation.finish();
    summary.train_tokens = train.total();
    summary.validation_tokens = validation.total();
    summary.train_shards = train.shards();
    summary.validation_shards = validation.shards();
    summary.bytes = reader.bytes_read();
    fs::rename(partial, output);
  } catch (...) {
    fs::remove_all(partial, error);  // nothing half-written is left
    throw;
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace fsdp::data
