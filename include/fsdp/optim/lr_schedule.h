// fsdp/optim/lr_schedule.h: learning rate as a function of the step.
#pragma once

#include <cstdint>

namespace fsdp::optim {

// Linear warm-up from peak/warmup_steps to peak over warmup_steps, then cosine decay to min_lr at
// total_steps (and min_lr after). warmup_steps may be 0.
struct WarmupCosineSchedule {
  double peak_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  double lr_at(int64_t step) const;  // step counts from 0
};

}  // namespace fsdp::optim
