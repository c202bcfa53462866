// fsdp/comm/collective_log.h: the collectives this process issued in the current step, so that
// ranks whose collectives differ (a code path taken on some ranks only) are caught at once.
//
// MPI and NCCL pair the i-th collective of one rank with the i-th of every other. When ranks run
// different code, the pairing goes wrong silently (two gathers of the same size from different
// units) or waits until a timeout. Every backend records each collective as it is issued: what it
// is (operation, element count, group size, dtype) and the label of the code issuing it (FSDP
// units label theirs "unit 'blocks.1'"), on its group's channel (ProcessGroup::channel: "world",
// "world/split#2"). Each channel folds its records into a running fingerprint of its own, and the
// step's fingerprint combines the channels' in creation order: what MPI requires, the order within
// each communicator. NCCL requires more: communicators used together must see their collectives
// interleaved in one order on every rank, or it may deadlock. So the fingerprint also hashes the
// channels in issue order across them (`interleaving`), which device backends compare too
// (ProcessGroup::needs_one_issue_order; hybrid sharding issues each replica all-reduce right behind
// its reduce-scatter, whatever the timing). The trainer compares fingerprints in the all-gather it
// already does once per step, and on a mismatch check_collectives_agree finds the first collective
// that differs and stops every rank naming it on each side. A wait past the timeout names its
// collective's place in the step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

// Labels the collectives this thread issues while it lives ("unit 'blocks.1'"); nests.
class CollectiveLabel {
 public:
  explicit CollectiveLabel(std::string label);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  std::string previous_;
};

// While it lives, the collectives this thread issues carry another collective that was recorded
// (and agreed on) where it was issued: an agreement's own exchange (collective_agreement.h), the
// staged group's host collectives (staged_process_group.h). A backend neither records nor agrees
// on them, and names `place` (the carried collective's) where it would name theirs. Nests.
class CarriedCollectives {
 public:
  explicit CarriedCollectives(std::string place);
  ~CarriedCollectives();
  CarriedCollectives(const CarriedCollectives&) = delete;
  CarriedCollectives& operator=(const CarriedCollectives&) = delete;

 private:
  std::string previous_;
  bool was_carrying_;
};
// The carried collective's place on this thread, or nullptr when its collectives are its own.
const std::string* carried_collective_place();

// Called by a backend as it issues a collective on the group whose channel is `channel`; `what`
// names the operation, element count, group size and dtype ("all_gather(4096 x 2 Float)").
// Returns the record's place for messages: "unit 'blocks.1', collective 12 of step 7 on this
// rank" (counted over every channel). Thread-safe.
std::string record_collective(const std::string& channel, const std::string& what);

// What record_collective records for `what`: the current label and `what`
// ("unit 'blocks.1': all_gather(4096 x 2 Float)").
std::string describe_collective(const std::string& what);

// Starts a new step's record (the trainer calls it at every step's start; `step` as it prints it).
void begin_collective_step(int64_t step);
// True before the process's first begin_collective_step and during the step it began.
bool in_first_collective_step();

struct CollectiveFingerprint {
  int64_t count = 0;          // collectives recorded since begin_collective_step, every channel
  uint64_t hash = 0;          // FNV-1a over the channels in creation order: each one's name, count and the
                              // FNV-1a of its descriptions in issue order
  uint64_t interleaving = 0;  // FNV-1a over every collective's channel name, in issue order across channels
  // The same collectives on each channel (what MPI requires).
  bool same_collectives(const CollectiveFingerprint& o) const { return count == o.count && hash == o.hash; }
  bool operator==(const CollectiveFingerprint& o) const {
    return same_collectives(o) && interleaving == o.interleaving;
  }
};
CollectiveFingerprint collective_fingerprint();

// This step's collectives so far in issue order across channels: "CHANNEL: DESCRIPTION" (the first
// kept ones of a long step). For tests and messages.
std::vector<std::string> collectives_in_issue_order();

// Collective over `world`. `every_rank[r]` is rank r's fingerprint taken at the same point of the
// step on every rank (all-gathered by the caller). Returns when they all have the same collectives
// on each channel and, with `one_issue_order` (a device backend: NCCL, or the staged test backend
// that keeps its rules), the same interleaving of the channels; otherwise finds the first
// collective that differs, in the channels taken in creation order or, for the interleaving, in issue
// order (two all-gathers), and throws AgreedStop on every rank, naming that collective and its
// channel as each side issued it.
void check_collectives_agree(const ProcessGroupPtr& world, const std::vector<CollectiveFingerprint>& every_rank,
                             bool one_issue_order = false);

// Fingerprints travel in fp64 all-gathers: kFingerprintDoubles exact doubles (the count, then the
// high and low 32 bits of each hash).
constexpr int kFingerprintDoubles = 5;
void fingerprint_to_doubles(const CollectiveFingerprint& fingerprint, double out[kFingerprintDoubles]);
CollectiveFingerprint fingerprint_from_doubles(const double in[kFingerprintDoubles]);

}  // namespace fsdp::comm
