// Private to train/: what the trainer's loop carries from step to step, and what each part of a
// step hands the next (trainer.cpp: run_step -> agree_on_step -> record_step -> after_step).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "fsdp/data/sampler.h"
#include "fsdp/train/trainer.h"
#include "step_guard.h"
#include "step_metrics.h"
#include "step_profiler.h"
#include "targets.h"

namespace fsdp::train {

using Clock = std::chrono::steady_clock;

// What the loop carries from step to step (trainer.cpp: start_loop makes it).
struct LoopState {
  explicit LoopState(data::GlobalBatchSampler s, TargetMonitor t) : sampler(std::move(s)), targets(std::move(t)) {}
  TrainSummary summary;
  data::GlobalBatchSampler sampler;
  int64_t micro = 0;              // examples per micro-batch on a rank
  double samples_per_step = 0.0;  // tokens (language models) or examples of the global batch
  double flops_per_step = 0.0;
  std::vector<double> step_seconds;   // each step's own, as agreed (rollbacks cut it)
  double communication_before = 0.0;  // every sharding group's busy seconds at the step's start
  double exposed_before = 0.0;        // of them, the seconds this thread waited
  double training_seconds = 0.0;
  double agreed_training_seconds = 0.0;   // sum of the agreed step times (the cost target's clock)
  std::map<int64_t, double> loss_faults;  // FSDP_TEST_LOSS_FAULTS: 1-based step -> loss factor (rollback.h)
  int64_t rollbacks = 0;
  int64_t last_saved_step = -1;
  bool stopped_early = false;  // targets.stop before the last step
  TargetMonitor targets;
  int64_t profile_first = 0;  // --profile-steps' first step left to profile (0: none)
  std::unique_ptr<StepProfiler> profiler;
};

// One step's work on this rank and the guard's verdict on it, before ranks exchange figures.
struct StepResult {
  int64_t step = 0;  // 0-based
  Clock::time_point start;
  double lr = 0.0;
  int64_t gathered_bytes_before = 0;  // the step's own gathers (evaluations' are not the step's)
  int64_t global_targets = 0;         // the global batch's counted targets
  bool save_in_flight = false;        // checkpoint.async: a save written beside this step
  bool profiled = false;
  bool loss_scaled = false;  // float16: a dynamic loss scale
  float loss_scale = 1.0f;   // that scale during this step
  at::Tensor loss_sum;       // this rank's share of the mean loss, a scalar on the device
  double norm = 0.0;         // the all-reduced gradient norm, before clipping
  StepGuard::Verdict verdict;
};

// Every rank's figures for the step, all-gathered, and its time.
struct AgreedStep {
  StepMetrics metrics;
  double seconds = 0.0;
};

// What the loop does after a step: end, or go on (at resume_at after a rollback).
struct AfterStep {
  bool end = false;
  int64_t resume_at = -1;
};

}  // namespace fsdp::train
