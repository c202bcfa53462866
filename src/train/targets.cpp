#include "targets.h"

#include <algorithm>
#include <cstdio>

#include "fsdp/train/reporting.h"

namespace fsdp::train {

namespace {
double median(std::deque<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}
}  // namespace

TargetMonitor::TargetMonitor(const TargetsConfig& targets, int ranks, bool language)
    : targets_(targets), ranks_(ranks), language_(language) {}

void TargetMonitor::miss(std::vector<TargetMiss>& out, const std::string& key, int64_t step, double value, double limit,
                         const std::string& what) {
  if (!missed_.insert(key).second) return;
  out.push_back({key, step, value, limit, "target missed at step " + std::to_string(step) + ": " + what});
}

std::vector<TargetMiss> TargetMonitor::after_step(int64_t step, double rate, double seconds, double peak_memory,
                                                  double elapsed_seconds) {
  std::vector<TargetMiss> out;
  if (++steps_seen_ > 1) {  // the first step is warm-up
    rates_.push_back(rate), seconds_.push_back(seconds);
    if (rates_.size() > 10) rates_.pop_front(), seconds_.pop_front();
  }
  char what[256];
  const char* unit = language_ ? "tokens/s" : "images/s";
  if (rates_.size() >= 4) {
    const double r = median(rates_), s = median(seconds_);
    if (targets_.min_tokens_per_second > 0 && r < targets_.min_tokens_per_second) {
      std::snprintf(what, sizeof(what),
                    "%s %s (median of the last %zu steps) is below targets.min_tokens_per_second = %s",
                    format_count(r).c_str(), unit, rates_.size(), format_count(targets_.min_tokens_per_second).c_str());
      miss(out, "min_tokens_per_second", step, r, targets_.min_tokens_per_second, what);
    }
    if (targets_.max_step_seconds > 0 && s > targets_.max_step_seconds) {
      std::snprintf(what, sizeof(what),
                    "a step takes %.3f s (median of the last %zu), above targets.max_step_seconds = %.3f s", s,
                    seconds_.size(), targets_.max_step_seconds);
      miss(out, "max_step_seconds", step, s, targets_.max_step_seconds, what);
    }
  }
  if (targets_.max_memory_per_rank > 0 && peak_memory > static_cast<double>(targets_.max_memory_per_rank)) {
    std::snprintf(what, sizeof(what), "a rank's peak memory %s is above targets.max_memory_per_rank = %s",
                  format_bytes(peak_memory).c_str(),
                  format_bytes(static_cast<double>(targets_.max_memory_per_rank)).c_str());
    miss(out, "max_memory_per_rank", step, peak_memory, static_cast<double>(targets_.max_memory_per_rank), what);
  }
  if (targets_.max_cost > 0) {
    const double cost = elapsed_seconds / 3600.0 * ranks_ * targets_.price_per_device_hour;
    if (cost > targets_.max_cost) {
      std::snprintf(what, sizeof(what),
                    "the run has cost %.4g (%d devices x %.4g h x %.4g per device-hour), above targets.max_cost = %.4g",
                    cost, ranks_, elapsed_seconds / 3600.0, targets_.price_per_device_hour, targets_.max_cost);
      miss(out, "max_cost", step, cost, targets_.max_cost, what);
    }
  }
  return out;
}

std::vector<TargetMiss> TargetMonitor::after_evaluation(int64_t step, double validation_loss, bool last) {
  std::vector<TargetMiss> out;
  if (targets_.max_validation_loss <= 0 || loss_checked_) return out;
  const int64_t by = targets_.max_validation_loss_step;
  if (!((by > 0 && step >= by) || last)) return out;  // a step past the run's end: judged at its end
  loss_checked_ = true;
  if (validation_loss > targets_.max_validation_loss) {
    char what[256];
    std::snprintf(what, sizeof(what), "validation loss %.4f at step %lld is above targets.max_validation_loss = %.4f%s",
                  validation_loss, static_cast<long long>(step), targets_.max_validation_loss,
                  by > 0 ? (" by step " + std::to_string(by)).c_str() : " at the end");
    miss(out, "max_validation_loss", step, validation_loss, targets_.max_validation_loss, what);
  }
  return out;
}

}  // namespace fsdp::train
