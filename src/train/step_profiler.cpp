#include "step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "fsdp/shard/storage.h"
#include "fsdp/train/trainer.h"

namespace fsdp::train {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::pair<int64_t, int64_t> parse_profile_steps(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("--profile-steps '" + text +
                                 "': expected A:B, the first and last step to profile (1 <= A <= B), or one step A");
  };
  const size_t colon = text.find(':');
  const std::string first_text = text.substr(0, colon),
                    last_text = colon == std::string::npos ? first_text : text.substr(colon + 1);
  const auto number = [&](const std::string& digits) {
    if (digits.empty() || digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos)
      throw bad();
    return std::stoll(digits);
  };
  const int64_t first = number(first_text), last = number(last_text);
  if (first < 1 || last < first) throw bad();
  return {first, last};
}

namespace {

std::set<ActivityType> activities_for(const at::Device& device) {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  return activities;
}

ProfilerConfig trace_config() {
  // Input shapes: the trace says which matmul is which. No stacks, no memory events: they make the
  // trace several times larger and slow the profiled steps.
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/true);
}

}  // namespace

StepProfiler::StepProfiler(int64_t first, int64_t last, std::string trace_path, at::Device device)
    : first_(first), last_(last), trace_path_(std::move(trace_path)), device_(device) {
  if (first_ == 0) return;
  // Kineto looks for a GPU even when asked for CPU events only, and logs an error line when it
  // finds none; on the CPU that line is noise (a KINETO_LOG_LEVEL the user set is kept).
  if (!device_.is_cuda()) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  // Kineto sets up its GPU tracer ahead of the first profiled step, so that step is not slowed by it.
  profiler::prepareProfiler(trace_config(), activities_for(device_));
}

StepProfiler::~StepProfiler() {
  step_scope_.reset();
  if (active_) profiler::disableProfiler();
}

void StepProfiler::begin_step(int64_t step) {
  if (first_ > 0 && step == first_ && !active_) {
    profiler::enableProfiler(trace_config(), activities_for(device_));
    active_ = true;
  }
  if (!active_) return;
  step_scope_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_scope_->isActive()) step_scope_->before("ProfilerStep#" + std::to_string(step));
}

std::string StepProfiler::end_step(int64_t step) {
  step_scope_.reset();  // ends the step's mark
  if (!active_ || step != last_) return "";
  shard::synchronize_current_stream(device_);  // the last step's kernels belong to the trace
  std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  active_ = false;
  const std::filesystem::path path(trace_path_);
  std::filesystem::create_directories(path.parent_path());
  // Written beside and renamed into place: a reader never sees half a trace.
  const std::string partial = trace_path_ + ".partial";
  result->save(partial);
  if (!std::filesystem::exists(partial)) {
    throw std::runtime_error("--profile-steps: the profiler wrote no trace to '" + partial + "'");
  }
  std::filesystem::rename(partial, path);
  return trace_path_;
}

}  // namespace fsdp::train
