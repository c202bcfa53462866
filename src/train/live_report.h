// src/train/live_report.h: rank 0's report.html, rewritten as a run goes (report/run_report.h
// reads the run's metrics.jsonl), so that a browser shows the run while it trains.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "fsdp/train/reporting.h"

namespace fsdp::train {

// A failure to write never stops training: the next call says why, in one line.
class LiveReport {
 public:
  // output_dir: the run's directory (its metrics.jsonl read, its report.html written); progress:
  // where a failure is said. Both outlive the report.
  LiveReport(std::string output_dir, Progress& progress) : output_dir_(std::move(output_dir)), progress_(progress) {}
  ~LiveReport();  // waits for a report being written
  LiveReport(const LiveReport&) = delete;
  LiveReport& operator=(const LiveReport&) = delete;

  // in_background (every train.report_every steps): written by a thread of its own, off the step,
  // since reading metrics.jsonl costs more the longer the run (a 100k-step run's is tens of MB);
  // one at a time, and a call while one is still writing is skipped. Otherwise (a run's last
  // report) written now, after any in flight.
  void write(bool in_background);

 private:
  void say_failure();  // the last write's error, if any, as a progress line

  std::string output_dir_;
  Progress& progress_;
  std::thread thread_;             // the report being written off the step
  std::atomic<bool> busy_{false};  // ... until it is written
  std::mutex mutex_;               // guards error_
  std::string error_;              // the thread's failure, said at the next call
};

}  // namespace fsdp::train
