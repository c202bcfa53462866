#include "fsdp/train/reporting.h"

#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <stdexcept>

namespace fsdp::train {

int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

double measure_matmul_flops(double seconds) {
  torch::NoGradGuard no_grad;
  const int64_t n = 512;
  // Its own generator: the global one drives dropout, and a resumed run restores it exactly.
  auto generator = at::detail::createCPUGenerator(1);
  auto a = at::randn({n, n}, generator), b = at::randn({n, n}, generator), c = at::empty({n, n});
  at::mm_out(c, a, b);  // warm-up: thread pool and caches
  int64_t products = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  while (elapsed < seconds || products < 3) {
    at::mm_out(c, a, b);
    ++products;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return 2.0 * n * n * n * products / elapsed;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (std::fabs(bytes) >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

std::string format_count(double value) {
  char text[32];
  if (value >= 1e9) {
    std::snprintf(text, sizeof(text), "%.2fG", value / 1e9);
  } else if (value >= 1e6) {
    std::snprintf(text, sizeof(text), "%.2fM", value / 1e6);
  } else if (value >= 1e3) {
    std::snprintf(text, sizeof(text), "%.1fk", value / 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.0f", value);
  }
  return text;
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  } else if (s >= 60) {
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  }
  return text;
}

Progress::Progress(int64_t total_steps, int64_t every, bool enabled, ProgressStyle style)
    : total_(total_steps),
      every_(every),
      enabled_(enabled),
      terminal_(enabled && (style == ProgressStyle::Bar || (style == ProgressStyle::Auto && ::isatty(STDOUT_FILENO) == 1))) {}

Progress::~Progress() {
  if (line_open_) std::printf("\n");
  std::fflush(stdout);
}

void Progress::step(int64_t step, const std::string& metrics, double seconds_so_far) {
  if (!enabled_) return;
  const int64_t done = step + 1;
  const double eta = seconds_so_far / static_cast<double>(done) * static_cast<double>(total_ - done);
  if (terminal_) {
    constexpr int kWidth = 20;
    const int filled = static_cast<int>(kWidth * done / total_);
    std::string bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "]";
    std::printf("\r\033[K%s %lld/%lld %s | ETA %s", bar.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), metrics.c_str(), format_duration(eta).c_str());
    line_open_ = true;
  } else if (done % every_ == 0 || done == total_ || step == 0) {
    std::printf("step %lld/%lld %s | ETA %s\n", static_cast<long long>(done), static_cast<long long>(total_),
                metrics.c_str(), format_duration(eta).c_str());
  }
  std::fflush(stdout);
}

void Progress::message(const std::string& line) {
  if (!enabled_) return;
  if (line_open_) {
    std::printf("\n");
    line_open_ = false;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

MetricsLog::MetricsLog(const std::string& path, bool append) : out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw std::runtime_error("cannot create metrics file '" + path + "'");
}

void MetricsLog::write(const std::string& json_line) {
  if (!out_.is_open()) return;
  out_ << json_line << '\n';
  out_.flush();
}

}  // namespace fsdp::train
