// fsdp/train/trainer.h: the training loop behind fsdp-train. Builds everything from a TrainConfig
// (data, model sharded while it is built, optimizer, schedule), trains, evaluates, samples, and
// records metrics. Every rank of `world` calls train() with the same config.
//
// What it writes (rank 0, into config.output_dir, only after the config and data were checked on
// every rank): run.json (the run's id, run_directory.h), config.toml (the resolved configuration),
// metrics.jsonl (one object per step and per evaluation), sample.txt (language models).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/agreement.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/train/config.h"
#include "fsdp/train/reporting.h"
#include "fsdp/train/run_directory.h"
#include "fsdp/train/sharded_model.h"  // build_sharded_model: what train() trains

namespace fsdp::train {

struct EvalResult {
  int64_t step = 0;       // steps trained before this evaluation
  double loss = 0.0;      // mean validation loss per token (or per test image)
  double perplexity = 0;  // language models: exp(loss)
  double accuracy = -1;   // images: share of test images classified correctly; -1 otherwise
};

struct TrainSummary {
  // Training loss of every step: the mean over the global batch's counted targets (every token of a
  // window; an instruction example's trained tokens), whatever rank or micro-batch holds them.
  std::vector<double> losses;
  std::vector<double> grad_norms;  // before clipping
  int64_t skipped_steps =
      0;  // steps not applied: a non-finite gradient norm (train.max_nonfinite_steps), loss spike ([guard]) or overflow
  int64_t overflow_steps = 0;       // float16: of those, overflows of the scaled gradients ([loss_scale])
  std::vector<double> loss_scales;  // float16: the loss scale each step's backward used (empty otherwise)
  int64_t rollbacks = 0;            // [guard] rollback_after: rollbacks to an earlier checkpoint
  std::vector<EvalResult> evals;    // at the first step, every eval.every steps, and at the end
  int64_t start_step = 0;           // 0, or the step a resumed run continued from (losses[0] is its step)
  bool preempted = false;           // stopped early by request_stop(), after saving a checkpoint
  std::string last_checkpoint;      // directory of the newest checkpoint this run saved
  std::string sample;               // generated text (language models with eval.sample_tokens > 0)
  int64_t parameters = 0;
  double seconds = 0.0;                     // wall time of the training steps
  double samples_per_second = 0.0;          // tokens/s (language models) or images/s, median over steps after the first
  int64_t dropped_examples = 0;             // instructions: examples longer than the window, left out
  std::vector<std::string> missed_targets;  // [targets] missed, one line each, in order
  bool stopped_by_target = false;           // targets.stop: ended early after a miss, with a checkpoint
};

struct TrainerOptions {
  bool print = true;        // progress and summaries on rank 0's stdout
  bool write_files = true;  // config.toml, metrics.jsonl, sample.txt in output_dir
  // mpirun gives ranks a terminal even when its own output goes to a file: Lines for logs.
  ProgressStyle progress = ProgressStyle::Auto;
  // Continue from a checkpoint: a checkpoint directory, or "latest" (the newest under
  // checkpoint.dir). The loss trajectory then equals the uninterrupted run's (same N, fp32).
  std::string resume;
  // The output directory as claimed for this run (run_directory.h); null: train() claims it itself
  // (when write_files), from `resume`. Given, its resume_from() replaces `resume`.
  std::shared_ptr<RunDirectory> run;
  // fsdp-train --profile-steps A:B: steps A to B (1-based, both included) are recorded by libtorch's
  // profiler into a Chrome trace per rank, <output_dir>/profile/trace-rank<R>.json. 0: off.
  int64_t profile_first = 0, profile_last = 0;
};

// --profile-steps: "A:B" (1 <= A <= B) or "A" (one step) -> {A, B}; throws std::invalid_argument
// naming the text.
std::pair<int64_t, int64_t> parse_profile_steps(const std::string& text);

// Asks a running train() to save a checkpoint and stop at the end of the current step, on every
// rank (a request on any rank is seen by all within one step). Async-signal-safe: call it from a
// SIGTERM or SIGINT handler.
void request_stop();
bool stop_requested();

// Failures shared by every rank, or agreed on, end in comm::AgreedStop (fsdp/comm/agreement.h).
// So do train.max_nonfinite_steps steps in a row whose gradient norm is NaN or inf (each such step
// is skipped, not applied, and recorded as "skipped" in metrics.jsonl): every rank sees the same
// all-reduced norm and stops at the same step; rank 0 reports it.
using comm::AgreedStop;

// Throws (on every rank, with the same message where the cause is shared) for bad config or data:
// nothing is written before those checks pass. A rank-local failure during training throws on
// that rank; the apps then abort the job so that no rank waits forever.
TrainSummary train(const TrainConfig& config, const comm::ProcessGroupPtr& world, const TrainerOptions& options = {});

}  // namespace fsdp::train
