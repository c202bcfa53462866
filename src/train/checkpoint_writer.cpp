#include "checkpoint_writer.h"

#include <nlohmann/json.hpp>

#include <cstdio>

namespace fsdp::train {

std::string CheckpointWriter::save(const checkpoint::CheckpointInfo& info, bool in_background, int64_t protected_step) {
  finish(/*wait=*/true, protected_step);  // at most one in flight
  const auto start = Clock::now();
  if (!in_background) {
    const std::string dir = checkpoint::save_checkpoint(where_.checkpoints_dir, state_, optimizer_, info);
    published(info.step, dir, std::chrono::duration<double>(Clock::now() - start).count(), -1.0, protected_step);
    return dir;
  }
  pending_ = std::make_unique<checkpoint::CheckpointSave>(where_.checkpoints_dir, state_, optimizer_, info,
                                                          /*in_background=*/true, &staging_);
  pending_blocked_ = std::chrono::duration<double>(Clock::now() - start).count();
  pending_start_ = start;
  char line[512];
  std::snprintf(line, sizeof(line), "checkpoint step %lld | %s of shards staged in %.3f s, written in the background",
                static_cast<long long>(info.step), format_bytes(static_cast<double>(pending_->staged_bytes())).c_str(),
                pending_blocked_);
  progress_.message(line);
  return pending_->directory();
}

void CheckpointWriter::finish(bool wait, int64_t protected_step) {
  if (!pending_) return;
  const int64_t steps = pending_->step();
  const auto start = Clock::now();
  if (wait) {
    pending_->wait_and_publish();
  } else if (!pending_->try_publish()) {
    return;
  }
  // What training waited for it: the staging, and a wait for the write (the next save, the end).
  const double blocked = pending_blocked_ + std::chrono::duration<double>(Clock::now() - start).count();
  const double seconds = std::chrono::duration<double>(Clock::now() - pending_start_).count();
  const std::string dir = pending_->published();
  pending_.reset();
  published(steps, dir, blocked, seconds, protected_step);
}

void CheckpointWriter::published(int64_t steps, const std::string& dir, double blocked, double in_flight,
                                 int64_t protected_step) {
  if (where_.leader) {
    checkpoint::prune_checkpoints(where_.checkpoints_dir, where_.keep, protected_step, where_.run_id);
  }
  char line[512];
  if (in_flight < 0) {
    std::snprintf(line, sizeof(line), "checkpoint step %lld | %s | %.2f s", static_cast<long long>(steps), dir.c_str(),
                  blocked);
  } else {
    std::snprintf(line, sizeof(line),
                  "checkpoint step %lld | %s | published %.2f s after it started; steps waited %.3f s",
                  static_cast<long long>(steps), dir.c_str(), in_flight, blocked);
  }
  progress_.message(line);
  if (where_.leader && metrics_.is_open()) {
    // seconds: what the steps waited for it (the whole save when synchronous).
    nlohmann::json record{{"checkpoint_step", steps}, {"path", dir}, {"seconds", blocked}};
    if (in_flight >= 0) record["in_flight_seconds"] = in_flight;
    metrics_.write(record.dump());
  }
}

}  // namespace fsdp::train
