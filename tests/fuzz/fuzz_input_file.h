// The readers fuzzed here take paths (they map or stream files): the input goes to a file of this
// process's own in /dev/shm (else /tmp), rewritten for every input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

inline const std::string& fuzz_input_file(const uint8_t* data, size_t size, const char* suffix = "") {
  static const std::string path = [suffix] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/fsdp_fuzz_" + std::to_string(::getpid()) + suffix;
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) __builtin_trap();
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}
