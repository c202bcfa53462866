// fsdp/optim/loss_scaler.h: dynamic loss scaling for fp16 compute, torch.amp.GradScaler's arithmetic
// on FSDP's gradient shards (PyTorch FSDP's ShardedGradScaler).
//
// fp16 keeps 5 exponent bits: gradients below 2^-24 flush to zero. The loss is multiplied by the
// scale before backward, so the fp16 gradients are that much larger; the reduced fp32 gradient
// shards are divided by it (unscale_grad_shards) before the norm, clipping and the optimizer. A
// scale too large overflows some gradient to inf: the step is skipped and the scale backed off; a
// run of clean steps grows it again.
//
//   optim::DynamicLossScaler scaler({});                         // 2^16, x2 every 2000 clean steps, x0.5 on overflow
//   (loss * scaler.scale()).backward();
//   optim::unscale_grad_shards(state, scaler);                   // every trainable FlatParam's shard_grad
//   const double norm = optim::clip_grad_norm(state, 1.0);       // all-reduced: every rank agrees on overflow
//   const bool overflow = !std::isfinite(norm);
//   if (!overflow) optimizer.step();
//   scaler.update(overflow);                                     // false: backed off below the floor
//
// The scale is an fp32 number and every update is done in fp32, as GradScaler keeps it in a
// float tensor: the same history, value for value, for the same overflows.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::runtime {
class FsdpState;
}

namespace fsdp::optim {

struct LossScalerOptions {
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;  // clean steps in a row before the scale grows
  float min_scale = 1.0f;          // a backoff below it is refused (update returns false)
};

class DynamicLossScaler {
 public:
  // Throws std::invalid_argument naming the option that is out of range.
  explicit DynamicLossScaler(const LossScalerOptions& options);

  float scale() const { return scale_; }
  // 1 / scale as GradScaler computes it: in double, rounded to fp32.
  float inv_scale() const;
  // Clean steps since the last change of scale.
  int64_t growth_tracker() const { return growth_tracker_; }

  // After a step: an overflow multiplies the scale by backoff_factor and restarts the count;
  // otherwise growth_interval clean steps in a row multiply it by growth_factor (unless that would
  // be inf). Returns false, leaving the scale as it was, when a backoff would go below min_scale.
  bool update(bool overflow);

  // {"scale": s, "growth_tracker": t}: kept in checkpoints so a resumed run scales as the
  // uninterrupted one. restore throws std::runtime_error naming what is missing or out of range;
  // a count at or past this scaler's growth_interval (the config changed) becomes growth_interval - 1.
  const LossScalerOptions& options() const { return options_; }
  std::string state() const;
  void restore(const std::string& state);

 private:
  LossScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
};

// Divides every trainable FlatParam's gradient shard by the scale (multiplies by inv_scale in the
// shard's dtype), waiting for reductions still in flight. Local: no communication. A non-finite
// gradient stays non-finite, so the norm that follows finds it.
void unscale_grad_shards(runtime::FsdpState& state, const DynamicLossScaler& scaler);

}  // namespace fsdp::optim
