// Token files (fsdp-data's output, memory-mapped by training): open, then read the first, the
// middle and the last tokens. A malformed file must throw, never read past its mapping.
#include <ATen/ATen.h>

#include <stdexcept>

#include "fsdp/data/token_file.h"
#include "fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz_input_file(data, size, ".tok");
  try {
    fsdp::data::TokenFile file(path);
    const int64_t n = file.size();
    if (n > 0) {
      (void)file.read(0, std::min<int64_t>(n, 16));
      (void)file.read(n / 2, std::min<int64_t>(n - n / 2, 16));
      (void)file.read(n - 1, 1);
    }
  } catch (const std::exception&) {
  }
  return 0;
}
