// Checkpoint manifests (manifest.json): parsed and checked; a damaged one must throw, naming the key.
#include <stdexcept>
#include <string>

#include "manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)fsdp::checkpoint::parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const std::exception&) {
  }
  return 0;
}
