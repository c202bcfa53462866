// Private to train/: the run's [targets] (config.h, TargetsConfig) checked as it goes. Each target
// is reported once, when first missed. The trainer feeds every rank the same figures (the step
// time and peak memory agreed through the per-step all-gather, the all-reduced validation loss),
// so every rank reaches the same verdict at the same step.
#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "fsdp/train/config.h"

namespace fsdp::train {

struct TargetMiss {
  std::string key;  // the [targets] key
  int64_t step = 0;
  double value = 0, limit = 0;
  std::string message;  // one line: what, the measured value, the limit
};

class TargetMonitor {
 public:
  TargetMonitor(const TargetsConfig& targets, int ranks, bool language);
  // After step `step` (1-based): its throughput, seconds, the largest rank's peak memory, and the
  // training seconds so far. Throughput and step time are medians over the last 10 steps, judged
  // from the 5th step on (the first is warm-up).
  std::vector<TargetMiss> after_step(int64_t step, double rate, double seconds, double peak_memory,
                                     double elapsed_seconds);
  // After an evaluation at `step`; `last`: the run's final evaluation.
  std::vector<TargetMiss> after_evaluation(int64_t step, double validation_loss, bool last);

 private:
  void miss(std::vector<TargetMiss>& out, const std::string& key, int64_t step, double value, double limit,
            const std::string& what);

  TargetsConfig targets_;
  int ranks_;
  bool language_;
  int64_t steps_seen_ = 0;
  std::deque<double> rates_, seconds_;
  std::set<std::string> missed_;
  bool loss_checked_ = false;
};

}  // namespace fsdp::train
