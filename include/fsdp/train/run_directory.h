// fsdp/train/run_directory.h: one run per output directory, one job per run, and a run that acts
// only on its own checkpoints. The rules (docs/checkpoints.md, "What fsdp.cpp will never delete"):
//   - A run has an id, written at its start into <output_dir>/run.json and into every checkpoint's
//     manifest. Pruning and --resume latest take only that run's checkpoints.
//   - A fresh run (no --resume) into a directory that holds another run (its run.json, metrics,
//     config, report, sample or published checkpoints) is refused by name, with the way to continue
//     it (--resume latest) and a free directory to start over in.
//   - --resume latest continues the directory's run from its newest checkpoint; if that checkpoint is
//     at train.steps the run is done (finished()); if the run has none yet, it starts over at step 0
//     under the same id (an attempt that failed before its first checkpoint).
//   - --resume DIR of this run must name its newest checkpoint (from an older one, the later steps
//     would stay the newest: pruned into, resumed instead); a checkpoint of another run starts a new
//     run from it (fine-tuning), into a directory that holds no run.
//   - While a job runs, rank 0 holds an flock on <output_dir>/run.lock; a second job on the same
//     directory is refused, naming the first's host and pid.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/train/config.h"

namespace fsdp::train {

// A refusal by the rules above: a usage error (fsdp-train exits 2, which fsdp-run does not retry).
class RunDirectoryRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RunDirectory {
 public:
  // Collective over `world`: rank 0 decides (it takes the lock, reads and writes run.json), every
  // rank gets its verdict. `resume`: "" (a fresh run), "latest", or a checkpoint directory. Throws
  // RunDirectoryRefused on every rank for a refusal, std::runtime_error for other failures (an
  // unreadable run.json, no checkpoint for --resume latest), with the same message everywhere.
  static std::shared_ptr<RunDirectory> claim(const TrainConfig& config, const std::string& resume,
                                             const comm::ProcessGroupPtr& world);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& run_id() const { return run_id_; }
  // The checkpoint to load, or "" to start at step 0.
  const std::string& resume_from() const { return resume_from_; }
  // --resume latest on a run whose newest checkpoint is at train.steps: nothing to train, not an error.
  bool finished() const { return finished_; }
  int64_t resume_step() const { return resume_step_; }
  // Said once on rank 0 when the claim did something worth a line ("" otherwise): a run started
  // over for want of a checkpoint, an id given to a run from before run ids.
  const std::string& note() const { return note_; }
  // Rank 0, when the run's files are first written: run.json for a run id new to the directory.
  // Until then the claim is undone when destroyed: the lock file and the directory, if it made them.
  void commit();

 private:
  RunDirectory() = default;
  int lock_fd_ = -1;  // rank 0: the open run.lock, flock'ed for the job's life
  std::string run_id_, resume_from_, note_;
  std::string pending_record_, output_dir_;  // rank 0: run.json to write at commit() ("" if none)
  bool created_dir_ = false, created_lock_ = false, committed_ = false;  // rank 0: what to undo if never committed
  int64_t resume_step_ = 0;
  bool finished_ = false;
};

// The names a run writes into its output directory (besides checkpoints/): a fresh run refuses a
// directory holding any of them.
const char* const* run_file_names();

// The id in <output_dir>/run.json, "" when there is none (fsdp-run: is there a run to continue?).
// Throws for a run.json fsdp-train did not write.
std::string read_run_id(const std::string& output_dir);

}  // namespace fsdp::train
