#include "fsdp/train/reporting.h"

#include "fsdp/shard/host_heap.h"
#include "fsdp/shard/storage.h"

#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <stdexcept>

namespace fsdp::train {

namespace {
// The memory trace resets VmHWM after each phase (to show each phase's own peak); the process's
// peak before the latest reset is kept here.
int64_t peak_before_reset_bytes = -1;

int64_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t length = std::char_traits<char>::length(field);
  while (std::getline(status, line)) {
    if (line.compare(0, length, field) == 0) return std::stoll(line.substr(length));
  }
  return -1;
}
}  // namespace

int64_t peak_resident_bytes() {
  const int64_t kib = status_kib("VmHWM:");
  return std::max(kib < 0 ? -1 : kib * 1024, peak_before_reset_bytes);
}

bool memory_trace_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("FSDP_MEMORY_TRACE");
    return value != nullptr && *value != '\0' && std::string(value) != "0";
  }();
  return enabled;
}

namespace {
// Samples the heap's bytes in use every millisecond while the trace is on: the phase's peak of live
// allocations (what a model of memory predicts), beside the resident peak (what the kernel charges).
class HeapSampler {
 public:
  HeapSampler() : thread_([this] { run(); }) {}
  ~HeapSampler() {
    stop_ = true;
    thread_.join();
  }
  size_t take_peak() { return peak_.exchange(in_use()); }

 private:
  static size_t in_use() {
    return static_cast<size_t>(shard::host_heap_bytes().in_use + shard::mapped_host_buffer_bytes());
  }
  void run() {
    while (!stop_) {
      const size_t now = in_use();
      size_t seen = peak_.load();
      while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::atomic<bool> stop_{false};
  std::atomic<size_t> peak_{0};
  std::thread thread_;
};
}  // namespace

void trace_memory(int rank, int64_t step, const char* phase) {
  if (!memory_trace_enabled()) return;
  static HeapSampler sampler;
  const shard::HostHeapBytes heap = shard::host_heap_bytes();
  const int64_t phase_peak_kib = status_kib("VmHWM:");
  const double buffers = static_cast<double>(shard::mapped_host_buffer_bytes());
  std::fprintf(stderr,
               "memory-trace rank %d step %lld until %-10s peak: resident %8.1f MiB, live %8.1f MiB; now: resident "
               "%8.1f MiB, live %8.1f MiB = heap in use %8.1f + fsdp buffers %8.1f MiB; %s heap mapped %8.1f MiB\n",
               rank, static_cast<long long>(step), phase, phase_peak_kib / 1024.0, sampler.take_peak() / 1048576.0,
               status_kib("VmRSS:") / 1024.0, (heap.in_use + buffers) / 1048576.0, heap.in_use / 1048576.0,
               buffers / 1048576.0, shard::host_heap_name(), heap.mapped / 1048576.0);
  // Reset VmHWM to the current resident size (Linux >= 4.0), so the next line shows the next phase's peak.
  peak_before_reset_bytes = std::max(peak_before_reset_bytes, phase_peak_kib * 1024);
  std::ofstream("/proc/self/clear_refs") << "5";
}

double measure_matmul_flops(double seconds, at::Device device, at::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  const int64_t n = device.is_cpu() ? 512 : 8192;
  // Its own generator: the global one drives dropout, and a resumed run restores it exactly.
  auto generator = at::detail::createCPUGenerator(1);
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  auto a = at::randn({n, n}, generator).to(options), b = at::randn({n, n}, generator).to(options);
  auto c = at::empty({n, n}, options);
  // Waits for the device's queued work (a no-op wait on the CPU): a host copy of one element.
  auto finish = [&] { (void)c[0][0].item<double>(); };
  at::mm_out(c, a, b);  // warm-up: thread pool, caches, kernel selection
  finish();
  int64_t products = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  while (elapsed < seconds || products < 3) {
    for (int i = 0; i < (device.is_cpu() ? 1 : 10); ++i, ++products) at::mm_out(c, a, b);
    finish();
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

std::string format_thousands(int64_t value) {
  const std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out = value < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
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
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
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
      terminal_(enabled &&
                (style == ProgressStyle::Bar || (style == ProgressStyle::Auto && ::isatty(STDOUT_FILENO) == 1))) {}

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

namespace {
// A run killed mid-write leaves half a line at the end; a resumed run appending after it would bury
// it mid-file. Cut the file back to its last complete line first.
void drop_partial_last_line(const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error || size == 0) return;
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.empty() || text.back() == '\n') return;
  const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  std::filesystem::resize_file(path, keep, error);
}
}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append) {
  if (append) drop_partial_last_line(path);
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot create metrics file '" + path + "'");
}

void MetricsLog::write(const std::string& json_line) {
  if (!out_.is_open()) return;
  out_ << json_line << '\n';
  out_.flush();
}

}  // namespace fsdp::train
