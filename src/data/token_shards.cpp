#include "fsdp/data/token_shards.h"

#include <ATen/ATen.h>
#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "fsdp/number_order.h"

namespace fsdp::data {

namespace fs = std::filesystem;

std::vector<std::string> token_shard_paths(const std::string& spec) {
  std::vector<std::string> paths;
  std::error_code error;
  if (fs::is_directory(spec, error)) {
    for (const auto& entry : fs::directory_iterator(spec)) {
      if (entry.is_regular_file() && entry.path().extension() == ".tok") paths.push_back(entry.path().string());
    }
    if (paths.empty()) throw std::runtime_error("token shards: directory '" + spec + "' holds no .tok file");
  } else if (spec.find_first_of("*?[") != std::string::npos && !fs::exists(spec, error)) {
    glob_t matches{};
    const int status = ::glob(spec.c_str(), 0, nullptr, &matches);
    for (size_t i = 0; status == 0 && i < matches.gl_pathc; ++i) {
      if (fs::is_regular_file(matches.gl_pathv[i], error)) paths.emplace_back(matches.gl_pathv[i]);
    }
    globfree(&matches);
    if (paths.empty()) throw std::runtime_error("token shards: '" + spec + "' matches no file");
  } else {
    paths.push_back(spec);  // one token file: TokenFile says what is wrong with it, if anything
  }
  std::sort(paths.begin(), paths.end(), in_number_order);  // shard-99999 before shard-100000
  return paths;
}

TokenShards::TokenShards(const std::string& spec) : spec_(spec) {
  for (const std::string& path : token_shard_paths(spec)) {
    auto shard = std::make_unique<TokenFile>(path);
    if (shard->size() == 0)
      throw std::runtime_error("token shard '" + path + "' holds no tokens (of corpus '" + spec + "')");
    if (!shards_.empty()) {
      const TokenFile& first = *shards_.front();
      if (shard->vocab_size() != first.vocab_size() || shard->bytes_per_token() != first.bytes_per_token()) {
        throw std::runtime_error("token shards of '" + spec + "' differ: '" + first.path() + "' has vocabulary " +
                                 std::to_string(first.vocab_size()) + " in " + std::to_string(first.bytes_per_token()) +
                                 "-byte tokens, '" + path + "' vocabulary " + std::to_string(shard->vocab_size()) +
                                 " in " + std::to_string(shard->bytes_per_token()) +
                                 "-byte tokens (a corpus is one tokenizer's)");
      }
      if (shard->tokenizer_stamp() != first.tokenizer_stamp()) {
        throw std::runtime_error("token shards of '" + spec + "' differ: '" + first.path() + "' was made with " +
                                 first.tokenizer_stamp().describe() + ", '" + path + "' with " +
                                 shard->tokenizer_stamp().describe() + " (a corpus is one tokenizer's)");
      }
    }
    starts_.push_back(total_);
    total_ += shard->size();
    shards_.push_back(std::move(shard));
  }
}

namespace {
// A shard's file name without its directory: the same corpus mounted elsewhere compares equal.
std::string fs_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }
}  // namespace

std::string TokenShards::fingerprint() const {
  if (shards_.size() == 1) return shards_.front()->fingerprint();
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& shard : shards_) {
    const std::string line = fs_name(shard->path()) + ": " + shard->fingerprint() + "\n";
    crc = crc32(crc, reinterpret_cast<const Bytef*>(line.data()), static_cast<uInt>(line.size()));
  }
  char text[96];
  std::snprintf(text, sizeof(text), "%zu shards, %lld tokens, crc32 %08lx of their names and fingerprints",
                shards_.size(), static_cast<long long>(total_), static_cast<unsigned long>(crc));
  return text;
}

at::Tensor TokenShards::read(int64_t start, int64_t length) const {
  if (start < 0 || length < 0 || start + length > total_) {
    throw std::out_of_range("token shards '" + spec_ + "': tokens [" + std::to_string(start) + ", " +
                            std::to_string(start + length) + ") outside [0, " + std::to_string(total_) + ")");
  }
  // The shard holding `start`, then as many after it as the span needs.
  size_t shard = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin()) - 1;
  std::vector<at::Tensor> parts;
  for (int64_t position = start, end = start + length; position < end; ++shard) {
    const int64_t offset = position - starts_[shard];
    const int64_t take = std::min(end - position, shards_[shard]->size() - offset);
    parts.push_back(shards_[shard]->read(offset, take));
    position += take;
  }
  if (parts.size() == 1) return parts.front();
  return parts.empty() ? at::empty({0}, at::kLong) : at::cat(parts);
}

}  // namespace fsdp::data
