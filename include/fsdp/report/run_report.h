// fsdp/report/run_report.h: a run at a glance. Reads what fsdp-train leaves in a run directory
// (metrics.jsonl: a run_start record per start or resume, a record per step, evaluations,
// checkpoints, target misses) and writes one self-contained HTML page: inline SVG plots, no
// script, nothing fetched, so it opens offline. Several runs overlay, each in its own colour.
//
// Plots (x: the step): training and validation loss; learning rate; tokens/s (or images/s); MFU;
// per-rank peak memory with fsdp-plan's prediction; communication busy and exposed time; gradient
// norm. Skipped steps, checkpoints, restarts and missed targets are marked on every time axis.
// Then the targets with their outcome, and each run's resolved config.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp::report {

struct StepPoint {
  int64_t step = 0;  // 1-based, as metrics.jsonl records it
  double loss = 0, lr = 0, grad_norm = 0, rate = 0, mfu = 0, step_seconds = 0;
  double communication = 0, exposed = -1;  // max over ranks; exposed -1: not measured (GPU)
  double loss_scale = 0;                   // float16 compute: the step's loss scale (0: none)
  std::vector<double> peak_memory_per_rank;
  bool skipped = false;
};

struct EvalPoint {
  int64_t step = 0;
  double loss = 0;
  double accuracy = -1;  // images only
};

// A point on the time axis worth marking.
struct RunEvent {
  enum class Kind { Skipped, Checkpoint, Restart, TargetMissed };
  Kind kind;
  int64_t step = 0;
  std::string text;
};

struct TargetOutcome {
  std::string key;  // min_tokens_per_second, ...
  double limit = 0;
  bool missed = false;
  int64_t step = 0;     // where it was missed
  std::string message;  // fsdp-train's line
};

struct RunData {
  std::string dir, name;
  bool language = true;
  int world_size = 0;
  std::string config_toml;          // the resolved config (config.toml)
  double predicted_peak_bytes = 0;  // fsdp-plan's per-rank total for this config (0: unknown)
  std::vector<StepPoint> steps;
  std::vector<EvalPoint> evals;
  std::vector<RunEvent> events;
  std::vector<TargetOutcome> targets;
  std::vector<std::string> warnings;  // lines left out (a truncated last line)
};

// Reads RUN_DIR/metrics.jsonl (and config.toml). Throws std::runtime_error with one line naming
// the file and what is wrong: no metrics.jsonl, a malformed line other than the last, no step
// records. A truncated last line (a run writing, or one that died mid-line) is left out with a
// warning.
RunData read_run(const std::string& dir);

// The page, for one or more runs.
std::string render_html(const std::vector<RunData>& runs);

// read_run for each directory, render_html, and an atomic write to `output` (a temporary file
// renamed into place, so a browser never sees half a page). Returns the warnings.
std::vector<std::string> write_report(const std::vector<std::string>& run_dirs, const std::string& output);

}  // namespace fsdp::report
