// Private to train/: whether a step's loss is a spike, against the losses of the recent steps that
// were applied ([guard] spike_zscore, window). Every rank judges the same all-reduced loss with
// the same history, so every rank reaches the same verdict without further communication.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>

namespace fsdp::train {

class LossSpikeDetector {
 public:
  // zscore 0: never a spike. window >= 2: the applied steps' losses the mean and deviation use.
  LossSpikeDetector(double zscore, int64_t window) : zscore_(zscore), window_(window) {}

  // (loss - mean) / standard deviation over the window; 0 until the window is full, or when its
  // losses are all equal.
  double zscore(double loss) const;
  // A non-finite loss is not judged here (the non-finite guard skips it).
  bool is_spike(double loss) const { return zscore_ > 0 && zscore(loss) > zscore_; }

  void record(int64_t step, double loss);  // an applied step's loss

  // The window as JSON text ({"loss_window": [[step, loss], ...]}), kept in every checkpoint
  // (CheckpointInfo::trainer_state) so that a resumed or rolled-back run judges its first steps
  // against the same window as an uninterrupted one. restore("") empties it (an older checkpoint);
  // anything else unreadable throws std::runtime_error naming what.
  std::string state() const;
  void restore(const std::string& state);

 private:
  double zscore_;
  int64_t window_;
  std::deque<std::pair<int64_t, double>> recent_;  // (step, loss), oldest first, at most window_
};

}  // namespace fsdp::train
