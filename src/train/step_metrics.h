// Private to train/: a training step's metrics. What each rank measured travels in one small
// all-gather per step (which also carries a stop request, so every rank stops after the same
// step, and the fingerprint of the step's collectives, compared there); from every rank's numbers come the figures the
// step reports, in two forms: the progress line and the metrics.jsonl record.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/process_group.h"

namespace fsdp::train {

// What this rank measured in the step.
struct RankStepFacts {
  double loss = 0.0;                        // its share of the global batch's mean loss
  double peak_resident_bytes = 0.0;         // the process's peak resident memory
  double communication_seconds = 0.0;       // busy time of the step's collectives, every group
  bool stop_requested = false;              // asked to save and stop (SIGTERM, SIGINT)
  double exposed_seconds = 0.0;             // time this thread (or its device stream) waited for collectives
  double device_peak_reserved_bytes = 0.0;  // on a GPU, the caching allocator's peak reservation
  double step_seconds = 0.0;                // the step's time on this rank's clock, up to this gather
  comm::CollectiveFingerprint collectives;  // the step's collectives so far (comm/collective_log.h)
};

// Every rank's facts and the step's figures from them.
struct StepMetrics {
  at::Tensor
      per_rank;  // [world, 7 + comm::kFingerprintDoubles] fp64, one row of RankStepFacts per rank, in field order
  std::vector<comm::CollectiveFingerprint> collectives;  // [world] each rank's step fingerprint
  bool stop = false;                                     // some rank was asked to stop
  double loss = 0.0;                                     // mean over ranks
  double peak_memory = 0.0;    // max over ranks: device reservation on a GPU, resident memory on the CPU
  double communication = 0.0;  // max over ranks, busy seconds
  double exposed = 0.0;        // max over ranks, seconds waited
  double step_seconds = 0.0;   // max over ranks: what every rank agrees the step took (targets judge it)
};

// Collective over `world`: one all-gather. on_cpu: the model's device is the host.
StepMetrics gather_step_metrics(const comm::ProcessGroupPtr& world, const RankStepFacts& mine, bool on_cpu);

// The step's own figures, besides the gathered ones.
struct StepFigures {
  int64_t step = 0;  // 0-based; shown as step + 1 (the steps done)
  double lr = 0.0;
  double grad_norm = 0.0;           // before clipping
  double seconds = 0.0;             // the step's wall time
  double samples_per_step = 0.0;    // tokens (language models) or images per global batch
  int64_t trained_tokens = 0;       // language models: the global batch's counted targets (padding and prompts not)
  bool save_in_flight = false;      // checkpoint.async: a save was being written in the background during the step
  double flops_per_step = 0.0;      // the model's FLOPs for one global batch
  double peak_flops = 1.0;          // all ranks' measured matmul rate: MFU's denominator
  bool language = true;             // rates in tokens (else images)
  bool on_cpu = true;               // the model's device is the host
  int64_t peak_gathered_bytes = 0;  // this rank's FSDP gathered buffers at their peak
  int64_t gathered_wire_bytes = 0;  // bytes this step's parameter all-gathers delivered to this rank
  bool skipped = false;             // not applied: see skip_reason
  std::string skip_reason;          // "overflow", "non-finite", "loss spike", "batch skipped after a rollback"
  double loss_zscore = 0.0;         // [guard] spike_zscore on: the loss against the recent window (0 otherwise)
  bool profiled = false;            // --profile-steps: recorded by the profiler (slower; comparisons leave it out)
  int64_t skipped_steps = 0;        // steps skipped so far in this run, this one included
  double loss_scale = 0.0;          // float16: the scale this step's backward used (0: no loss scaling)
  int64_t overflow_steps = 0;       // float16: of skipped_steps, overflows
  double rate() const { return samples_per_step / seconds; }
  double mfu() const { return flops_per_step / seconds / peak_flops; }
};

// "| loss 2.3456 | lr 1.00e-03 | gnorm 0.812 | 12.3k tok/s | MFU 3.1% | peak mem 1.2 GiB | comm 0.012 s (exposed 0.004
// s)", then "| scale 65536" with loss scaling, then "| skipped: overflow (2 in all)" for a skipped step, or
// "| 2 skipped" once some were.
std::string step_line(const StepMetrics& metrics, const StepFigures& figures);
// The metrics.jsonl record: the line's figures ("skipped", "skipped_steps" included) and every
// rank's memory and communication.
nlohmann::json step_record(const StepMetrics& metrics, const StepFigures& figures);

}  // namespace fsdp::train
