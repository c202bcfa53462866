// Training configs (TOML): parsed and checked as fsdp-train reads them. Bad input must throw a
// ConfigError naming the key, never crash. (model.init_from and file paths in the input name
// files that do not exist here; those paths are refused.)
#include <stdexcept>
#include <string>

#include "fsdp/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)fsdp::train::parse_train_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz.toml");
  } catch (const std::exception&) {
  }
  return 0;
}
