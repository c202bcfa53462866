#include "loss_spike.h"

#include <cmath>

namespace fsdp::train {

double LossSpikeDetector::zscore(double loss) const {
  if (static_cast<int64_t>(recent_.size()) < window_ || !std::isfinite(loss)) return 0.0;
  double mean = 0.0;
  for (const auto& [step, value] : recent_) mean += value;
  mean /= static_cast<double>(recent_.size());
  double variance = 0.0;
  for (const auto& [step, value] : recent_) variance += (value - mean) * (value - mean);
  variance /= static_cast<double>(recent_.size() - 1);
  const double deviation = std::sqrt(variance);
  return deviation > 0.0 ? (loss - mean) / deviation : 0.0;
}

void LossSpikeDetector::record(int64_t step, double loss) {
  if (!std::isfinite(loss)) return;
  recent_.emplace_back(step, loss);
  while (static_cast<int64_t>(recent_.size()) > window_) recent_.pop_front();
}

void LossSpikeDetector::forget_from(int64_t step) {
  while (!recent_.empty() && recent_.back().first >= step) recent_.pop_back();
}

}  // namespace fsdp::train
