// NCCL backend of ProcessGroup, for CUDA tensors (see fsdp/comm/nccl_process_group.h).
//
// Compiled with -DFSDP_CUDA=ON against a CUDA libtorch; on machines with the CUDA toolkit but a
// CPU libtorch it is compiled (not linked) by the fsdp_cuda_compile_check target.
#include "fsdp/comm/nccl_process_group.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>  // before nccl.h: older headers define ncclBfloat16 only when bf16 types exist
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "fsdp/comm/collective_agreement.h"
#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/in_flight_storage.h"
#include "fsdp/comm/device_assignment.h"
#include "fsdp/comm/launch.h"
#include "fsdp/comm/text_gather.h"

namespace fsdp::comm {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t code, const char* call, const std::string& where) {
  if (code == cudaSuccess) return;
  throw std::runtime_error(where + ": " + call + " failed: " + cudaGetErrorString(code));
}

void check_nccl(ncclResult_t code, const char* call, const std::string& where) {
  if (code == ncclSuccess) return;
  throw std::runtime_error(where + ": " + call + " failed: " + ncclGetErrorString(code));
}

ncclDataType_t nccl_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kLong: return ncclInt64;
    case at::kBFloat16: return ncclBfloat16;  // native: NCCL >= 2.10 reduces bf16 itself
    case at::kHalf: return ncclFloat16;
    case at::kByte: return ncclUint8;  // packed bytes (NF4): gathered and broadcast only
    default: throw std::invalid_argument(std::string("nccl: unsupported dtype ") + c10::toString(type));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Average: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

class NcclWork;

// The callers' waits on a group's collectives that were timed (NcclWork::wait), kept until both of
// a wait's events have fired and summed then: the seconds the callers' streams stood still.
struct TimedStreamWaits {
  std::mutex mutex;
  std::vector<std::shared_ptr<NcclWork>> queued;  // in the order waited
  std::atomic<int64_t> stalled_nanoseconds{0};
  // Held by a reader (the watchdog, stream_wait_seconds) across a whole read: a second reader
  // waits for the first's sums rather than finding the queue taken and the sum not yet added.
  // Waiting callers take only `mutex`, never this.
  std::mutex reading;
};

// One collective in flight. Owned by the caller (as a Work) and by the group's pending list
// until its completion event fired; the tensors it names stay referenced until then.
class NcclWork final : public Work, public std::enable_shared_from_this<NcclWork> {
 public:
  NcclWork(std::string description, int device_index, std::vector<at::Tensor> tensors,
           std::weak_ptr<TimedStreamWaits> timed_waits)
      : description_(std::move(description)),
        device_index_(device_index),
        tensors_(std::move(tensors)),
        in_flight_(tensors_, description_),
        timed_waits_(std::move(timed_waits)),
        enqueued_(Clock::now()) {
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate", description_);
    check_cuda(cudaEventCreate(&done_), "cudaEventCreate", description_);
  }
  ~NcclWork() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(done_);
    if (wait_begin_ != nullptr) cudaEventDestroy(wait_begin_);
    if (wait_end_ != nullptr) cudaEventDestroy(wait_end_);
  }

  // Stream-ordered: the caller's current stream waits for the collective; the host does not,
  // except, while agreement is due, for the ranks' descriptions (over MPI).
  void wait() override { wait_on_stream(/*timed=*/false); }

  // The host's clock cannot see how long the stream then stands still (the exposed communication
  // on a GPU), so the first such wait on a collective not yet completed is bracketed by two
  // events on the caller's stream: the first fires when the stream reaches the wait, the second
  // when it passes it; the group sums the time between them (TimedStreamWaits).
  bool wait_timing_stream() override {
    wait_on_stream(/*timed=*/true);
    return true;
  }

  // The seconds the caller's stream stood still at the timed wait, once the stream has passed it
  // (both events fired); nullopt before. A failed query reads as 0 s (the collective's own
  // failure is the watchdog's to report).
  std::optional<double> stalled_seconds() const {
    const cudaError_t state = cudaEventQuery(wait_end_);
    if (state == cudaErrorNotReady) {
      // Not an error, but the runtime keeps it as this thread's last one: a later launch check on
      // the thread (C10_CUDA_KERNEL_LAUNCH_CHECK) would throw "device not ready". As c10's
      // CUDAEvent::query does, cleared.
      (void)cudaGetLastError();
      return std::nullopt;
    }
    float milliseconds = 0.0f;
    if (state != cudaSuccess || cudaEventElapsedTime(&milliseconds, wait_begin_, wait_end_) != cudaSuccess) return 0.0;
    return milliseconds * 1e-3;
  }

  bool is_completed() override { return completed_.load(); }
  double busy_seconds() const override { return busy_seconds_.load(); }

  cudaEvent_t start_event() const { return start_; }
  cudaEvent_t done_event() const { return done_; }
  const std::string& description() const { return description_; }
  Clock::time_point enqueued() const { return enqueued_; }
  const std::vector<at::Tensor>& tensors() const { return tensors_; }
  void set_agreement(std::shared_ptr<PendingAgreement> agreement) { agreement_ = std::move(agreement); }

  // Called by the watchdog once the done event fired: device time, and the tensors let go.
  void finish() {
    float milliseconds = 0.0f;
    if (cudaEventElapsedTime(&milliseconds, start_, done_) == cudaSuccess) busy_seconds_ = milliseconds * 1e-3;
    tensors_.clear();
    in_flight_.release();
    completed_ = true;
  }

 private:
  void wait_on_stream(bool timed) {
    if (agreement_) check_collective_agreement(*agreement_);
    // The events and the stream are this work's device's, whatever device the calling thread has.
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index_));
    std::shared_ptr<TimedStreamWaits> ledger =
        (!timed || completed_ || wait_begin_ != nullptr) ? nullptr : timed_waits_.lock();
    if (ledger) {
      check_cuda(cudaEventCreate(&wait_begin_), "cudaEventCreate", description_);
      check_cuda(cudaEventCreate(&wait_end_), "cudaEventCreate", description_);
      check_cuda(cudaEventRecord(wait_begin_, current.stream()), "cudaEventRecord", description_);
    }
    check_cuda(cudaStreamWaitEvent(current.stream(), done_, 0), "cudaStreamWaitEvent", description_);
    if (ledger) {
      check_cuda(cudaEventRecord(wait_end_, current.stream()), "cudaEventRecord", description_);
      std::lock_guard<std::mutex> lock(ledger->mutex);
      ledger->queued.push_back(shared_from_this());
    }
    in_flight_.release();  // the caller's stream is ordered after it (and the blocks are recorded on ours)
  }

  std::string description_;
  int device_index_;
  std::vector<at::Tensor> tensors_;
  InFlightStorage in_flight_;                    // tensors_' storages, until wait() or completion (in_flight_storage.h)
  std::shared_ptr<PendingAgreement> agreement_;  // collective_agreement.h
  std::weak_ptr<TimedStreamWaits> timed_waits_;  // the group's; gone with it
  Clock::time_point enqueued_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cudaEvent_t wait_begin_ = nullptr;  // on the caller's stream, around its first wait (made then)
  cudaEvent_t wait_end_ = nullptr;
  std::atomic<bool> completed_{false};
  std::atomic<double> busy_seconds_{0.0};
};

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0), "ncclCommSplit needs NCCL 2.18 or newer");

class NcclProcessGroup final : public ProcessGroup {
 public:
  // `comm`: the communicator split for it from its parent's (split()); null: one made here from
  // rank 0's unique id, broadcast through the bootstrap group.
  NcclProcessGroup(ProcessGroupPtr bootstrap, int device_index, ProcessGroupOptions options, ncclComm_t comm = nullptr)
      : bootstrap_(std::move(bootstrap)),
        device_index_(device_index),
        options_(options),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device_index))) {
    rank_ = bootstrap_->rank();
    size_ = bootstrap_->size();
    who_ = "[fsdp nccl group " + bootstrap_->name() + " rank " + std::to_string(rank_) + "/" + std::to_string(size_) +
           ", cuda:" + std::to_string(device_index_) + "]";
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    if (comm != nullptr) {
      comm_ = comm;
      watchdog_ = std::thread([this] { watch(); });
      return;
    }
    // ncclUniqueId is 128 opaque bytes: broadcast from rank 0 as 16 int64 through the bootstrap group.
    ncclUniqueId id;
    static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0, "ncclUniqueId is not a whole number of int64");
    at::Tensor id_words = at::zeros({static_cast<int64_t>(sizeof(ncclUniqueId) / sizeof(int64_t))}, at::kLong);
    if (rank_ == 0) {
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", who_);
      std::memcpy(id_words.data_ptr(), &id, sizeof(id));
    }
    if (size_ > 1) bootstrap_->broadcast(id_words, 0)->wait();
    std::memcpy(&id, id_words.data_ptr(), sizeof(id));
    const int size = size_, rank = rank_;
    comm_ = within_timeout("ncclCommInitRank",
                           [id, size, rank](ncclComm_t* made) { return ncclCommInitRank(made, size, id, rank); });
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclProcessGroup() override {
    // Drain first, while the watchdog still runs: a collective a dead peer never joins is then
    // aborted at the timeout instead of hanging ncclCommDestroy.
    cudaStreamSynchronize(stream_.stream());
    stopping_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  // ncclCommInitRank and ncclCommSplit return once every rank of the group has called them: a rank
  // that died before would leave the others in it for ever (the watchdog starts after it). `call`
  // runs on a thread of its own (on this group's device), waited for up to the group's timeout;
  // past it this rank throws naming the call, and the thread (still inside NCCL) is left to the
  // process's exit. A split's thread is inside this group's own communicator, which unwinding
  // would destroy under it: `abort_on_timeout` ends the job instead (abort()).
  ncclComm_t within_timeout(const char* call, std::function<ncclResult_t(ncclComm_t*)> make,
                            bool abort_on_timeout = false) {
    struct Init {
      std::mutex mutex;
      std::condition_variable done_cv;
      bool done = false;
      ncclResult_t result = ncclSuccess;
      ncclComm_t comm = nullptr;
    };
    auto init = std::make_shared<Init>();
    const int device = device_index_;
    std::thread([init, make, device] {
      cudaSetDevice(device);
      ncclComm_t comm = nullptr;
      const ncclResult_t result = make(&comm);
      std::lock_guard<std::mutex> lock(init->mutex);
      init->result = result;
      init->comm = comm;
      init->done = true;
      init->done_cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(init->mutex);
    if (!init->done_cv.wait_for(lock, options_.timeout, [&] { return init->done; })) {
      const std::string why = std::string(call) + " did not complete within " +
                              std::to_string(std::chrono::duration<double>(options_.timeout).count()) +
                              " s (FSDP_COMM_TIMEOUT_MS): a rank of the " + std::to_string(size_) +
                              " did not join it (did one die, or take another code path?)";
      lock.unlock();
      if (abort_on_timeout) abort(why);
      throw std::runtime_error(who_ + ": " + why);
    }
    check_nccl(init->result, call, who_);
    return init->comm;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return bootstrap_->name() + "/nccl"; }
  std::string channel() const override { return bootstrap_->channel() + "/nccl"; }
  at::DeviceType device_type() const override { return at::kCUDA; }
  bool needs_one_issue_order() const override { return true; }
  double communication_seconds() const override { return busy_nanoseconds_.load() * 1e-9; }
  double stream_wait_seconds() const override {
    read_timed_waits();
    return timed_waits_->stalled_nanoseconds.load() * 1e-9;
  }

  WorkPtr all_gather(const at::Tensor& output, const at::Tensor& input) override {
    if (on_host(output, input)) return bootstrap_->all_gather(output, input);
    check_all_gather_args(*this, output, input);
    check_device(output, "all_gather");
    const std::string what = "all_gather(" + std::to_string(input.numel()) + " x " + std::to_string(size_) + " " +
                             c10::toString(input.scalar_type()) + ")";
    return enqueue(what, {output, input}, [&] {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                           nccl_type(input.scalar_type()), comm_, stream_.stream());
    });
  }

  WorkPtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    if (on_host(output, input)) return bootstrap_->reduce_scatter(output, input, op);
    check_reduce_scatter_args(*this, output, input, op);
    check_device(output, "reduce_scatter");
    const std::string what = std::string("reduce_scatter(") + to_string(op) + ", " + std::to_string(output.numel()) +
                             " x " + std::to_string(size_) + " " + c10::toString(input.scalar_type()) + ")";
    return enqueue(what, {output, input}, [&] {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                               nccl_type(input.scalar_type()), nccl_op(op), comm_, stream_.stream());
    });
  }

  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    if (on_host(tensor, tensor)) return bootstrap_->all_reduce(tensor, op);
    check_all_reduce_args(*this, tensor, op);
    check_device(tensor, "all_reduce");
    const std::string what = std::string("all_reduce(") + to_string(op) + ", " + std::to_string(tensor.numel()) + " " +
                             c10::toString(tensor.scalar_type()) + ")";
    return enqueue(what, {tensor}, [&] {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                           nccl_type(tensor.scalar_type()), nccl_op(op), comm_, stream_.stream());
    });
  }

  // This group's stream waits for `first`'s completion event (a collective of another NCCL group
  // on this device), then the all-reduce is enqueued as any: the caller's stream never waits for
  // `first`.
  WorkPtr all_reduce_after(const WorkPtr& first, const at::Tensor& tensor, ReduceOp op) override {
    if (on_host(tensor, tensor)) return bootstrap_->all_reduce_after(first, tensor, op);
    const auto* on_device = dynamic_cast<const NcclWork*>(first.get());
    if (on_device == nullptr) return ProcessGroup::all_reduce_after(first, tensor, op);
    check_cuda(cudaStreamWaitEvent(stream_.stream(), on_device->done_event(), 0), "cudaStreamWaitEvent",
               who_ + " all_reduce after " + on_device->description());
    return all_reduce(tensor, op);
  }

  WorkPtr broadcast(const at::Tensor& tensor, int root) override {
    if (on_host(tensor, tensor)) return bootstrap_->broadcast(tensor, root);
    check_broadcast_args(*this, tensor, root);
    check_device(tensor, "broadcast");
    const std::string what = "broadcast(" + std::to_string(tensor.numel()) + " " + c10::toString(tensor.scalar_type()) +
                             " from rank " + std::to_string(root) + ")";
    return enqueue(what, {tensor}, [&] {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                           nccl_type(tensor.scalar_type()), root, comm_, stream_.stream());
    });
  }

  // Host-blocking, as the contract says (callers order file-system steps with it): this rank's
  // queued collectives and compute finish, then the ranks meet over the bootstrap group.
  WorkPtr barrier() override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    check_cuda(cudaStreamSynchronize(stream_.stream()), "cudaStreamSynchronize", who_ + " barrier");
    check_cuda(
        cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index_)).stream()),
        "cudaStreamSynchronize", who_ + " barrier");
    return bootstrap_->barrier();
  }

  // Split through the bootstrap group (same colors and keys: host tensors go there), then this
  // group's communicator with ncclCommSplit, which every rank of it joins (one outside any part
  // with NCCL_SPLIT_NOCOLOR): no unique id to exchange. Its key is the rank the bootstrap split
  // gave, so both number the part's ranks alike (checked).
  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    ProcessGroupPtr part = bootstrap_->split(color, key);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    ncclComm_t parent = comm_;
    const int nccl_color = part ? color : NCCL_SPLIT_NOCOLOR, nccl_key = part ? part->rank() : 0;
    ncclComm_t comm = within_timeout(
        "ncclCommSplit",
        [parent, nccl_color, nccl_key](ncclComm_t* made) {
          return ncclCommSplit(parent, nccl_color, nccl_key, made, nullptr);
        },
        /*abort_on_timeout=*/true);
    if (!part) {
      if (comm != nullptr) ncclCommDestroy(comm);
      return nullptr;
    }
    int nccl_rank = -1, nccl_size = 0;
    check_nccl(ncclCommUserRank(comm, &nccl_rank), "ncclCommUserRank", who_);
    check_nccl(ncclCommCount(comm, &nccl_size), "ncclCommCount", who_);
    if (nccl_rank != part->rank() || nccl_size != part->size()) {
      ncclCommDestroy(comm);
      throw std::runtime_error(who_ + ": ncclCommSplit(color " + std::to_string(color) + ", key " +
                               std::to_string(key) + ") made rank " + std::to_string(nccl_rank) + " of " +
                               std::to_string(nccl_size) + ", the bootstrap split rank " +
                               std::to_string(part->rank()) + " of " + std::to_string(part->size()));
    }
    return std::make_shared<NcclProcessGroup>(part, device_index_, options_, comm);
  }

  [[noreturn]] void abort(const std::string& why) override {
    if (comm_ != nullptr) ncclCommAbort(comm_);  // unblocks kernels waiting on peers that are gone
    bootstrap_->abort(who_ + " " + why);
    std::abort();  // not reached: the bootstrap's abort ends the process
  }

 private:
  // Host tensors (control: losses, flags, checkpoint facts) go through the bootstrap group, the
  // same ranks over MPI, so code above comm need not know which backend moves its device tensors.
  static bool on_host(const at::Tensor& a, const at::Tensor& b) {
    return a.defined() && b.defined() && a.device().is_cpu() && b.device().is_cpu();
  }

  void check_device(const at::Tensor& t, const char* op) const {
    if (t.device().index() != device_index_) {
      throw std::invalid_argument(who_ + " " + op + ": the tensor is on " + t.device().str() +
                                  ", this group's device is cuda:" + std::to_string(device_index_));
    }
  }

  template <class Launch>
  WorkPtr enqueue(const std::string& what, std::vector<at::Tensor> tensors, Launch&& launch) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    const std::string place = record_collective(channel(), what);
    auto work = std::make_shared<NcclWork>(who_ + " " + what + " [" + place + "]", device_index_, std::move(tensors),
                                           timed_waits_);
    // While agreement is due (the first step, by default), every rank's description travels over
    // MPI beside the collective; wait() compares them before anything waits on the device.
    if (collective_agreement_due(collective_agreement_mode(CollectiveAgreementMode::kFirstStep))) {
      work->set_agreement(post_collective_agreement(*bootstrap_, channel(), describe_collective(what), place));
    }
    // The collective reads what the caller's stream wrote: order it after that stream's queued work.
    c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index_));
    check_cuda(cudaEventRecord(work->start_event(), caller.stream()), "cudaEventRecord", work->description());
    check_cuda(cudaStreamWaitEvent(stream_.stream(), work->start_event(), 0), "cudaStreamWaitEvent",
               work->description());
    // Re-recorded on the communication stream: the device time measured starts when it may start.
    check_cuda(cudaEventRecord(work->start_event(), stream_.stream()), "cudaEventRecord", work->description());
    check_nccl(launch(), "nccl collective", work->description());
    // The caller may hand a tensor's memory back to the caching allocator before the collective
    // has run (shard/storage.h's free_storage swaps a buffer's storage out at once, whatever this
    // group holds). Recorded on this stream, the allocator keeps the block from other work until
    // the stream has passed this point, whatever stream the free came from.
    for (const at::Tensor& tensor : work->tensors()) {
      if (tensor.defined() && tensor.is_cuda() && tensor.storage().data_ptr().get() != nullptr) {
        c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream_);
      }
    }
    check_cuda(cudaEventRecord(work->done_event(), stream_.stream()), "cudaEventRecord", work->description());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(work);
    }
    return work;
  }

  // Sums the stalls of the timed waits whose streams have passed them, and lets those go. Called
  // by the watchdog and by stream_wait_seconds() (so a reader after a device sync sees them all).
  void read_timed_waits() const {
    const std::lock_guard<std::mutex> reading(timed_waits_->reading);
    std::vector<std::shared_ptr<NcclWork>> taken;  // queried outside `mutex`: a waiting caller never waits for it
    {
      std::lock_guard<std::mutex> lock(timed_waits_->mutex);
      taken.swap(timed_waits_->queued);
    }
    std::vector<std::shared_ptr<NcclWork>> unfinished;
    for (const std::shared_ptr<NcclWork>& work : taken) {
      if (const std::optional<double> seconds = work->stalled_seconds()) {
        timed_waits_->stalled_nanoseconds += static_cast<int64_t>(*seconds * 1e9);
      } else {
        unfinished.push_back(work);
      }
    }
    if (unfinished.empty()) return;
    std::lock_guard<std::mutex> lock(timed_waits_->mutex);
    timed_waits_->queued.insert(timed_waits_->queued.end(), unfinished.begin(), unfinished.end());
  }

  // Completes works in issue order (one stream runs them in that order), keeps the timeout.
  void watch() {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    while (!stopping_) {
      read_timed_waits();
      std::shared_ptr<NcclWork> oldest;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!pending_.empty()) oldest = pending_.front();
      }
      if (!oldest) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // idle: nothing to watch
        continue;
      }
      const cudaError_t state = cudaEventQuery(oldest->done_event());
      if (state == cudaSuccess) {
        oldest->finish();
        busy_nanoseconds_ += static_cast<int64_t>(oldest->busy_seconds() * 1e9);
        std::lock_guard<std::mutex> lock(mutex_);
        pending_.pop_front();
        continue;
      }
      if (state == cudaErrorNotReady) (void)cudaGetLastError();  // not an error: not this thread's last one either
      ncclResult_t async_error = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async_error);
      if (state != cudaErrorNotReady || async_error != ncclSuccess) {
        abort(oldest->description() +
              " failed: " + (async_error != ncclSuccess ? ncclGetErrorString(async_error) : cudaGetErrorString(state)));
      }
      if (Clock::now() - oldest->enqueued() > options_.timeout) {
        abort(oldest->description() + " did not complete within " + std::to_string(options_.timeout.count()) +
              " ms: another rank probably never joined it (it failed, or took another code path)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  ProcessGroupPtr bootstrap_;
  int device_index_;
  ProcessGroupOptions options_;
  c10::cuda::CUDAStream stream_;  // this group's communication stream (high priority)
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  std::string who_;
  std::mutex mutex_;
  std::deque<std::shared_ptr<NcclWork>> pending_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> busy_nanoseconds_{0};
  std::shared_ptr<TimedStreamWaits> timed_waits_ = std::make_shared<TimedStreamWaits>();
  std::thread watchdog_;
};

}  // namespace

bool nccl_backend_built() { return true; }

int local_device_index() {
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount", "local_device_index");
  return device_index_for(launch_info_from_env(), devices);
}

ProcessGroupPtr make_nccl_group(const ProcessGroupPtr& bootstrap, int device_index,
                                const ProcessGroupOptions& options) {
  if (!bootstrap) throw std::invalid_argument("make_nccl_group: no bootstrap group");
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount", "make_nccl_group");
  if (device_index < 0 || device_index >= devices) {
    throw std::invalid_argument("make_nccl_group: device index " + std::to_string(device_index) +
                                " is not one of the " + std::to_string(devices) + " visible CUDA devices");
  }
  check_cuda(cudaSetDevice(device_index), "cudaSetDevice", "make_nccl_group");
  // One rank per device, agreed before NCCL starts (comm/device_assignment.h): every rank gets
  // every claim, so every rank refuses alike.
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device_index), "cudaGetDeviceProperties", "make_nccl_group");
  char uuid[2 * sizeof(properties.uuid.bytes) + 1] = {};
  for (size_t i = 0; i < sizeof(properties.uuid.bytes); ++i) {
    std::snprintf(uuid + 2 * i, 3, "%02x", static_cast<unsigned char>(properties.uuid.bytes[i]));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::vector<DeviceClaim> claims;
  for (const std::string& text :
       all_gather_text(bootstrap, to_text(DeviceClaim{host, std::string("GPU-") + uuid, device_index}))) {
    claims.push_back(claim_from_text(text));
  }
  check_one_rank_per_device(claims, launch_info_from_env(), devices);
  ProcessGroupOptions resolved = options;
  resolved.timeout = comm_timeout_from_env(options.timeout);
  return std::make_shared<NcclProcessGroup>(bootstrap, device_index, resolved);
}

}  // namespace fsdp::comm
