// Private to checkpoint/: a tensor shape as messages print it, "[4, 64]".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::checkpoint {

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace fsdp::checkpoint
