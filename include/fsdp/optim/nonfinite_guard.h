// fsdp/optim/nonfinite_guard.h: whether a step's gradients may be applied, given their norm.
//
// A NaN or infinite gradient norm means some gradient is not finite: applying it would turn the
// parameters (and AdamW's moments) into NaN for good. The guard says to skip such a step, counts the
// skips, and gives up after `max_consecutive` non-finite steps in a row (a model that has blown up
// does not recover by skipping). The same policy as PyTorch AMP's GradScaler, minus the scaling.
//
//   optim::NonFiniteStepGuard guard(5);
//   const double norm = optim::clip_grad_norm(state, 1.0);  // untouched gradients when not finite
//   if (guard.should_step(norm, step)) optimizer.step();     // throws on the 5th in a row
//
// The norm is the result of an all-reduce, so every rank sees the same value and takes the same
// decision (and throws at the same step): no further agreement is needed.
#pragma once

#include <cstdint>
#include <stdexcept>

namespace fsdp::optim {

class NonFiniteStepGuard {
 public:
  // max_consecutive >= 1: the non-finite steps in a row that end the run (1: the first one).
  explicit NonFiniteStepGuard(int64_t max_consecutive);

  // True when grad_norm is finite (the caller steps). Otherwise counts a skip and returns false,
  // or throws std::runtime_error naming `step` and the count once max_consecutive non-finite
  // steps came in a row. `step` is only for that message (the caller's numbering).
  bool should_step(double grad_norm, int64_t step);

  int64_t consecutive_skips() const { return consecutive_; }  // non-finite steps since the last finite one
  int64_t total_skips() const { return total_; }              // every skip since construction
  int64_t max_consecutive() const { return max_consecutive_; }

 private:
  int64_t max_consecutive_;
  int64_t consecutive_ = 0;
  int64_t total_ = 0;
};

}  // namespace fsdp::optim
