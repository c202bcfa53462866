#include "fsdp/comm/collective_log.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "fsdp/comm/agreement.h"
#include "fsdp/number_order.h"

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

// Channel names in the order their groups were made: "world/split#9" before "world/split#10", so a
// step's first differing collective is looked for in the same group whatever number of groups
// earlier code split off.
using CreationOrder = NumberOrder;

// One communicator's records in this step, in issue order.
struct ChannelLog {
  int64_t count = 0;
  uint64_t hash = kFnvOffset;        // FNV-1a over the records' own hashes
  std::vector<uint64_t> hashes;      // [kept] each record's own hash
  std::vector<std::string> records;  // [kept] "unit 'blocks.1': all_gather(4096 x 2 Float)"
};

struct StepLog {
  std::mutex mutex;
  int64_t step = 0;         // 0: before the first step (construction, loading)
  int64_t first_step = -1;  // the first step begun (a resumed run's is not 1); -1: none yet
  int64_t count = 0;        // every channel's records (a record's place in messages)
  size_t kept = 0;          // records kept in full, every channel
  std::map<std::string, ChannelLog, CreationOrder> channels;  // the order fingerprints combine in
  uint64_t interleaving = kFnvOffset;                         // FNV-1a over each record's channel name, in issue order
  // [kept] every channel's records in issue order: the channel's name and the record's index there.
  std::vector<std::pair<std::string, size_t>> issue_order;
  // Each channel's count, and the records in issue order, when collective_fingerprint was last
  // called: what the ranks compared (the comparison's own collectives come after).
  std::map<std::string, int64_t, CreationOrder> fingerprinted;
  size_t fingerprinted_in_order = 0;
};

StepLog& step_log() {
  static StepLog log;
  return log;
}

thread_local std::string current_label;

std::string describe(const std::string& what) { return current_label.empty() ? what : current_label + ": " + what; }

// The channels' fingerprints in creation order, so that how they interleaved does not matter.
CollectiveFingerprint combine(const std::map<std::string, ChannelLog, CreationOrder>& channels) {
  CollectiveFingerprint combined{0, kFnvOffset};
  for (const auto& [name, channel] : channels) {
    combined.count += channel.count;
    combined.hash = fnv1a(combined.hash, name.data(), name.size() + 1);  // with its terminating NUL
    combined.hash = fnv1a(combined.hash, &channel.count, sizeof(channel.count));
    combined.hash = fnv1a(combined.hash, &channel.hash, sizeof(channel.hash));
  }
  return combined;
}

}  // namespace

namespace {
thread_local bool carrying = false;
thread_local std::string carried_place;
}  // namespace

CarriedCollectives::CarriedCollectives(std::string place)
    : previous_(std::move(carried_place)), was_carrying_(carrying) {
  carried_place = std::move(place);
  carrying = true;
}
CarriedCollectives::~CarriedCollectives() {
  carried_place = std::move(previous_);
  carrying = was_carrying_;
}
const std::string* carried_collective_place() { return carrying ? &carried_place : nullptr; }

CollectiveLabel::CollectiveLabel(std::string label) : previous_(std::move(current_label)) {
  current_label = std::move(label);
}
CollectiveLabel::~CollectiveLabel() { current_label = std::move(previous_); }

std::string record_collective(const std::string& channel, const std::string& what) {
  const std::string text = describe(what);
  const uint64_t own = fnv1a(kFnvOffset, text.data(), text.size());
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  ChannelLog& chain = log.channels[channel];
  chain.hash = fnv1a(chain.hash, &own, sizeof(own));
  ++chain.count;
  log.interleaving = fnv1a(log.interleaving, channel.data(), channel.size() + 1);  // with its NUL
  const int64_t index = ++log.count;
  if (log.kept < kKeptRecords) {
    log.issue_order.emplace_back(channel, chain.records.size());
    chain.hashes.push_back(own);
    chain.records.push_back(text);
    ++log.kept;
  }
  return (current_label.empty() ? std::string() : current_label + ", ") + "collective " + std::to_string(index) +
         (log.step > 0 ? " of step " + std::to_string(log.step) : " before the first step") + " on this rank";
}

std::string describe_collective(const std::string& what) { return describe(what); }

bool in_first_collective_step() {
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  return log.first_step < 0 || log.step == log.first_step;
}

void begin_collective_step(int64_t step) {
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  if (log.first_step < 0) log.first_step = step;
  log.step = step;
  log.count = 0;
  log.kept = 0;
  log.channels.clear();
  log.interleaving = kFnvOffset;
  log.issue_order.clear();
  log.fingerprinted.clear();
  log.fingerprinted_in_order = 0;
}

CollectiveFingerprint collective_fingerprint() {
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.fingerprinted.clear();
  for (const auto& [name, channel] : log.channels) log.fingerprinted[name] = channel.count;
  log.fingerprinted_in_order = log.issue_order.size();
  CollectiveFingerprint fingerprint = combine(log.channels);
  fingerprint.interleaving = log.interleaving;
  return fingerprint;
}

std::vector<std::string> collectives_in_issue_order() {
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  std::vector<std::string> order;
  for (const auto& [name, index] : log.issue_order) order.push_back(name + ": " + log.channels.at(name).records[index]);
  return order;
}

namespace {
void hash_to_doubles(uint64_t hash, double* out) {
  out[0] = static_cast<double>(hash >> 32);
  out[1] = static_cast<double>(hash & 0xffffffffull);
}
uint64_t hash_from_doubles(const double* in) {
  return (static_cast<uint64_t>(in[0]) << 32) | static_cast<uint64_t>(in[1]);
}
}  // namespace

void fingerprint_to_doubles(const CollectiveFingerprint& fingerprint, double out[kFingerprintDoubles]) {
  out[0] = static_cast<double>(fingerprint.count);
  hash_to_doubles(fingerprint.hash, out + 1);
  hash_to_doubles(fingerprint.interleaving, out + 3);
}

CollectiveFingerprint fingerprint_from_doubles(const double in[kFingerprintDoubles]) {
  return CollectiveFingerprint{static_cast<int64_t>(in[0]), hash_from_doubles(in + 1), hash_from_doubles(in + 3)};
}

namespace {

// This rank's records up to the fingerprint it contributed (the caller's gather came after): the
// channels one after another in creation order, or every channel's records in issue order. Each
// record's hash covers its channel too.
struct RankRecords {
  std::vector<uint64_t> hashes;
  std::vector<std::string> records;  // "unit 'blocks.1': all_gather(4096 x 2 Float) [group world/split#1, ...]"
  int64_t step = 0;
};

RankRecords rank_records(bool in_issue_order) {
  RankRecords mine;
  StepLog& log = step_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  mine.step = log.step;
  auto add = [&](const std::string& name, size_t i) {
    const ChannelLog& channel = log.channels.at(name);
    const uint64_t channel_hash = fnv1a(kFnvOffset, name.data(), name.size());
    mine.hashes.push_back(fnv1a(channel_hash, &channel.hashes[i], sizeof(uint64_t)));
    mine.records.push_back(channel.records[i] + " [group " + name + ", collective " + std::to_string(i + 1) +
                           " there]");
  };
  if (in_issue_order) {
    for (size_t k = 0; k < log.fingerprinted_in_order; ++k) add(log.issue_order[k].first, log.issue_order[k].second);
  } else {
    for (const auto& [name, count] : log.fingerprinted) {
      const size_t kept = std::min(log.channels.at(name).hashes.size(), static_cast<size_t>(count));
      for (size_t i = 0; i < kept; ++i) add(name, i);
    }
  }
  return mine;
}

}  // namespace

void check_collectives_agree(const ProcessGroupPtr& world, const std::vector<CollectiveFingerprint>& every_rank,
                             bool one_issue_order) {
  const int n = world->size(), rank = world->rank();
  const CollectiveFingerprint& first_rank = every_rank.front();
  const bool same_collectives =
      std::all_of(every_rank.begin(), every_rank.end(), [&](const auto& f) { return f.same_collectives(first_rank); });
  const bool same_order = std::all_of(every_rank.begin(), every_rank.end(),
                                      [&](const auto& f) { return f.interleaving == first_rank.interleaving; });
  if (same_collectives && (same_order || !one_issue_order)) return;
  // Which difference to name: the collectives themselves, or (they agree) their order across channels.
  const bool by_issue_order = same_collectives;

  const RankRecords mine = rank_records(by_issue_order);
  const std::vector<uint64_t>& hashes = mine.hashes;
  const std::vector<std::string>& records = mine.records;
  const int64_t step = mine.step;
  // Every rank's record count, then the records' hashes (bit patterns, 0 past a rank's count).
  at::Tensor lengths = at::empty({n}, at::kLong);
  world->all_gather(lengths, at::tensor({static_cast<int64_t>(hashes.size())}, at::kLong))->wait();
  const auto* length_of = lengths.data_ptr<int64_t>();
  const int64_t longest = *std::max_element(length_of, length_of + n);
  at::Tensor local = at::zeros({std::max<int64_t>(longest, 1)}, at::kLong);
  std::memcpy(local.data_ptr<int64_t>(), hashes.data(), hashes.size() * sizeof(uint64_t));
  at::Tensor all = at::empty({n * local.numel()}, at::kLong);
  world->all_gather(all, local)->wait();
  const auto* table = all.data_ptr<int64_t>();
  const int64_t width = local.numel();
  int64_t first = -1;  // the first index where some rank differs from rank 0 (or has no record)
  for (int64_t i = 0; i < longest && first < 0; ++i) {
    for (int r = 0; r < n; ++r) {
      const bool present = i < length_of[r], present0 = i < length_of[0];
      if (present != present0 || (present && table[r * width + i] != table[i])) {
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
    text = "nothing: its step had " + std::to_string(records.size()) + " collective" +
           (records.size() == 1 ? "" : "s") + " in all";
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
  std::string message =
      std::string(by_issue_order ? "ranks issued their groups' collectives in different orders"
                                 : "ranks issued different collectives") +
      " in step " + std::to_string(step) + (first < 0 ? " past the first " + std::to_string(kKeptRecords) : "") +
      (by_issue_order && first >= 0 ? ": collective " + std::to_string(first + 1) + " of the step was, " : ": ") +
      "on rank 0: " + description_of(0);
  int listed = 0;
  for (int r = 1; r < n && listed < 4; ++r) {
    const std::string other = description_of(r);
    if (other == description_of(0)) continue;
    message += "; on rank " + std::to_string(r) + ": " + other;
    ++listed;
  }
  message += by_issue_order
                 ? ". A device backend (NCCL) needs the collectives of groups used together issued in one "
                   "order on every rank, or it may deadlock: issue them at points every rank reaches alike, "
                   "not when a collective is seen complete"
                 : ". Every rank must run the same collectives in the same order on each group (a model or loop "
                   "whose control flow depends on the rank, or on data that differs between ranks, breaks this)";
  throw AgreedStop(message, rank == 0);
}

}  // namespace fsdp::comm
