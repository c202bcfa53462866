// fsdp/comm/collective_agreement.h: ranks agree on each collective's description before anyone
// uses its result, so a divergence is named where the step's end would never come (issue 40).
//
// The step's fingerprint (collective_log.h) names ranks that issued different collectives once
// the step ends. On the GPU the step may never end: NCCL does not check counts across ranks, a
// mismatched collective hangs the device, and the host blocks in the next .item() until the
// watchdog aborts naming only its own operation. So while agreement is due, each collective's
// description ("unit 'blocks.1': all_gather(4096 x 2 Float)") is all-gathered over a host group
// (MPI, the same ranks) as the collective is issued, without waiting; the collective's wait()
// first waits for that exchange and compares. Every rank of the group compares the same texts, so
// every one stops alike: AgreedStop where the group is the world, else the job is aborted, naming
// each distinct description with its ranks.
//
// The exchange runs in the host group's issue order, and a wait() blocks the host only until
// every rank of the group has issued the same collective: the dependencies the MPI backend's own
// wait() has, so agreement cannot deadlock a program the MPI backend runs (hybrid sharding's
// replica reductions, issued at times that differ between ranks, included).
//
// When: FSDP_AGREE_COLLECTIVES = off | first_step | every_step; unset, a backend's default: NCCL
// first_step (the construction's collectives and the first step's: a code path that differs
// between ranks shows at once), MPI off (its step-end fingerprint names a divergence and its
// timeouts exchange positions). every_step is a debugging mode: one small host all-gather per
// collective.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

enum class CollectiveAgreementMode { kOff, kFirstStep, kEveryStep };
const char* to_string(CollectiveAgreementMode mode);

// The mode in force: set_collective_agreement's, else FSDP_AGREE_COLLECTIVES (throws naming a bad
// value), else `backend_default`.
CollectiveAgreementMode collective_agreement_mode(CollectiveAgreementMode backend_default);
// Overrides the environment for every group (tests); nullopt returns to it.
void set_collective_agreement(std::optional<CollectiveAgreementMode> mode);
// Whether a collective issued now is agreed on, under `mode` (first_step: before and during the
// process's first step, as begin_collective_step numbers it).
bool collective_agreement_due(CollectiveAgreementMode mode);

class PendingAgreement;
// Posts the exchange of `description` over `host` (the collective's group, or its bootstrap: the
// same ranks in the same order); `channel` names the collective's group, `place` its place in the
// step (record_collective). Returns at once.
std::shared_ptr<PendingAgreement> post_collective_agreement(ProcessGroup& host, const std::string& channel,
                                                            const std::string& description, const std::string& place);
// Waits for the exchange (once; later calls return) and compares; see the header comment.
void check_collective_agreement(PendingAgreement& pending);

}  // namespace fsdp::comm
