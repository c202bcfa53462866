#include "loss_spike.h"

#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

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

std::string LossSpikeDetector::state() const {
  nlohmann::json window = nlohmann::json::array();
  for (const auto& [step, loss] : recent_) window.push_back({step, loss});
  return nlohmann::json{{"loss_window", window}}.dump();
}

void LossSpikeDetector::restore(const std::string& state) {
  recent_.clear();
  if (state.empty()) return;
  try {
    const nlohmann::json parsed = nlohmann::json::parse(state);  // (kept: the loop reads inside it)
    for (const auto& entry : parsed.at("loss_window")) {
      recent_.emplace_back(entry.at(0).get<int64_t>(), entry.at(1).get<double>());
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("the checkpoint's trainer_state has no readable loss_window: ") + e.what());
  }
  while (static_cast<int64_t>(recent_.size()) > window_) recent_.pop_front();
}

}  // namespace fsdp::train
