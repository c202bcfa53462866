#include "live_report.h"

#include <filesystem>
#include <system_error>

#include "fsdp/report/run_report.h"

namespace fsdp::train {

LiveReport::~LiveReport() {
  if (thread_.joinable()) thread_.join();
}

void LiveReport::say_failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) progress_.message("report.html not written: " + error_);
  error_.clear();
}

void LiveReport::write(bool in_background) {
  say_failure();
  if (in_background && busy_.load()) return;
  if (thread_.joinable()) thread_.join();
  auto write = [this] {
    try {
      report::write_report({output_dir_}, (std::filesystem::path(output_dir_) / "report.html").string());
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = e.what();
    }
    busy_.store(false);
  };
  busy_.store(true);
  if (in_background) {
    try {
      thread_ = std::thread(write);
      return;
    } catch (const std::system_error&) {
      // No thread to be had: written in the step, as before.
    }
  }
  write();
  say_failure();
}

}  // namespace fsdp::train
