// fsdp/train/reporting.h: what the trainer shows and records: a progress bar (or plain lines when
// stdout is not a terminal), JSONL metrics, this process's peak memory, and the matmul rate that
// MFU is measured against.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace fsdp::train {

// Peak resident memory of this process (VmHWM), in bytes; -1 if the kernel does not say.
int64_t peak_resident_bytes();

// FSDP_MEMORY_TRACE=1: one stderr line per training phase per rank: the phase's peak resident
// memory (VmHWM, reset after each line) and peak live bytes (glibc's bytes in use plus FSDP's
// mapped host buffers, sampled every millisecond), then at its end the resident memory, the live
// bytes and glibc's heap (bytes mapped): where a step's peak comes from. peak_resident_bytes still reports the
// process's peak.
bool memory_trace_enabled();
void trace_memory(int rank, int64_t step, const char* phase);

// Sustained matmul rate of this process on `device` in `dtype` (the compute dtype) with its
// current intra-op threads, in FLOP/s, timed over about `seconds` of square products sized like a
// training step's (512 on the CPU, 8192 on a GPU, where smaller ones cannot fill it). MFU's peak.
double measure_matmul_flops(double seconds, at::Device device = at::kCPU, at::ScalarType dtype = at::kFloat);

std::string format_bytes(double bytes);       // "1.5 MiB"
std::string format_count(double value);       // "12.3k", "1.2M"
std::string format_thousands(int64_t value);  // "70,553,706,496"
std::string format_duration(double seconds);  // "3m12s"

// One line per step on a terminal (rewritten in place, with a bar and ETA); otherwise a plain line
// every `every` steps and at the last. Messages (evaluations, notes) print on their own lines.
enum class ProgressStyle { Auto, Bar, Lines };  // Auto: a bar when stdout is a terminal

class Progress {
 public:
  Progress(int64_t total_steps, int64_t every, bool enabled, ProgressStyle style = ProgressStyle::Auto);
  ~Progress();
  // step is 0-based; seconds_so_far is the wall time since the first step started.
  void step(int64_t step, const std::string& metrics, double seconds_so_far);
  void message(const std::string& line);

 private:
  int64_t total_;
  int64_t every_;
  bool enabled_;
  bool terminal_;
  bool line_open_ = false;
};

// Appends one JSON object per line, flushed each time so a crash loses at most the last line.
class MetricsLog {
 public:
  MetricsLog() = default;
  // Truncates (or appends, for a resumed run); throws if it cannot be opened.
  explicit MetricsLog(const std::string& path, bool append = false);
  bool is_open() const { return out_.is_open(); }
  void write(const std::string& json_line);

 private:
  std::ofstream out_;
};

}  // namespace fsdp::train
