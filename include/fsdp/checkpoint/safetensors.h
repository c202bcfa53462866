// fsdp/checkpoint/safetensors.h: the safetensors format (Hugging Face), read and written here on
// nlohmann-json:
//   bytes 0-7   uint64 little-endian N, the header's length
//   bytes 8-    N bytes of JSON: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
//               ..., "__metadata__": {"key": "value", ...}}   (offsets relative to the data start)
//   then        the data: each tensor's bytes, little-endian, row-major, at its offsets.
// Writers are atomic (a temporary file, fsynced, renamed); readers check the header against the
// file before any data is used, and can read any element range of a tensor (a rank's slice).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace fsdp::checkpoint {

struct TensorInfo {
  std::string name;
  at::ScalarType dtype = at::kFloat;  // F32, BF16, F16, F64, I64, I32, U8 are understood
  std::vector<int64_t> shape;
  int64_t begin = 0;  // data offsets, bytes from the start of the data section
  int64_t end = 0;
  int64_t numel() const;  // -1 when the shape's product overflows int64 (a crafted header)
};

const char* safetensors_dtype_name(at::ScalarType dtype);

// Writes tensors one by one, in the order declared, so a caller can stream them (gather a unit,
// write it, free it): the header is fixed from the declarations before any data.
class SafetensorsWriter {
 public:
  // Opens `path`.tmp.<pid>; throws std::runtime_error naming the file.
  SafetensorsWriter(std::string path, std::vector<TensorInfo> declared,
                    std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();  // an unfinished writer removes its temporary file
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next declared tensor: name, dtype and shape must match the declaration.
  void write(const std::string& name, const at::Tensor& tensor);
  // Checks that every declared tensor was written, flushes, fsyncs and renames into place.
  void finish();
  // crc32 of every byte written (header included): what a manifest records to check the file.
  uint32_t crc32() const { return crc_; }
  int64_t bytes_written() const { return bytes_; }
  // crc32 of each written tensor's data bytes (crc32_of_bytes of it), by name: what a manifest
  // records to check one tensor without reading the rest of the file.
  const std::map<std::string, uint32_t>& tensor_crc32s() const { return tensor_crcs_; }

 private:
  void put(const void* data, size_t bytes);

  std::string path_, temporary_;
  std::vector<TensorInfo> declared_;
  size_t next_ = 0;
  std::FILE* file_ = nullptr;
  uint32_t crc_ = 0;
  int64_t bytes_ = 0;
  std::map<std::string, uint32_t> tensor_crcs_;
  bool finished_ = false;
};

// crc32 (zlib's) of a tensor's data as a safetensors file stores it: its elements' bytes,
// row-major, little-endian. The same value whether computed on the tensor written or read back.
uint32_t crc32_of_bytes(const at::Tensor& tensor);

// Lays out tensors back to back (data offsets), for a writer's declaration.
std::vector<TensorInfo> layout_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors);
// Writes all at once.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

class SafetensorsFile {
 public:
  // Reads and checks the header: sane length, valid JSON, known dtypes, offsets inside the file,
  // not overlapping, each matching its shape. Throws std::runtime_error naming the file and entry.
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;  // throws naming the missing tensor

  at::Tensor read(const std::string& name) const;  // [shape] of its dtype
  // Elements [first, first + count) of the flattened tensor, as a 1-D tensor of its dtype:
  // reads only those bytes. Into memory of its own from 1 MiB up (shard::empty_buffer), outside
  // glibc's heap: a freed read is unmapped, never left resident in the heap for the next one to
  // miss (an import's reads of 32 MiB and 32 MiB + 512 B held both, 2026-12-06).
  at::Tensor read_range(const std::string& name, int64_t first, int64_t count) const;
  // crc32 of the whole file (reads it through once).
  uint32_t file_crc32() const;
  int64_t file_bytes() const { return file_bytes_; }

 private:
  void read_header();  // the constructor's checks; throws (the constructor closes the file then)

  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  int64_t file_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace fsdp::checkpoint
