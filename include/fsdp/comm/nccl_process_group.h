// fsdp/comm/nccl_process_group.h: the NCCL backend of ProcessGroup, for CUDA tensors.
//
// Built only with -DFSDP_CUDA=ON (against a CUDA libtorch 2.x); nccl_backend_built() says whether
// this binary has it. One GPU per rank: the launcher's local rank picks it (local_device_index).
//
// Bootstrap: the communicator's unique id is made by rank 0 and broadcast through an existing
// group of the same ranks (the MPI world, or its split), so the same mpirun/srun launch works; a
// process without a launcher is world size 1 and needs no exchange. A split group's communicator
// is split from its parent's (ncclCommSplit, NCCL >= 2.18), which every rank of the parent joins:
// no second id exchange.
//
// Numerics: bf16 is reduced by NCCL itself (rounding as it goes around the ring), and Average is
// NCCL's ncclAvg; the MPI backend instead sums bf16 in fp32 and rounds once. The difference is a
// few bf16 ulps in a reduced gradient.
//
// Host tensors: a collective whose tensors are all on the CPU (losses, flags, checkpoint facts)
// runs on the bootstrap group instead, so callers need not keep a second group for control.
//
// Streams: every collective is enqueued on the group's own CUDA stream after an event recorded on
// the caller's current stream (so it reads what the caller wrote); Work::wait() makes the caller's
// current stream wait on the collective's completion event. Nothing on this path synchronises the
// host. Tensors passed to a collective are referenced by the group until its event has fired, and
// their memory is recorded on the group's stream (recordStream): a storage the caller frees early
// (shard/storage.h swaps a buffer's storage out at once) is not reused by other work until the
// collective has run, whatever streams the caller uses. A watchdog thread polls the events: it
// records each collective's device time and, past the group's timeout or on an NCCL asynchronous
// error, names the operation and aborts every rank through the bootstrap group.
//
// Start: the ranks first exchange which device each took (comm/device_assignment.h) and refuse two
// on one device, naming them; ncclCommInitRank and ncclCommSplit are bounded by the group's timeout.
#pragma once

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

// True when this binary was built with the NCCL backend (FSDP_CUDA=ON).
bool nccl_backend_built();

// The CUDA device of this rank: the launcher's local rank modulo the visible devices
// (comm/device_assignment.h). Throws if the build has no CUDA or no device is visible.
int local_device_index();

// A NCCL group over the ranks of `bootstrap` (collective over them), on CUDA device
// `device_index` (which becomes the current device of the calling thread). Throws
// std::runtime_error naming the NCCL or CUDA failure, or when the build has no NCCL backend.
ProcessGroupPtr make_nccl_group(const ProcessGroupPtr& bootstrap, int device_index,
                                const ProcessGroupOptions& options = {});

}  // namespace fsdp::comm
