// src/train/checkpoint_writer.h: a run's checkpoints: written in the step or in the background
// (checkpoint.async), published, pruned to checkpoint.keep, and each said in a progress line and a
// metrics.jsonl record ({"checkpoint_step", "path", "seconds"[, "in_flight_seconds"]}).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/train/reporting.h"

namespace fsdp::train {

class CheckpointWriter {
 public:
  // Where and how: the run's checkpoints directory, checkpoint.keep, the run's id (pruning keeps
  // other runs' checkpoints), and whether this rank prunes and records (rank 0). The state,
  // optimizer, progress and metrics outlive the writer.
  struct Where {
    std::string checkpoints_dir;
    int64_t keep = 0;
    std::string run_id;
    bool leader = false;
  };
  CheckpointWriter(Where where, runtime::FsdpState& state, optim::ShardedOptimizer* optimizer, Progress& progress,
                   MetricsLog& metrics)
      : where_(std::move(where)), state_(state), optimizer_(optimizer), progress_(progress), metrics_(metrics) {}

  // A checkpoint of the state `info` describes. in_background: the save is started (the step waits
  // for the staging copies only) and its directory returned; finish publishes it at a later step
  // boundary. Otherwise written and published now. At most one in flight: one still in flight is
  // published first. Collective. protected_step: pruning keeps the newest checkpoint at or before
  // it, however many newer ones checkpoint.keep would leave (a rollback's, during a streak of
  // skipped steps; -1: none).
  std::string save(const checkpoint::CheckpointInfo& info, bool in_background, int64_t protected_step);

  // Publishes the save in flight once every rank has written it (wait: waits for it). Collective:
  // every rank calls it at the same step boundaries.
  void finish(bool wait, int64_t protected_step);

  bool in_flight() const { return pending_ != nullptr; }

 private:
  using Clock = std::chrono::steady_clock;
  // A published checkpoint: pruning, the progress line and the record. blocked: the seconds the
  // step waited for it; in_flight (async, else < 0): from its start to its publication.
  void published(int64_t steps, const std::string& dir, double blocked, double in_flight, int64_t protected_step);

  Where where_;
  runtime::FsdpState& state_;
  optim::ShardedOptimizer* optimizer_;
  Progress& progress_;
  MetricsLog& metrics_;
  checkpoint::StagingBuffers staging_;                   // host copies of this rank's tensors, kept between saves
  std::unique_ptr<checkpoint::CheckpointSave> pending_;  // the save in flight (uses staging_)
  double pending_blocked_ = 0.0;                         // seconds its staging held the step
  Clock::time_point pending_start_;
};

}  // namespace fsdp::train
