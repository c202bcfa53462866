// fsdp/comm/process_group.h: the collectives FSDP needs, behind one interface.
//
// A ProcessGroup is a set of ranks that run collectives together. Every collective is
// asynchronous: it returns a Work at once, and the operation progresses on the group's
// communication thread while the caller computes. Work::wait() blocks until it is done.
//
// Contract, as in MPI and NCCL: every rank of the group calls the same collectives in the same
// order with matching shapes and dtypes. Local mistakes (wrong sizes, dtypes, non-contiguous
// tensors) throw std::invalid_argument before anything is sent. A collective that some rank never
// joins does not hang forever: a wait() that exceeds the group's timeout prints which operation
// and which rank waited, then aborts every rank of the job.
//
// Backends: MPI for CPU tensors (mpi_process_group.cpp); NCCL for CUDA tensors
// (nccl_process_group.h, built with FSDP_CUDA), where "asynchronous" means stream-ordered: a
// collective runs on the group's own CUDA stream after the caller's current stream's queued work,
// and wait() makes the caller's current stream wait for it without blocking the host.
//
// Dtypes: float32, float64, int64, bfloat16, float16, and uint8 for packed bytes (an NF4 base),
// which are gathered and broadcast, never reduced. Reductions of bfloat16 accumulate in float32
// and round once, so a bf16 sum loses no more than the rounding of its result.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>

namespace fsdp::comm {

enum class ReduceOp { Sum, Average, Max };
const char* to_string(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective completed; rethrows its failure. Past the group's timeout it
  // reports the operation and aborts the job (no rank waits forever for a rank that failed).
  virtual void wait() = 0;
  // wait(), with the time it exposes counted where this thread's clock cannot see it: a backend
  // whose wait() only queues a wait on the caller's device stream (NCCL) times how long that
  // stream then stands still (ProcessGroup::stream_wait_seconds) and returns true. The others
  // return false: their wait() blocks this thread, and the caller times it (FsdpState::wait).
  virtual bool wait_timing_stream() {
    wait();
    return false;
  }
  virtual bool is_completed() = 0;
  // Seconds between the operation starting on the communication thread and its completion
  // (valid once completed): the time communication really took, overlapped or not.
  virtual double busy_seconds() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// A Work done already: what an operation that needed no collective returns (a meta tensor's, or a
// rank alone in its group whose "collective" was a local copy).
WorkPtr completed_work();

// How the MPI backend's communication thread waits for a collective in flight.
//   kSpin:    MPI's blocking calls, which poll the progress engine without pause: the lowest
//             latency, but the thread holds a core for as long as the collective lasts, taking it
//             from compute when every core is busy (another process, more threads than cores).
//   kBackoff: nonblocking calls, tested in a loop that spins briefly and then sleeps between
//             tests (20 us doubling to 200 us), so a waiting thread leaves the core to others.
enum class CommWait { kSpin, kBackoff };
const char* to_string(CommWait wait);

struct ProcessGroupOptions {
  // How long wait() waits before declaring the collective lost and aborting the job.
  // Overridable with FSDP_COMM_TIMEOUT_MS in the environment.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Overridable with FSDP_COMM_WAIT=spin|backoff in the environment. The default is chosen by
  // measurement (bench/under_load.sh, docs/benchmarks.md).
  CommWait wait = CommWait::kBackoff;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "world", or "world/split(color=1)"
  // The group's role, named alike on every rank: "world", "world/split#2" (the second split of
  // world, whatever this rank's color). Each channel's collectives must pair in order across
  // ranks; how channels interleave is free (collective_log.h).
  virtual std::string channel() const = 0;
  // Where this group's tensors live: kCPU for MPI, kCUDA for NCCL (one device per rank).
  virtual at::DeviceType device_type() const { return at::kCPU; }
  // Whether this group's collectives must interleave with other groups' in one order on every
  // rank (NCCL, and the staged backend that keeps NCCL's rules); MPI only orders each group's own.
  virtual bool needs_one_issue_order() const { return false; }

  // output [size()*k] <- input [k]: rank r's input lands at output[r*k, (r+1)*k). No staging copy.
  virtual WorkPtr all_gather(const at::Tensor& output, const at::Tensor& input) = 0;
  // output [k] <- elements [rank()*k, (rank()+1)*k) of the reduction of every rank's input [size()*k].
  virtual WorkPtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) = 0;
  // In place: tensor <- reduction of every rank's tensor.
  virtual WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  // all_reduce, started only once `first` (a collective of another group, the one writing
  // `tensor`) has completed, while neither the caller's host nor its stream waits for `first`: two
  // collectives over two groups issued back to back, so every rank issues them in one order
  // whatever the timing (NCCL requires communicators used together to see their collectives in
  // the same order on every rank). Hybrid sharding's replica all-reduce of a reduce-scatter's
  // output, as FSDP2 issues it. MPI: the group's thread waits for `first`; NCCL: the group's
  // stream. This default, for backends that have neither (the staged and meta groups), calls
  // `first->wait()` (for MPI and staged works the host waits; for a NCCL work only the caller's
  // stream) and then issues.
  virtual WorkPtr all_reduce_after(const WorkPtr& first, const at::Tensor& tensor, ReduceOp op) {
    if (first) first->wait();
    return all_reduce(tensor, op);
  }
  // In place: tensor <- root's tensor.
  virtual WorkPtr broadcast(const at::Tensor& tensor, int root) = 0;
  virtual WorkPtr barrier() = 0;

  // Collective over this group: ranks passing the same color form a new group, ordered by key.
  // A negative color joins no group and gets nullptr.
  virtual std::shared_ptr<ProcessGroup> split(int color, int key) = 0;

  // Ends every rank of the job with `why` on stderr. For a rank that fails outside a collective:
  // the others would otherwise wait for it until their timeout.
  [[noreturn]] virtual void abort(const std::string& why) = 0;

  // Total busy seconds of completed collectives on this group since creation.
  virtual double communication_seconds() const = 0;
  // Total seconds the callers' device streams stood still in this group's Work::wait_timing_stream
  // (NCCL: the wait is queued on the stream, timed by two CUDA events around it, counted once the
  // stream has passed it). 0 where wait() blocks the host instead (MPI, staged): the caller times those.
  virtual double stream_wait_seconds() const { return 0.0; }
};
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// FSDP_COMM_TIMEOUT_MS from the environment if set (throws std::runtime_error unless it is a
// positive number of milliseconds), else `fallback`. Every backend's group constructor applies it.
std::chrono::milliseconds comm_timeout_from_env(std::chrono::milliseconds fallback);
// FSDP_COMM_WAIT ("spin" or "backoff") if set, else `fallback`; anything else throws, naming it.
CommWait comm_wait_from_env(CommWait fallback);

// The job's world group. Rank, size and local rank come from the launcher (mpirun, srun);
// a process started without one is world size 1. Initialises MPI (MPI_THREAD_MULTIPLE) once;
// later calls return the same group.
ProcessGroupPtr init_world(const ProcessGroupOptions& options = {});

// Checks shared by every backend; each throws std::invalid_argument naming the operation, the
// rank, the shapes and the dtypes.
void check_all_gather_args(const ProcessGroup& group, const at::Tensor& output, const at::Tensor& input);
void check_reduce_scatter_args(const ProcessGroup& group, const at::Tensor& output, const at::Tensor& input,
                               ReduceOp op);
void check_all_reduce_args(const ProcessGroup& group, const at::Tensor& tensor, ReduceOp op);
void check_broadcast_args(const ProcessGroup& group, const at::Tensor& tensor, int root);

}  // namespace fsdp::comm
