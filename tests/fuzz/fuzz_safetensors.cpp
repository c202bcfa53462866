// safetensors files (checkpoints, Hugging Face weights, PEFT adapters): open, then read every
// tensor whole and in ranges, and the file's crc32. A malformed file must throw, never crash.
#include <ATen/ATen.h>

#include <stdexcept>

#include "fsdp/checkpoint/safetensors.h"
#include "fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz_input_file(data, size, ".safetensors");
  try {
    fsdp::checkpoint::SafetensorsFile file(path);
    (void)file.file_crc32();
    for (const auto& info : file.tensors()) {
      const at::Tensor whole = file.read(info.name);
      const int64_t n = whole.numel();
      if (n > 0) (void)file.read_range(info.name, n / 2, n - n / 2);
      try {
        (void)file.read_range(info.name, n, 1);  // past the end: must throw
        __builtin_trap();
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception&) {
  }
  return 0;
}
