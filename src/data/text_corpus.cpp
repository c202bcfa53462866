#include "fsdp/data/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fsdp::data {

namespace fs = std::filesystem;

namespace {

std::string read_whole_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path.string() + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<fs::path> regular_files_sorted(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

uint64_t fnv1a64(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::vector<Document> read_fortunes(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    throw std::runtime_error("fortunes: directory '" + dir +
                             "' not found (install Debian's 'fortunes' package: apt-get install fortunes)");
  }
  std::vector<Document> documents;
  for (const auto& path : regular_files_sorted(dir)) {
    const std::string name = path.filename().string();
    if (ends_with(name, ".dat") || ends_with(name, ".u8") || name.front() == '.') continue;
    std::istringstream lines(read_whole_file(path));
    std::string line, current;
    auto flush = [&] {
      while (!current.empty() && (current.back() == '\n' || current.back() == ' ')) current.pop_back();
      if (!current.empty()) documents.push_back({name, current + "\n"});
      current.clear();
    };
    while (std::getline(lines, line)) {
      if (line == "%") {
        flush();
      } else {
        current += line;
        current += '\n';
      }
    }
    flush();
  }
  if (documents.empty()) throw std::runtime_error("fortunes: no fortune files in '" + dir + "'");
  return documents;
}

std::vector<Document> read_text_files(const std::vector<std::string>& paths) {
  std::vector<Document> documents;
  for (const auto& p : paths) {
    std::error_code error;
    if (fs::is_directory(p, error)) {
      for (const auto& file : regular_files_sorted(p)) documents.push_back({file.string(), read_whole_file(file)});
    } else if (fs::is_regular_file(p, error)) {
      documents.push_back({p, read_whole_file(p)});
    } else {
      throw std::runtime_error("input '" + p + "' is neither a file nor a directory");
    }
  }
  return documents;
}

CorpusSplit split_documents(std::vector<Document> documents, int validation_percent) {
  if (validation_percent < 0 || validation_percent > 50) {
    throw std::invalid_argument("validation percent " + std::to_string(validation_percent) + " outside [0, 50]");
  }
  CorpusSplit split;
  for (auto& doc : documents) {
    const bool validation = static_cast<int>(fnv1a64(doc.text) % 100) < validation_percent;
    (validation ? split.validation : split.train).push_back(std::move(doc));
  }
  return split;
}

std::vector<int32_t> document_separator(const Tokenizer& tokenizer) {
  const int32_t end = tokenizer.end_of_text();
  return end >= 0 ? std::vector<int32_t>{end} : tokenizer.encode("%\n");
}

std::vector<int32_t> tokenize_documents(const std::vector<Document>& documents, const Tokenizer& tokenizer) {
  const std::vector<int32_t> separator = document_separator(tokenizer);
  std::vector<int32_t> tokens;
  for (const auto& doc : documents) {
    auto ids = tokenizer.encode(doc.text);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    tokens.insert(tokens.end(), separator.begin(), separator.end());
  }
  return tokens;
}

}  // namespace fsdp::data
