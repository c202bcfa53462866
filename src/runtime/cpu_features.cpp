#include "fsdp/runtime/cpu_features.h"

#include <fstream>
#include <sstream>
#include <string>

namespace fsdp::runtime {

bool cpu_has_bf16_instructions() {
  static const bool has = [] {
#if defined(__x86_64__) || defined(__i386__)
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
      if (line.rfind("flags", 0) != 0) continue;
      std::istringstream flags(line.substr(line.find(':') + 1));
      for (std::string flag; flags >> flag;) {
        if (flag == "avx512_bf16" || flag == "amx_bf16") return true;
      }
      return false;  // the first CPU's flags speak for all of them
    }
#endif
    return true;  // unknown (no /proc/cpuinfo, or not x86): claim nothing
  }();
  return has;
}

}  // namespace fsdp::runtime
