// Private to train/: what a rollback leaves behind ([guard] rollback_after). The steps whose
// batches a rollback skips are kept in <output_dir>/skipped_batches.json, so that a run resumed
// from a checkpoint before them (fsdp-run's restart, --resume) skips them too.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/train/config.h"
#include "step_guard.h"

namespace fsdp::train {

// What a rollback changes: the model, optimizer, spike window and loss scale (from the checkpoint), the
// batches set aside, and (on the writing rank) the checkpoints after it and the skipped-batches file.
struct RollbackTarget {
  const TrainConfig& config;
  const comm::ProcessGroupPtr& world;
  runtime::FsdpState& state;
  optim::ShardedOptimizer* optimizer;
  StepGuard& guard;  // its spike window and loss scale come back from the checkpoint
  std::set<int64_t>& skipped_batches;
  std::string skipped_batches_path;
  bool writes_files;   // this rank removes the later checkpoints and writes the skipped batches
  std::string run_id;  // the run whose checkpoints it returns to and removes ("" : any)
};
struct RolledBack {
  std::string path;                 // the checkpoint returned to
  checkpoint::CheckpointInfo info;  // its step, config and trainer state
};
// Collective. After the skipped steps [first_skipped, last_skipped] (0-based), the `rollback`-th of
// the run: loads the newest checkpoint at or before first_skipped (parameters, optimizer state,
// RNG, spike window, loss scale), removes the later ones, and sets those steps' batches aside. Every rank
// stops (AgreedStop) past guard.max_rollbacks or without such a checkpoint, saying which.
RolledBack roll_back_to_checkpoint(const RollbackTarget& target, int64_t first_skipped, int64_t last_skipped,
                                   int64_t rollback);

// 0-based step indices whose batches are not trained. Reading a missing file gives none; a file
// that is not what save wrote throws naming it. save writes atomically (temporary + rename).
std::set<int64_t> read_skipped_batches(const std::string& path);
void save_skipped_batches(const std::string& path, const std::set<int64_t>& steps);

// Test hook for the guard's tests: FSDP_TEST_LOSS_FAULTS="10:1e4,11:nan" multiplies the loss of
// steps 10 and 11 (as printed, 1-based) by those factors on every rank before backward, the first
// time those steps train (a bad batch). Empty when unset; malformed text throws naming it.
std::map<int64_t, double> loss_faults_from_env();

}  // namespace fsdp::train
