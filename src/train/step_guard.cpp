#include "step_guard.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace fsdp::train {

StepGuard::StepGuard(const TrainConfig& config)
    : spike_zscore_(config.guard.spike_zscore),
      rollback_after_(config.guard.rollback_after),
      max_nonfinite_steps_(config.max_nonfinite_steps),
      nonfinite_(config.max_nonfinite_steps),
      spikes_(config.guard.spike_zscore, config.guard.window) {
  if (config.fsdp.param_dtype == at::kHalf) {
    const LossScaleConfig& l = config.loss_scale;
    scaler_ = std::make_unique<optim::DynamicLossScaler>(
        optim::LossScalerOptions{static_cast<float>(l.init), static_cast<float>(l.growth_factor),
                                 static_cast<float>(l.backoff_factor), l.growth_interval, static_cast<float>(l.min)});
  }
}

StepGuard::Verdict StepGuard::judge(int64_t step, bool batch_skipped, double grad_norm, double loss) {
  Verdict verdict;
  if (batch_skipped) {
    verdict.apply = false;
    verdict.reason = "batch skipped after a rollback";
    return verdict;
  }
  const bool loss_known = needs_loss(grad_norm);
  if (scaler_ && !std::isfinite(grad_norm) && std::isfinite(loss)) {
    // The loss was fine and some scaled fp16 gradient was not: an overflow. Back off and skip; the
    // streak and the non-finite count are not this step's business.
    verdict.apply = false;
    verdict.reason = "overflow";
    ++overflow_skips_;
    const float scale = scaler_->scale();
    if (!scaler_->update(/*overflow=*/true)) {
      char text[256];
      std::snprintf(
          text, sizeof(text),
          "step %lld: float16 gradients overflow at loss scale %g, and backing off would go below loss_scale.min "
          "(%d overflows in all): training stopped (they do not fit fp16: try fsdp.param_dtype \"bfloat16\")",
          static_cast<long long>(step + 1), static_cast<double>(scale), static_cast<int>(overflow_skips_));
      verdict.stop = text;
    }
    return verdict;
  }
  try {
    // With the spike guard or loss scaling on, a non-finite loss is skipped as a non-finite norm is.
    verdict.apply = nonfinite_.should_step(loss_known && !std::isfinite(loss) ? loss : grad_norm, step + 1);
  } catch (const std::runtime_error& e) {
    verdict.apply = false;
    verdict.stop = std::string(e.what()) + " (train.max_nonfinite_steps = " + std::to_string(max_nonfinite_steps_) +
                   "; a lower optimizer.lr may help)";
  }
  if (!verdict.apply) {
    verdict.reason = "non-finite";
  } else if (spike_zscore_ > 0) {
    verdict.zscore = spikes_.zscore(loss);
    if (spikes_.is_spike(loss)) {
      verdict.apply = false;
      verdict.reason = "loss spike";
      ++spike_skips_;
    } else {
      spikes_.record(step, loss);
    }
  }
  // Finite gradients (applied, or a spike skipped) count towards the scale's growth, as GradScaler
  // counts every step it finds no inf in. A non-finite *loss* leaves the scale and its count as they
  // were, where GradScaler (which cannot tell it from an overflow) would back off: a smaller scale
  // cannot help a loss that is already inf or NaN before backward.
  if (scaler_ && std::isfinite(grad_norm)) scaler_->update(/*overflow=*/false);
  if (verdict.apply) {
    skips_in_a_row_ = 0;
  } else if (skips_in_a_row_++ == 0) {
    first_skip_in_row_ = step;
  }
  return verdict;
}

std::string StepGuard::state() const {
  nlohmann::json state = nlohmann::json::parse(spikes_.state());
  if (scaler_) state["loss_scale"] = nlohmann::json::parse(scaler_->state());
  return state.dump();
}

void StepGuard::restore(const std::string& state) {
  spikes_.restore(state);
  if (!scaler_) return;
  if (state.empty()) {
    *scaler_ = optim::DynamicLossScaler(scaler_->options());
    return;
  }
  const nlohmann::json parsed = nlohmann::json::parse(state);  // spikes_ read it already
  if (parsed.contains("loss_scale")) {
    scaler_->restore(parsed.at("loss_scale").dump());
  } else {
    // A checkpoint without a scale (an older one, or a bf16/fp32 run's): start from loss_scale.init,
    // as a new run would, also when this run had backed off before rolling back to it.
    *scaler_ = optim::DynamicLossScaler(scaler_->options());
  }
}

void StepGuard::rolled_back() {
  nonfinite_ = optim::NonFiniteStepGuard(max_nonfinite_steps_);
  skips_in_a_row_ = 0;
  first_skip_in_row_ = -1;
}

}  // namespace fsdp::train
