// src/train/step_profiler.h (private): fsdp-train --profile-steps A:B. libtorch's profiler (Kineto)
// records steps A to B (1-based, as metrics.jsonl numbers them, both included) on every rank and
// writes one Chrome trace per rank, <output_dir>/profile/trace-rank<R>.json: open it in Perfetto
// (ui.perfetto.dev) or chrome://tracing. CPU operators always; CUDA kernels and memory copies on a
// GPU. The runtime marks each unit's gathers, waits and reductions ("fsdp::gather blocks.3", ...),
// so the trace shows where communication is exposed.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/record_function.h>
#include <c10/core/Device.h>

#include <memory>

namespace fsdp::train {

class StepProfiler {
 public:
  // first == 0: off. trace_path: this rank's file (its folder is created when the trace is written).
  StepProfiler(int64_t first, int64_t last, std::string trace_path, at::Device device);
  ~StepProfiler();  // stops a profile still running (an exception mid-step) without writing it
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around each step, 1-based. begin starts the profiler at step `first`, and marks each profiled
  // step as "ProfilerStep#<step>" (torch.profiler's name, which trace viewers group by); end, after
  // step `last` (its GPU work waited for), writes the trace and returns its path; "" otherwise.
  void begin_step(int64_t step);
  std::string end_step(int64_t step);
  bool active() const { return active_; }

 private:
  int64_t first_, last_;
  std::string trace_path_;
  at::Device device_;
  bool active_ = false;
  std::unique_ptr<at::RecordFunction> step_scope_;  // the profiled step under way
};

}  // namespace fsdp::train
