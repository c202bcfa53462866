#include "fsdp/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "fsdp/shard/storage.h"

namespace fsdp::checkpoint {

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian; this host is not");

// The header is JSON of a few entries per tensor: 100 MB is far beyond any real one and keeps a
// corrupt length from allocating the machine away.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeName {
  at::ScalarType dtype;
  const char* name;
};
constexpr DtypeName kDtypes[] = {{at::kFloat, "F32"}, {at::kBFloat16, "BF16"}, {at::kHalf, "F16"}, {at::kDouble, "F64"},
                                 {at::kLong, "I64"},  {at::kInt, "I32"},       {at::kByte, "U8"},  {at::kBool, "BOOL"}};

at::ScalarType dtype_from_name(const std::string& name, const std::string& where) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  throw std::runtime_error(where + ": unsupported dtype '" + name + "'");
}

std::string errno_text() { return std::strerror(errno); }

void pread_exact(int fd, void* out, size_t bytes, int64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, p, bytes, offset);
    if (got <= 0) {
      throw std::runtime_error("safetensors '" + path + "': cannot read " + std::to_string(bytes) +
                               " bytes at offset " + std::to_string(offset) +
                               (got == 0 ? " (file truncated)" : ": " + errno_text()));
    }
    p += got;
    bytes -= static_cast<size_t>(got);
    offset += got;
  }
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    // A crafted shape can overflow (2^32 x 2^32 wraps to 0): -1, which no size check accepts.
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

const char* safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (dtype == d.dtype) return d.name;
  }
  throw std::invalid_argument(std::string("safetensors: dtype ") + c10::toString(dtype) + " has no safetensors name");
}

uint32_t crc32_of_bytes(const at::Tensor& tensor) {
  const at::Tensor contiguous = tensor.contiguous().cpu();
  const auto* bytes = static_cast<const Bytef*>(contiguous.data_ptr());
  size_t left = static_cast<size_t>(contiguous.numel()) * contiguous.element_size();
  uint32_t crc = 0;
  while (left > 0) {  // in pieces: crc32 takes a 32-bit length
    const size_t piece = std::min<size_t>(left, 1u << 30);
    crc = static_cast<uint32_t>(::crc32(crc, bytes, static_cast<uInt>(piece)));
    bytes += piece;
    left -= piece;
  }
  return crc;
}

std::vector<TensorInfo> layout_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<TensorInfo> infos;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TensorInfo info;
    info.name = name;
    info.dtype = tensor.scalar_type();
    info.shape = tensor.sizes().vec();
    info.begin = offset;
    info.end = offset + static_cast<int64_t>(tensor.numel() * tensor.element_size());
    offset = info.end;
    infos.push_back(std::move(info));
  }
  return infos;
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorInfo> declared,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)), declared_(std::move(declared)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t expected = 0;
  for (const auto& info : declared_) {
    if (info.begin != expected ||
        info.end - info.begin != info.numel() * static_cast<int64_t>(c10::elementSize(info.dtype))) {
      throw std::invalid_argument("safetensors writer: '" + info.name +
                                  "' is not laid out back to back (use layout_tensors)");
    }
    expected = info.end;
    header[info.name] = {
        {"dtype", safetensors_dtype_name(info.dtype)}, {"shape", info.shape}, {"data_offsets", {info.begin, info.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as the reference pads
  temporary_ = path_ + ".tmp." + std::to_string(::getpid());
  file_ = std::fopen(temporary_.c_str(), "wb");
  if (file_ == nullptr) throw std::runtime_error("safetensors: cannot create '" + temporary_ + "': " + errno_text());
  const uint64_t length = text.size();
  put(&length, 8);
  put(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!finished_) std::remove(temporary_.c_str());
}

void SafetensorsWriter::put(const void* data, size_t bytes) {
  if (bytes == 0) return;
  if (std::fwrite(data, bytes, 1, file_) != 1) {
    throw std::runtime_error("safetensors: writing '" + temporary_ + "' failed: " + errno_text());
  }
  crc_ = static_cast<uint32_t>(::crc32(crc_, static_cast<const Bytef*>(data), static_cast<uInt>(bytes)));
  bytes_ += static_cast<int64_t>(bytes);
}

void SafetensorsWriter::write(const std::string& name, const at::Tensor& tensor) {
  if (next_ >= declared_.size()) throw std::logic_error("safetensors writer: '" + name + "' was not declared");
  const TensorInfo& info = declared_[next_];
  if (info.name != name || info.dtype != tensor.scalar_type() || info.shape != tensor.sizes().vec()) {
    throw std::logic_error("safetensors writer: got '" + name + "' but the next declared tensor is '" + info.name +
                           "' (or its dtype or shape differ)");
  }
  at::Tensor contiguous = tensor.contiguous().cpu();
  // Large tensors in pieces: crc32 takes a 32-bit length.
  const auto* bytes = static_cast<const char*>(contiguous.data_ptr());
  size_t left = static_cast<size_t>(contiguous.numel()) * contiguous.element_size();
  uint32_t tensor_crc = 0;
  while (left > 0) {
    const size_t piece = std::min<size_t>(left, 1u << 30);
    put(bytes, piece);
    tensor_crc =
        static_cast<uint32_t>(::crc32(tensor_crc, reinterpret_cast<const Bytef*>(bytes), static_cast<uInt>(piece)));
    bytes += piece;
    left -= piece;
  }
  tensor_crcs_[name] = tensor_crc;
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != declared_.size()) {
    throw std::logic_error("safetensors writer: only " + std::to_string(next_) + " of " +
                           std::to_string(declared_.size()) + " declared tensors were written to '" + path_ + "'");
  }
  const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const std::string reason = flushed ? "" : errno_text();
  std::fclose(file_);
  file_ = nullptr;
  if (!flushed) throw std::runtime_error("safetensors: cannot flush '" + temporary_ + "': " + reason);
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    throw std::runtime_error("safetensors: cannot rename '" + temporary_ + "' to '" + path_ + "': " + errno_text());
  }
  finished_ = true;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer(path, layout_tensors(tensors), metadata);
  for (const auto& [name, tensor] : tensors) writer.write(name, tensor);
  writer.finish();
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY);
  if (fd_ < 0) throw std::runtime_error("safetensors '" + path_ + "': cannot open: " + errno_text());
  // A constructor that throws runs no destructor: whatever refuses the file, the descriptor closes.
  try {
    read_header();
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void SafetensorsFile::read_header() {
  auto fail = [&](const std::string& why) { throw std::runtime_error("safetensors '" + path_ + "': " + why); };
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("cannot stat: " + errno_text());
  file_bytes_ = st.st_size;
  if (file_bytes_ < 8) fail("only " + std::to_string(file_bytes_) + " bytes, shorter than the 8-byte header length");
  uint64_t length = 0;
  pread_exact(fd_, &length, 8, 0, path_);
  if (length == 0 || length > kMaxHeaderBytes || 8 + length > static_cast<uint64_t>(file_bytes_)) {
    fail("bad header length " + std::to_string(length) + " for a file of " + std::to_string(file_bytes_) + " bytes");
  }
  std::string text(length, '\0');
  pread_exact(fd_, text.data(), length, 8, path_);
  data_start_ = static_cast<int64_t>(8 + length);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");
  const int64_t data_bytes = file_bytes_ - data_start_;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [key, value] : entry.items()) {
          if (!value.is_string()) fail("__metadata__ value of '" + key + "' is not a string");
          metadata_[key] = value.get<std::string>();
        }
        continue;
      }
      const std::string where = "safetensors '" + path_ + "': tensor '" + name + "'";
      TensorInfo info;
      info.name = name;
      info.dtype = dtype_from_name(entry.at("dtype").get<std::string>(), where);
      // Both are lists of unsigned integers (safetensors' usize); a fraction or 1e122 is refused
      // here, before a conversion that would truncate it or be undefined behaviour.
      const std::string& tensor = name;  // (a lambda may not capture a structured binding before C++20)
      const nlohmann::json& fields = entry;
      auto sizes = [&](const char* key) {
        const nlohmann::json& list = fields.at(key);
        std::vector<int64_t> values;
        if (!list.is_array())
          fail("tensor '" + tensor + "': " + key + " " + list.dump() + " is not a list of non-negative integers");
        for (const auto& value : list) {
          if (!value.is_number_unsigned() ||
              value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            fail("tensor '" + tensor + "': " + key + " " + list.dump() + " is not a list of non-negative integers");
          }
          values.push_back(value.get<int64_t>());
        }
        return values;
      };
      info.shape = sizes("shape");
      const auto offsets = sizes("data_offsets");
      if (offsets.size() != 2) fail("tensor '" + name + "': data_offsets must be [begin, end]");
      info.begin = offsets[0];
      info.end = offsets[1];
      for (int64_t d : info.shape) {
        if (d < 0) fail("tensor '" + name + "': negative dimension");
      }
      int64_t expected = 0;
      if (info.numel() < 0 ||
          __builtin_mul_overflow(info.numel(), static_cast<int64_t>(c10::elementSize(info.dtype)), &expected)) {
        fail("tensor '" + name + "': its shape has too many elements");
      }
      if (info.begin < 0 || info.end < info.begin || info.end - info.begin != expected) {
        fail("tensor '" + name + "': data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
             ") do not hold its " + std::to_string(expected) + " bytes");
      }
      if (info.end > data_bytes) {
        fail("tensor '" + name + "' ends at byte " + std::to_string(info.end) + " of the data but the file holds " +
             std::to_string(data_bytes) + " (truncated)");
      }
      index_[name] = tensors_.size();
      tensors_.push_back(std::move(info));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("malformed header entry: ") + e.what());
  }
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  // By (begin, end): an empty tensor at the offset where the next one starts holds no byte of it
  // (a rank's empty slice of a small flat), and sorts before it.
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      fail("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap");
    }
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::runtime_error("safetensors '" + path_ + "': no tensor named '" + name + "'");
  return tensors_[it->second];
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const TensorInfo& t = info(name);
  return read_range(name, 0, t.numel()).view(t.shape);
}

at::Tensor SafetensorsFile::read_range(const std::string& name, int64_t first, int64_t count) const {
  const TensorInfo& t = info(name);
  if (first < 0 || count < 0 || first + count > t.numel()) {
    throw std::out_of_range("safetensors '" + path_ + "': elements [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") outside tensor '" + name + "' of " +
                            std::to_string(t.numel()));
  }
  at::Tensor out = shard::empty_buffer(count, t.dtype);
  const int64_t element = static_cast<int64_t>(c10::elementSize(t.dtype));
  pread_exact(fd_, out.data_ptr(), static_cast<size_t>(count * element), data_start_ + t.begin + first * element,
              path_);
  return out;
}

uint32_t SafetensorsFile::file_crc32() const {
  uint32_t crc = 0;
  std::vector<unsigned char> buffer(1 << 20);
  for (int64_t offset = 0; offset < file_bytes_;) {
    const size_t piece = static_cast<size_t>(std::min<int64_t>(buffer.size(), file_bytes_ - offset));
    pread_exact(fd_, buffer.data(), piece, offset, path_);
    crc = static_cast<uint32_t>(::crc32(crc, buffer.data(), static_cast<uInt>(piece)));
    offset += static_cast<int64_t>(piece);
  }
  return crc;
}

}  // namespace fsdp::checkpoint
