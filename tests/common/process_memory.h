// Memory of this process as the kernel reports it (/proc/self/status), for tests that measure
// what the runtime frees rather than assume it.
#pragma once

#include <malloc.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace fsdp::testing {

// A field of /proc/self/status in bytes ("VmRSS:", "VmHWM:"); -1 when absent.
inline int64_t status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix(field);
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  }
  return -1;
}

// Resident bytes after returning free heap pages to the system.
inline int64_t resident_bytes() {
  malloc_trim(0);
  return status_bytes("VmRSS:");
}

}  // namespace fsdp::testing
