// fsdp/optim/optimizer_kind.h: which optimizer a run steps with (optimizer.name, fsdp-plan --optimizer).
#pragma once

#include "fsdp/enum_names.h"

namespace fsdp::optim {
// AdamW keeps two fp32 moments per trainable parameter; SGD with momentum one buffer.
enum class OptimizerKind { AdamW, Sgd };
}  // namespace fsdp::optim

namespace fsdp {
template <>
struct EnumNames<optim::OptimizerKind> {
  static constexpr std::pair<optim::OptimizerKind, const char*> values[] = {
      {optim::OptimizerKind::AdamW, "adamw"},
      {optim::OptimizerKind::Sgd, "sgd"},
  };
};
}  // namespace fsdp
