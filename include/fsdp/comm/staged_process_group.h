// fsdp/comm/staged_process_group.h: a test backend with NCCL's contract that runs where NCCL cannot,
// several ranks on one GPU (issue 40), or on the CPU in CI.
//
// NCCL refuses two ranks on one device (device_assignment.h), so the GPU path at N >= 2 could run
// only on as many GPUs. This group moves a device tensor's collective as three steps: a copy to a
// host staging buffer, the collective over MPI on the staging buffers, and a copy back. It keeps
// the contract the runtime relies on from NCCL:
//   - a collective reads its input as the caller's stream left it at issue (on CUDA: the group's
//     own copy stream waits for an event recorded on the caller's current stream);
//   - its output is written only later, when the collective is waited for or seen completed; on
//     CUDA the copy back runs on the group's stream and wait() makes the caller's current stream
//     wait for it (cudaStreamWaitEvent), with the output's memory recorded on the group's stream;
//   - the tensors' storages are marked in flight until then (in_flight_storage.h), so a buffer
//     handed back early is refused, as on the NCCL and MPI backends;
//   - each collective is recorded on the group's channel ("world/staged") and, while agreement is
//     due (first_step by default, as for NCCL), agreed on over the bootstrap group before use
//     (collective_agreement.h); the host collectives that carry it are not recorded again.
//   - host tensors (losses, flags) go to the bootstrap group, as NCCL's do, where the device is CUDA.
// Where it departs: issue blocks the host until the input's copy is done (the caller's queued
// work first), so prefetching overlaps less than with NCCL; and reductions follow the MPI
// backend's numerics (bf16 summed in fp32). It is for tests, not for speed.
//
// On the CPU (device kCPU), CPU tensors stand in for device memory and the copies are host
// copies: the same staging, ordering and marking logic runs in CI.
//
// Chosen by FSDP_DEVICE_COMM=staged (device_group.h).
#pragma once

#include <c10/core/Device.h>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

// A staged group over the ranks of `bootstrap` (collective over them: it splits off an MPI
// communicator of its own for the staging buffers' collectives) for tensors on `device` (kCPU, or
// a CUDA device in an FSDP_CUDA build; else std::runtime_error).
ProcessGroupPtr make_staged_group(const ProcessGroupPtr& bootstrap, at::Device device,
                                  const ProcessGroupOptions& options = {});

}  // namespace fsdp::comm
