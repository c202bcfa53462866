// fsdp/runtime/dtype_names.h: the floating dtypes a config or a flag names (fsdp.param_dtype,
// fsdp.reduce_dtype, --param-dtype): float32, bfloat16, float16.
#pragma once

#include <c10/core/ScalarType.h>

#include "fsdp/enum_names.h"

namespace fsdp {
template <>
struct EnumNames<at::ScalarType> {
  static constexpr std::pair<at::ScalarType, const char*> values[] = {
      {at::kFloat, "float32"},
      {at::kBFloat16, "bfloat16"},
      {at::kHalf, "float16"},
  };
};
}  // namespace fsdp
