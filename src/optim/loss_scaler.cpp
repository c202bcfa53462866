#include "fsdp/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "fsdp/runtime/fully_shard.h"
#include "fsdp/shard/flat_param.h"

namespace fsdp::optim {

DynamicLossScaler::DynamicLossScaler(const LossScalerOptions& options) : options_(options), scale_(options.init_scale) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("DynamicLossScaler: " + what); };
  if (!(std::isfinite(options.init_scale) && options.init_scale > 0)) fail("init_scale must be finite and positive");
  if (!(options.growth_factor > 1.0f)) fail("growth_factor must be above 1");
  if (!(options.backoff_factor > 0.0f && options.backoff_factor < 1.0f)) fail("backoff_factor must be in (0, 1)");
  if (options.growth_interval < 1) fail("growth_interval must be at least 1");
  if (!(options.min_scale > 0.0f && options.min_scale <= options.init_scale))
    fail("min_scale must be in (0, init_scale]");
}

float DynamicLossScaler::inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_)); }

bool DynamicLossScaler::update(bool overflow) {
  // torch's _amp_update_scale_, in fp32.
  if (overflow) {
    const float backed_off = scale_ * options_.backoff_factor;
    if (backed_off < options_.min_scale) return false;
    scale_ = backed_off;
    growth_tracker_ = 0;
    return true;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    const float grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  return true;
}

std::string DynamicLossScaler::state() const {
  return nlohmann::json{{"scale", scale_}, {"growth_tracker", growth_tracker_}}.dump();
}

void DynamicLossScaler::restore(const std::string& state) {
  float scale = 0;
  int64_t tracker = -1;
  try {
    const nlohmann::json parsed = nlohmann::json::parse(state);
    scale = parsed.at("scale").get<float>();
    tracker = parsed.at("growth_tracker").get<int64_t>();
  } catch (const std::exception& e) {
    throw std::runtime_error("loss scale state '" + state +
                             "' is not {\"scale\": ..., \"growth_tracker\": ...}: " + e.what());
  }
  if (!(std::isfinite(scale) && scale > 0) || tracker < 0) {
    throw std::runtime_error("loss scale state '" + state +
                             "' is out of range (scale finite and positive, growth_tracker >= 0)");
  }
  scale_ = scale;
  // A run resumed with a shorter growth_interval than it saved with: one more clean step grows the
  // scale (a count past the interval would never equal it again).
  growth_tracker_ = std::min(tracker, options_.growth_interval - 1);
}

void unscale_grad_shards(runtime::FsdpState& state, const DynamicLossScaler& scaler) {
  const double inv_scale = scaler.inv_scale();  // exactly an fp32 value: mul_ rounds as GradScaler's fp32 multiply
  for (shard::FlatParam* flat : state.flat_params()) {
    if (!flat->trainable() || !flat->shard_grad().defined()) continue;
    flat->wait_for_shard_grad();
    flat->shard_grad().mul_(inv_scale);
  }
}

}  // namespace fsdp::optim
