// fsdp/checkpoint/sharded_checkpoint.h: save and restore a sharded model and its optimizer, each
// rank writing and reading only its own slice, at any world size.
//
// On disk (one directory per checkpoint, under the run's checkpoints/ folder):
//   step-00000100/manifest.json                     rank 0: format, version, step, world size, model
//                                                   name and config, every FlatParam's layout
//                                                   (names, shapes, offsets, numel, and the
//                                                   elements each rank file holds of it), optimizer,
//                                                   the module buffers (names, shapes, dtypes), and
//                                                   for each rank file its size, its crc32 and the
//                                                   crc32 of every tensor in it
//   step-00000100/rank-00001-of-00002.safetensors   rank 1: its slice of every FlatParam
//                                                   ("p<i>.param" fp32) and of the optimizer state
//                                                   ("p<i>.exp_avg", ...), its RNG state ("rng";
//                                                   on a GPU also "rng.cuda", the device's); rank 0's
//                                                   file also the module buffers ("buffer.<name>",
//                                                   in their own dtype: BatchNorm's running stats)
// Slices are ranges of each FlatParam's unpadded flat buffer: rank r of N holds elements
// [r*k, min((r+1)*k, numel)) with k its shard's size (ceil(numel / N) rounded up to 8 elements,
// an NF4 base's bytes to 16: shard/shard_extent.h), recorded per unit ("stored_per_file"), so a
// rank saves exactly what it holds and a checkpoint does not depend on the padding past numel.
// Loading, rank r' of M opens only the files whose slices overlap its new range, reads from them
// only the tensors it uses (each such slice whole, as its checksum covers all of it) and checks
// each against the manifest's crc32 before using it: a rank holding the range it saved (full_shard
// at the same N) reads exactly its own file's slices; at another N, the few slices its range
// overlaps (no_shard, which holds everything, reads all). Module buffers are replicated (the
// runtime keeps them equal on every rank): saved once, read by every rank from rank 0's file.
//
// Versions: 3 (this build's) records each unit's k. Version 2 had k = ceil(numel / N) for every
// unit and checks each tensor read against its own crc32, as 3 does. Version 1 checkpoints (one
// crc32 per file, no buffers; k as version 2) still load: each file a rank opens is checked whole,
// and a model with buffers refuses them, naming the buffer.
//
// Publication is atomic: everything is written into step-00000100.partial/ (each file fsynced),
// every rank agrees it succeeded, then rank 0 writes the manifest and renames the directory (over
// an older save of the same step, atomically exchanged: fsdp/checkpoint/published_files.h). A crash
// at any point leaves at worst a *.partial directory, which is never loaded and is removed by the
// next save.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/checkpoint/staging_buffers.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::checkpoint {

constexpr int kCheckpointFormatVersion = 3;

struct CheckpointInfo {
  int64_t step = 0;         // optimizer steps done; training resumes at this step
  std::string model_name;   // zoo name, for messages and fsdp-ckpt
  std::string config_toml;  // the run's resolved configuration
  // The trainer's own state beside the model's, as JSON text it writes and reads itself (the
  // loss-spike guard's window); "" when none (checkpoints before 2026-12-02 have none).
  std::string trainer_state;
  // The run that saved it (fsdp/train/run_directory.h): pruning and --resume latest take only
  // their own run's checkpoints. "" for checkpoints saved before run ids (2026-12-05).
  std::string run_id;
};

// Collective: every rank of the state's group calls it. Returns the published directory.
// Throws on every rank (by agreement) if any rank fails; nothing half-written is published.
std::string save_checkpoint(const std::string& checkpoints_dir, runtime::FsdpState& state,
                            optim::ShardedOptimizer* optimizer, const CheckpointInfo& info);

// A save in flight (checkpoint.async): the constructor (collective) prepares the .partial
// directory and, in_background, copies this rank's slices, optimizer state, buffers and RNG states
// into host staging buffers (pinned for a GPU's tensors), then a thread of its own writes the rank
// file; training goes on meanwhile. Publication (manifest, rename) needs every rank's file, so it
// is collective: try_publish() at a step boundary (one all-reduce of a flag: every rank must have
// finished writing), or wait_and_publish(). The thread makes no collective calls. Destroyed
// unpublished (an error stopped the run), it waits for the write and leaves the .partial, which no
// load takes and the next save removes. Not in_background: written on the calling thread, from the
// tensors themselves (save_checkpoint). `staging` (may be null: fresh buffers) keeps the staging
// buffers for the next save; it must outlive this save.
class CheckpointSave {
 public:
  CheckpointSave(const std::string& checkpoints_dir, runtime::FsdpState& state, optim::ShardedOptimizer* optimizer,
                 const CheckpointInfo& info, bool in_background, StagingBuffers* staging = nullptr);
  ~CheckpointSave();
  CheckpointSave(const CheckpointSave&) = delete;
  CheckpointSave& operator=(const CheckpointSave&) = delete;

  // Collective. True once published (then published() names the directory); false while any
  // rank is still writing. Throws on every rank if any rank's write failed.
  bool try_publish();
  // Collective: waits for this rank's write, then publishes. Returns the directory.
  std::string wait_and_publish();
  const std::string& published() const { return published_; }
  const std::string& directory() const { return directory_; }  // where it is published
  int64_t step() const { return info_.step; }
  int64_t staged_bytes() const { return staged_bytes_; }  // this rank's staging copies

 private:
  void publish();

  comm::ProcessGroupPtr group_, writers_;
  std::string checkpoints_dir_;
  CheckpointInfo info_;
  std::string flats_layout_, buffers_;  // the manifest's "flat_params" and "buffers", as JSON text
  std::string optimizer_name_;
  std::vector<std::string> optimizer_state_;
  int64_t optimizer_steps_ = 0;
  int64_t staged_bytes_ = 0;
  std::string directory_;
  std::string file_facts_ = "{}";  // this rank's file: {"bytes", "crc32", "tensors"} (written by the thread)
  std::string write_error_;        // the thread's failure, "" if none
  std::atomic<bool> written_{false};
  std::thread writer_;
  std::string published_;
};

// Collective. Loads into an already built and sharded model of the same architecture, at any world
// size; optimizer may be null (weights only: optimizer state is then neither read nor checked).
// Checks the layout and the module buffers (names, shapes, dtypes) against the model's, and each
// tensor it reads against its crc32. Restores parameters, optimizer state and buffers; RNG states
// only when the world size is unchanged (another N gives each rank another stream).
// Returns the checkpoint's info. Throws (on every rank) naming the problem; nothing is changed then.
CheckpointInfo load_checkpoint(const std::string& checkpoint_dir, runtime::FsdpState& state,
                               optim::ShardedOptimizer* optimizer);

// A published checkpoint is a directory named exactly step-<digits> (at most 18) holding a
// manifest.json; anything else beside them (a user's step-00000500-best or .bak copy) is never
// taken, pruned or removed. `run_id` (non-empty): only that run's checkpoints (and those saved
// before run ids, which name none) are considered.
//
// The newest published checkpoint under checkpoints_dir ("" if none); `partial` ones are ignored.
// max_step >= 0: the newest at or before that step (a rollback's target).
std::string find_latest_checkpoint(const std::string& checkpoints_dir, int64_t max_step = -1,
                                   const std::string& run_id = "");
// Removes published checkpoints after `step` (a rollback discards the steps after its target).
void remove_checkpoints_after(const std::string& checkpoints_dir, int64_t step, const std::string& run_id = "");
// Removes published checkpoints beyond the newest `keep` (by step number), and leftover
// step-<digits>.partial directories of interrupted saves. keep <= 0 keeps all.
// keep_at_or_before >= 0: the newest checkpoint at or before that step is kept whatever `keep`
// says (the one a rollback over the current streak of skipped steps would need).
void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep, int64_t keep_at_or_before = -1,
                       const std::string& run_id = "");

// The manifest's step, model name and config, checked as load_checkpoint checks it (no data read).
CheckpointInfo read_checkpoint_info(const std::string& checkpoint_dir);
bool is_checkpoint_dir(const std::string& path);  // holds a manifest.json

// A readable summary of a checkpoint's manifest (fsdp-ckpt inspect).
std::string describe_checkpoint(const std::string& checkpoint_dir);

// Test hook: when FSDP_TEST_PAUSE_IN_SAVE_MS is set, rank FSDP_TEST_PAUSE_RANK (default 0) sleeps
// that long after writing its file and before publication (only in the save of step
// FSDP_TEST_PAUSE_AT_STEP, when set), so a test can kill it mid-save.

}  // namespace fsdp::checkpoint
