// Private to train/: whether each step's update is applied, and when a streak of skipped steps
// calls for a rollback. Four things skip a step, on every rank alike (each is judged from
// all-reduced numbers, so no further agreement is needed):
//   overflow     float16 compute: the gradient norm is NaN or inf while the loss is finite, an
//                expected event of loss scaling: the scale backs off (optim/loss_scaler.h). Counted
//                apart: it neither counts towards max_nonfinite_steps nor starts a rollback streak.
//                A backoff below loss_scale.min stops the run.
//   non-finite   the gradient norm (or, with the spike guard or loss scaling on, the loss) is NaN
//                or inf; train.max_nonfinite_steps of them in a row stop the run (optim/nonfinite_guard.h)
//   loss spike   [guard] spike_zscore: the loss stands that many deviations above the recent
//                window of applied steps (loss_spike.h; the window is kept in checkpoints)
//   batch        a rollback set the step's batch aside (rollback.h)
// A skipped step still counts as a step (schedule, sampler and step number move on, as with PyTorch
// AMP's GradScaler); the optimizer's own count does not.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/optim/loss_scaler.h"
#include "fsdp/optim/nonfinite_guard.h"
#include "fsdp/train/config.h"
#include "loss_spike.h"

namespace fsdp::train {

class StepGuard {
 public:
  explicit StepGuard(const TrainConfig& config);

  struct Verdict {
    bool apply = true;
    std::string reason;   // why not: "overflow", "non-finite", "loss spike", "batch skipped after a rollback"
    double zscore = 0.0;  // the loss against the spike window (0 when the spike guard is off or not judging)
    std::string stop;     // not empty: record this step, then every rank stops with this message
  };
  // Whether the verdict must be known before the update is applied: the spike guard judges the
  // step's loss. Otherwise a step is applied exactly when its gradient norm is finite (an overflow
  // and a non-finite gradient have a non-finite norm; a non-finite loss with finite gradients is
  // applied, and the trainer stops as diverged), so the optimizer can skip it on the device and
  // judge() record the verdict afterwards.
  bool judges_before_the_update() const { return spike_zscore_ > 0; }
  // Whether judging this step needs its all-reduced loss: the spike guard always; loss scaling when
  // the gradient norm is not finite (an overflow, or a non-finite loss).
  bool needs_loss(double grad_norm) const { return spike_zscore_ > 0 || (scaler_ && !std::isfinite(grad_norm)); }
  // `step` 0-based; `loss` the all-reduced loss (read only when needs_loss(grad_norm)). With loss
  // scaling, also updates the scale (an overflow backs it off, a step with finite gradients counts
  // towards growth).
  Verdict judge(int64_t step, bool batch_skipped, double grad_norm, double loss);

  // float16 compute: the loss scaler (nullptr otherwise).
  optim::DynamicLossScaler* scaler() { return scaler_.get(); }
  const optim::DynamicLossScaler* scaler() const { return scaler_.get(); }
  int64_t overflow_steps() const { return overflow_skips_; }

  // guard.rollback_after steps skipped in a row (batches set aside do not count).
  bool rollback_due() const { return rollback_after_ > 0 && skips_in_a_row_ >= rollback_after_; }
  // The first step (0-based) of the current streak of skipped steps, -1 without one: the newest
  // checkpoint at or before it is what a rollback returns to, and must not be pruned meanwhile.
  int64_t streak_start() const { return skips_in_a_row_ > 0 ? first_skip_in_row_ : -1; }
  // After a rollback: the streak and the non-finite count start afresh (the spike window is the
  // checkpoint's, restored through spikes()).
  void rolled_back();

  int64_t skipped_steps() const { return nonfinite_.total_skips() + spike_skips_ + overflow_skips_; }
  LossSpikeDetector& spikes() { return spikes_; }

  // What checkpoints keep of the guard (CheckpointInfo::trainer_state, JSON): the spike window and
  // the loss scale. restore("") empties the window and leaves the scale at its start (an older
  // checkpoint, or one of a run without loss scaling).
  std::string state() const;
  void restore(const std::string& state);

 private:
  double spike_zscore_;
  int64_t rollback_after_;
  int64_t max_nonfinite_steps_;
  optim::NonFiniteStepGuard nonfinite_;
  LossSpikeDetector spikes_;
  int64_t spike_skips_ = 0;
  std::unique_ptr<optim::DynamicLossScaler> scaler_;  // float16 compute only
  int64_t overflow_skips_ = 0;
  int64_t skips_in_a_row_ = 0;
  int64_t first_skip_in_row_ = -1;
};

}  // namespace fsdp::train
