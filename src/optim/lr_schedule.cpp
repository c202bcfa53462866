#include "fsdp/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace fsdp::optim {

double WarmupCosineSchedule::lr_at(int64_t step) const {
  if (total_steps <= 0 || warmup_steps < 0 || step < 0) {
    throw std::invalid_argument("WarmupCosineSchedule: need total_steps > 0, warmup_steps >= 0 and step >= 0");
  }
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace fsdp::optim
