#include "fsdp/data/token_file.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace fsdp::data {

namespace {

constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'T', 'O', 'K', '\0'};
constexpr size_t kHeaderBytes = 32;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian; this host is not");

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;
  uint32_t vocab;
  uint32_t made_by;  // TokenizerStamp: kind << 24 | low 24 bits of the crc32 of its files
  uint64_t count;
};
static_assert(sizeof(Header) == kHeaderBytes, "token file header must be 32 bytes");

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size,
                      TokenizerStamp made_by) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 32) - 1) {
    throw std::invalid_argument("write_token_file: vocabulary size " + std::to_string(vocab_size) + " out of range");
  }
  const uint32_t token_bytes = vocab_size <= 65536 ? 2 : 4;
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kTokenFileVersion;
  header.token_bytes = token_bytes;
  header.vocab = static_cast<uint32_t>(vocab_size);
  header.count = tokens.size();
  header.made_by = (static_cast<uint32_t>(made_by.kind) << 24) | (made_by.checksum & 0xFFFFFFu);

  std::vector<unsigned char> body(tokens.size() * token_bytes);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      throw std::invalid_argument("write_token_file: token " + std::to_string(tokens[i]) + " at position " +
                                  std::to_string(i) + " is outside the vocabulary of " + std::to_string(vocab_size));
    }
    if (token_bytes == 2) {
      const uint16_t value = static_cast<uint16_t>(tokens[i]);
      std::memcpy(&body[i * 2], &value, 2);
    } else {
      const uint32_t value = static_cast<uint32_t>(tokens[i]);
      std::memcpy(&body[i * 4], &value, 4);
    }
  }

  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) throw std::runtime_error("write_token_file: cannot create '" + temporary + "': " + errno_text());
  const bool written = std::fwrite(&header, sizeof(header), 1, file) == 1 &&
                       (body.empty() || std::fwrite(body.data(), body.size(), 1, file) == 1) &&
                       std::fflush(file) == 0 && ::fsync(::fileno(file)) == 0;
  const std::string reason = written ? "" : errno_text();
  std::fclose(file);
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = written ? errno_text() : reason;
    std::remove(temporary.c_str());
    throw std::runtime_error("write_token_file: cannot write '" + path + "': " + why);
  }
}

TokenBuffer::TokenBuffer(std::vector<int32_t> tokens, int64_t vocab_size)
    : tokens_(std::move(tokens)), vocab_(vocab_size) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] < 0 || tokens_[i] >= vocab_) {
      throw std::invalid_argument("token buffer: token " + std::to_string(tokens_[i]) + " at position " +
                                  std::to_string(i) + " is outside the vocabulary of " + std::to_string(vocab_));
    }
  }
}

at::Tensor TokenBuffer::read(int64_t start, int64_t length) const {
  if (start < 0 || length < 0 || start + length > size()) {
    throw std::out_of_range("token buffer: tokens [" + std::to_string(start) + ", " + std::to_string(start + length) +
                            ") outside [0, " + std::to_string(size()) + ")");
  }
  return at::from_blob(const_cast<int32_t*>(tokens_.data()) + start, {length}, at::kInt).to(at::kLong);
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY);
  if (fd_ < 0) throw std::runtime_error("token file '" + path + "': cannot open: " + errno_text());
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    ::close(fd_);
    throw std::runtime_error("token file '" + path + "': cannot stat: " + errno_text());
  }
  auto fail = [&](const std::string& why) {
    if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("token file '" + path + "': " + why);
  };
  const size_t file_bytes = static_cast<size_t>(info.st_size);
  if (file_bytes < kHeaderBytes) fail("only " + std::to_string(file_bytes) + " bytes, shorter than the 32-byte header");
  mapped_bytes_ = file_bytes;
  mapping_ = ::mmap(nullptr, mapped_bytes_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    fail("cannot map: " + errno_text());
  }
  // The mapping keeps the file's pages; the descriptor is not needed past here, and a corpus of
  // thousands of shards would otherwise hold one each (the default limit is 1024).
  ::close(fd_);
  fd_ = -1;
  Header header{};
  std::memcpy(&header, mapping_, sizeof(header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0)
    fail("not a token file (bad magic; make one with fsdp-data)");
  if (header.version != kTokenFileVersion) {
    fail("format version " + std::to_string(header.version) + ", this build reads version " +
         std::to_string(kTokenFileVersion));
  }
  if (header.token_bytes != 2 && header.token_bytes != 4) {
    fail(std::to_string(header.token_bytes) + " bytes per token (expected 2 or 4)");
  }
  if (header.vocab == 0 || (header.token_bytes == 2 && header.vocab > 65536)) {
    fail("vocabulary size " + std::to_string(header.vocab) + " does not fit " + std::to_string(header.token_bytes) +
         "-byte tokens");
  }
  // Compared by division first: count * token_bytes can wrap around 64 bits to the file's size.
  const uint64_t room = (file_bytes - kHeaderBytes) / header.token_bytes;
  const size_t expected = header.count <= room ? kHeaderBytes + header.count * header.token_bytes : 0;
  if (header.count > room || file_bytes != expected) {
    fail("header says " + std::to_string(header.count) + " tokens (" +
         (header.count > room ? std::string("more than the file can hold") : std::to_string(expected) + " bytes") +
         ") but the file has " + std::to_string(file_bytes) + " bytes (truncated or corrupt)");
  }
  count_ = static_cast<int64_t>(header.count);
  vocab_ = header.vocab;
  const uint32_t kind = header.made_by >> 24;
  if (kind > static_cast<uint32_t>(TokenizerKind::Hf)) {
    fail("the header names tokenizer kind " + std::to_string(kind) + " (known: 1 byte, 2 gpt2, 3 hf; 0 none)");
  }
  stamp_ = {static_cast<TokenizerKind>(kind), header.made_by & 0xFFFFFFu};
  token_bytes_ = static_cast<int>(header.token_bytes);
  device_ = static_cast<uint64_t>(info.st_dev);
  inode_ = static_cast<uint64_t>(info.st_ino);
  modified_ns_ = static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* bytes = static_cast<const Bytef*>(mapping_);
  const size_t block = 4096;
  for (const size_t at : {size_t{0}, file_bytes / 2, file_bytes > block ? file_bytes - block : size_t{0}}) {
    const size_t begin = std::min(at, file_bytes), length = std::min(block, file_bytes - begin);
    crc = crc32(crc, bytes + begin, static_cast<uInt>(length));
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%zu bytes, crc32 %08lx", file_bytes, static_cast<unsigned long>(crc));
  fingerprint_ = text;
}

namespace {
int64_t modification_ns(const struct stat& info) {
  return static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
}
}  // namespace

TokenFile::~TokenFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

at::Tensor TokenFile::read(int64_t start, int64_t length) const {
  if (start < 0 || length < 0 || start + length > count_) {
    throw std::out_of_range("token file '" + path_ + "': tokens [" + std::to_string(start) + ", " +
                            std::to_string(start + length) + ") outside [0, " + std::to_string(count_) + ")");
  }
  // The file as it was opened? (One stat per read: a batch's windows, a few microseconds.)
  struct stat now {};
  if (::stat(path_.c_str(), &now) == 0 && static_cast<uint64_t>(now.st_dev) == device_ &&
      static_cast<uint64_t>(now.st_ino) == inode_) {
    if (static_cast<size_t>(now.st_size) < mapped_bytes_) {
      throw std::runtime_error("token file '" + path_ + "' shrank from " + std::to_string(mapped_bytes_) + " to " +
                               std::to_string(now.st_size) +
                               " bytes while training read it (truncated or rewritten in "
                               "place): restore it, and write new data beside it (fsdp-data renames into place)");
    }
    if (modification_ns(now) != modified_ns_) {
      throw std::runtime_error("token file '" + path_ +
                               "' was modified while training read it (rewritten in place, "
                               "e.g. by cp or rsync --inplace): its tokens would change under the run; restore it, "
                               "and write new data beside it (fsdp-data renames into place)");
    }
  }
  const auto* base = static_cast<const unsigned char*>(mapping_) + kHeaderBytes + start * token_bytes_;
  at::Tensor out = at::empty({length}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  int64_t largest = 0;
  for (int64_t i = 0; i < length; ++i) {
    if (token_bytes_ == 2) {
      uint16_t value;
      std::memcpy(&value, base + i * 2, 2);
      dst[i] = value;
    } else {
      uint32_t value;
      std::memcpy(&value, base + i * 4, 4);
      dst[i] = value;
    }
    largest = std::max(largest, dst[i]);
  }
  if (largest >= vocab_) {
    throw std::runtime_error("token file '" + path_ + "': token " + std::to_string(largest) + " in [" +
                             std::to_string(start) + ", " + std::to_string(start + length) +
                             ") is outside its vocabulary of " + std::to_string(vocab_));
  }
  return out;
}

}  // namespace fsdp::data
