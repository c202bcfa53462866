// fsdp/data/text_corpus.h: text documents from disk, split into training and validation sets.
//
// The default corpus is Debian's `fortunes` package: plain files under /usr/share/games/fortunes,
// each a list of quotations separated by lines holding a single "%". Every quotation is one
// document. The split is deterministic and stable: a document goes to validation when a 64-bit
// FNV-1a hash of its text falls in the first `validation_percent` of 100 buckets, so adding or
// reordering files never moves an existing document across the split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

struct Document {
  std::string source;  // file it came from
  std::string text;
};

struct CorpusSplit {
  std::vector<Document> train;
  std::vector<Document> validation;
};

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// Documents of every fortune file in `dir` (sorted by name; the index files *.dat and the *.u8
// duplicates skipped). Throws std::runtime_error if the directory is missing or holds no fortunes.
std::vector<Document> read_fortunes(const std::string& dir);
// Each file of `paths` as one document (a directory: each regular file in it, sorted).
std::vector<Document> read_text_files(const std::vector<std::string>& paths);

CorpusSplit split_documents(std::vector<Document> documents, int validation_percent);

// Token stream of the documents: each document's tokens, then the tokenizer's end-of-text id, or
// where it has none, the text "\n%\n" (so a byte-level model learns where a document ends).
std::vector<int32_t> tokenize_documents(const std::vector<Document>& documents, const Tokenizer& tokenizer);
// What follows each document there: [end-of-text id], or the tokens of "%\n".
std::vector<int32_t> document_separator(const Tokenizer& tokenizer);

uint64_t fnv1a64(const std::string& text);

}  // namespace fsdp::data
