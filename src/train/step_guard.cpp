#include "step_guard.h"

#include <cmath>
#include <stdexcept>

namespace fsdp::train {

StepGuard::StepGuard(const TrainConfig& config)
    : spike_zscore_(config.guard.spike_zscore), rollback_after_(config.guard.rollback_after),
      max_nonfinite_steps_(config.max_nonfinite_steps), nonfinite_(config.max_nonfinite_steps),
      spikes_(config.guard.spike_zscore, config.guard.window) {}

StepGuard::Verdict StepGuard::judge(int64_t step, bool batch_skipped, double grad_norm, double loss) {
  Verdict verdict;
  if (batch_skipped) {
    verdict.apply = false;
    verdict.reason = "batch skipped after a rollback";
    return verdict;
  }
  try {
    // With the spike guard on, a non-finite loss is skipped as a non-finite norm is.
    verdict.apply = nonfinite_.should_step(needs_loss() && !std::isfinite(loss) ? loss : grad_norm, step + 1);
  } catch (const std::runtime_error& e) {
    verdict.apply = false;
    verdict.stop = std::string(e.what()) + " (train.max_nonfinite_steps = " + std::to_string(max_nonfinite_steps_) +
                   "; a lower optimizer.lr may help)";
  }
  if (!verdict.apply) {
    verdict.reason = "non-finite";
  } else if (needs_loss()) {
    verdict.zscore = spikes_.zscore(loss);
    if (spikes_.is_spike(loss)) {
      verdict.apply = false;
      verdict.reason = "loss spike";
      ++spike_skips_;
    } else {
      spikes_.record(step, loss);
    }
  }
  if (verdict.apply) {
    skips_in_a_row_ = 0;
  } else if (skips_in_a_row_++ == 0) {
    first_skip_in_row_ = step;
  }
  return verdict;
}

void StepGuard::rolled_back() {
  nonfinite_ = optim::NonFiniteStepGuard(max_nonfinite_steps_);
  skips_in_a_row_ = 0;
  first_skip_in_row_ = -1;
}

}  // namespace fsdp::train
