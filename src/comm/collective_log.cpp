#include "fsdp/comm/collective_log.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "fsdp/comm/agreement.h"

namespace fsdp::comm {

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;
// Records kept in full per step (a step of a 100-unit model with 8 micro-batches issues ~2,500);
// past this the fingerprint still counts and hashes every collective.
constexpr size_t kKeptRecords = 1 << 16;
// A description travels in a fixed all-gather slot of this many bytes.
constexpr int64_t kDescriptionBytes = 256;

uint64_t fnv1a(uint64_t hash, const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * kFnvPrime;
  return hash;
}

struct StepLog {
  std::mutex mutex;
  int64_t step = 0;  // 0: before the first step (construction, loading)
  CollectiveFingerprint fingerprint{0, kFnvOffset};
  std::vector<uint64_t> hashes;        // [kept] each record's own hash
  std::vector<std::string> records;    // [kept] "unit 'blocks.1': all_gather(4096 x 2 Float)"
};

StepLog& step_log() {
  static StepLog log;
  return log;
}

thread_local std::string current_label;

std::string describe(const std::string& what) { return current_label.empty() ? what : current_label + ": " + what; }

}  // namespace

CollectiveLabel::CollectiveLabel(std::string label) : previous_(std::move(current_label)) { current_label = std::move(label); }
CollectiveLabel::~CollectiveLabel() { current_label = std::move(previous_); }

std::string record_collective(const std::string& what) {
  const std::string text = describe(what);
  const uint64_t own = fnv1a(kFnvOffset, text.data(), text.size());
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.fingerprint.hash = fnv1a(log.fingerprint.hash, &own, sizeof(own));
  const int64_t index = ++log.fingerprint.count;
  if (log.records.size() < kKeptRecords) {
    log.hashes.push_back(own);
    log.records.push_back(text);
  }
  return (current_label.empty() ? std::string() : current_label + ", ") + "collective " + std::to_string(index) +
         (log.step > 0 ? " of step " + std::to_string(log.step) : " before the first step") + " on this rank";
}

void begin_collective_step(int64_t step) {
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.step = step;
  log.fingerprint = CollectiveFingerprint{0, kFnvOffset};
  log.hashes.clear();
  log.records.clear();
}

CollectiveFingerprint collective_fingerprint() {
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  return log.fingerprint;
}

void fingerprint_to_doubles(const CollectiveFingerprint& fingerprint, double out[3]) {
  out[0] = static_cast<double>(fingerprint.count);
  out[1] = static_cast<double>(fingerprint.hash >> 32);
  out[2] = static_cast<double>(fingerprint.hash & 0xffffffffull);
}

CollectiveFingerprint fingerprint_from_doubles(const double in[3]) {
  return CollectiveFingerprint{static_cast<int64_t>(in[0]),
                               (static_cast<uint64_t>(in[1]) << 32) | static_cast<uint64_t>(in[2])};
}

void check_collectives_agree(const ProcessGroupPtr& world, const std::vector<CollectiveFingerprint>& every_rank) {
  const int n = world->size(), rank = world->rank();
  if (std::all_of(every_rank.begin(), every_rank.end(), [&](const auto& f) { return f == every_rank.front(); })) return;

  // This rank's records up to the fingerprint it contributed (the caller's gather came after).
  const int64_t mine = every_rank[static_cast<size_t>(rank)].count;
  std::vector<uint64_t> hashes;
  std::vector<std::string> records;
  int64_t step = 0;
  {
    StepLog& log = step_log();
    std::lock_guard<std::mutex> lock(log.mutex);
    const size_t kept = std::min(log.hashes.size(), static_cast<size_t>(mine));
    hashes.assign(log.hashes.begin(), log.hashes.begin() + static_cast<std::ptrdiff_t>(kept));
    records.assign(log.records.begin(), log.records.begin() + static_cast<std::ptrdiff_t>(kept));
    step = log.step;
  }
  int64_t longest = 0;
  for (const auto& f : every_rank) longest = std::max(longest, std::min<int64_t>(f.count, kKeptRecords));
  // [n, longest] int64: every rank's record hashes (bit patterns), 0 past its own count.
  at::Tensor local = at::zeros({std::max<int64_t>(longest, 1)}, at::kLong);
  std::memcpy(local.data_ptr<int64_t>(), hashes.data(), hashes.size() * sizeof(uint64_t));
  at::Tensor all = at::empty({n * local.numel()}, at::kLong);
  world->all_gather(all, local)->wait();
  const auto* table = all.data_ptr<int64_t>();
  const int64_t width = local.numel();
  int64_t first = -1;  // the first index where some rank differs from rank 0 (or has no record)
  for (int64_t i = 0; i < longest && first < 0; ++i) {
    for (int r = 0; r < n; ++r) {
      const bool present = i < every_rank[static_cast<size_t>(r)].count, present0 = i < every_rank[0].count;
      if (present != present0 || table[r * width + i] != table[i]) {
        first = i;
        break;
      }
    }
  }

  // Every rank's description of that collective, in a fixed slot of kDescriptionBytes.
  std::string text;
  if (first < 0) {
    text = "(its first " + std::to_string(kKeptRecords) + " collectives agree; a later one differs)";
  } else if (first < static_cast<int64_t>(records.size())) {
    text = records[static_cast<size_t>(first)];
  } else {
    text = "nothing: its step had " + std::to_string(mine) + " collective" + (mine == 1 ? "" : "s");
  }
  at::Tensor slot = at::zeros({kDescriptionBytes / 8}, at::kLong);
  std::memcpy(slot.data_ptr(), text.data(), std::min<size_t>(text.size(), kDescriptionBytes - 1));
  at::Tensor slots = at::empty({n * slot.numel()}, at::kLong);
  world->all_gather(slots, slot)->wait();
  const char* chars = static_cast<const char*>(slots.data_ptr());
  auto description_of = [&](int r) {
    const char* start = chars + r * kDescriptionBytes;
    return std::string(start, strnlen(start, kDescriptionBytes));
  };
  const std::string which = first < 0 ? "past " + std::to_string(kKeptRecords) : std::to_string(first + 1);
  std::string message = "ranks issued different collectives in step " + std::to_string(step) + ": collective " + which +
                        " was, on rank 0: " + description_of(0);
  int listed = 0;
  for (int r = 1; r < n && listed < 4; ++r) {
    const std::string other = description_of(r);
    if (other == description_of(0)) continue;
    message += "; on rank " + std::to_string(r) + ": " + other;
    ++listed;
  }
  message += ". Every rank must run the same collectives in the same order (a model or loop whose control flow "
             "depends on the rank, or on data that differs between ranks, breaks this)";
  throw AgreedStop(message, rank == 0);
}

}  // namespace fsdp::comm
