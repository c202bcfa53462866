// The bytes of every rank file of a checkpoint (its .safetensors), by file name: equal bytes, equal
// state. Tests compare two runs' final parameters and optimizer moments with it.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

namespace fsdp_test {

inline std::map<std::string, std::string> checkpoint_data(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    files[entry.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

}  // namespace fsdp_test
