// fsdp/comm/agreement.h: stopping every rank together when some of them fail.
//
// A step that may fail on some ranks only (reading a config, data or a checkpoint, writing files)
// ends with agree_on_failure: one small all-reduce, after which either every rank continues or
// every rank throws AgreedStop. No rank is left waiting in a collective for one that gave up.
#pragma once

#include <stdexcept>
#include <string>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

// Every rank stops, by agreement: apps just exit non-zero, printing what() where should_report()
// (the lowest failing rank, or each failing rank when rank 0 did not fail, as causes may differ).
class AgreedStop : public std::runtime_error {
 public:
  AgreedStop(const std::string& what, bool report) : std::runtime_error(what), report_(report) {}
  bool should_report() const { return report_; }

 private:
  bool report_;
};

// Collective. `local_error` is this rank's failure ("" for none); `stage` says what was being done.
// Returns if no rank failed; otherwise throws AgreedStop on every rank.
void agree_on_failure(const ProcessGroupPtr& group, const std::string& local_error, const std::string& stage);

// Runs fn() and agrees on its outcome (fn's exception message as this rank's error).
template <class Fn>
void on_every_rank(const ProcessGroupPtr& group, const std::string& stage, Fn&& fn) {
  std::string error;
  try {
    fn();
  } catch (const AgreedStop&) {
    throw;
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  agree_on_failure(group, error, stage);
}

}  // namespace fsdp::comm
