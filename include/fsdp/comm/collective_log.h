// fsdp/comm/collective_log.h: the collectives this process issued in the current step, so that
// ranks whose collectives differ (a code path taken on some ranks only) are caught at once.
//
// MPI and NCCL pair the i-th collective of one rank with the i-th of every other. When ranks run
// different code, the pairing goes wrong silently (two gathers of the same size from different
// units) or waits until a timeout. Every backend records each collective as it is issued: what it
// is (operation, element count, group size, dtype) and the label of the code issuing it (FSDP
// units label theirs "unit 'blocks.1'"), on its group's channel (ProcessGroup::channel: "world",
// "world/split#2"). Each channel folds its records into a running fingerprint of its own: only the
// order within one communicator must agree across ranks. The order in which communicators
// interleave may differ (hybrid sharding issues a unit's replica all-reduce when its reduce-scatter
// completes, which depends on timing), so the step's fingerprint combines the channels' in channel
// order. The trainer compares fingerprints in the all-gather it already does once per step, and on
// a mismatch check_collectives_agree finds the first collective that differs and stops every rank
// naming it on each side. A wait past the timeout names its collective's place in the step.
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
  int64_t count = 0;  // collectives recorded since begin_collective_step, every channel
  uint64_t hash = 0;  // FNV-1a over the channels in name order: each one's name, count and the
                      // FNV-1a of its descriptions in issue order
  bool operator==(const CollectiveFingerprint& o) const { return count == o.count && hash == o.hash; }
};
CollectiveFingerprint collective_fingerprint();

// Collective over `world`. `every_rank[r]` is rank r's fingerprint taken at the same point of the
// step on every rank (all-gathered by the caller). Returns when they are all equal; otherwise finds
// the first collective that differs, in the channels taken in name order (two all-gathers), and
// throws AgreedStop on every rank, naming that collective and its channel as each side issued it.
void check_collectives_agree(const ProcessGroupPtr& world, const std::vector<CollectiveFingerprint>& every_rank);

// Fingerprints travel in fp64 all-gathers: three exact doubles (count, high and low 32 bits).
void fingerprint_to_doubles(const CollectiveFingerprint& fingerprint, double out[3]);
CollectiveFingerprint fingerprint_from_doubles(const double in[3]);

}  // namespace fsdp::comm
