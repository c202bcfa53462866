#include "fsdp/optim/nonfinite_guard.h"

#include <cmath>
#include <string>

namespace fsdp::optim {

namespace {
// "nan", "inf" or "-inf" (std::to_string may write "-nan", whose sign means nothing).
std::string nonfinite_text(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}
}  // namespace

NonFiniteStepGuard::NonFiniteStepGuard(int64_t max_consecutive) : max_consecutive_(max_consecutive) {
  if (max_consecutive < 1) {
    throw std::invalid_argument("NonFiniteStepGuard: max_consecutive must be at least 1, got " +
                                std::to_string(max_consecutive));
  }
}

bool NonFiniteStepGuard::should_step(double grad_norm, int64_t step) {
  if (std::isfinite(grad_norm)) {
    consecutive_ = 0;
    return true;
  }
  ++consecutive_;
  ++total_;
  if (consecutive_ >= max_consecutive_) {
    throw std::runtime_error("step " + std::to_string(step) + ": gradient norm " + nonfinite_text(grad_norm) +
                             ", not finite for " + std::to_string(consecutive_) + " steps in a row (the limit), " +
                             std::to_string(total_) + " steps skipped in all: training stopped");
  }
  return false;
}

}  // namespace fsdp::optim
