// MPI backend of ProcessGroup, for CPU tensors.
//
// Each group owns an MPI communicator and one communication thread. Collectives are queued in
// call order and run by that thread with blocking MPI calls, so they progress while the caller
// computes, and every rank's thread issues them in the same order (the order the callers used).
// MPI is initialised with MPI_THREAD_MULTIPLE: several groups' threads may be inside MPI at once.
#include <mpi.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "fsdp/comm/collective_agreement.h"
#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/in_flight_storage.h"
#include "fsdp/comm/launch.h"
#include "fsdp/comm/process_group.h"

namespace fsdp::comm {
namespace {

using Clock = std::chrono::steady_clock;

void check_mpi(int code, const char* call, const std::string& where) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(where + ": " + call + " failed: " + std::string(text, length));
}

int checked_count(int64_t numel, const std::string& where) {
  if (numel > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(where + ": " + std::to_string(numel) +
                                " elements exceed MPI's int count; split the buffer");
  }
  return static_cast<int>(numel);
}

// The MPI datatype that moves the tensor's bytes unchanged (bf16 and fp16 travel as 16-bit words).
MPI_Datatype transport_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kBFloat16:
    case at::kHalf: return MPI_UINT16_T;
    case at::kByte: return MPI_UINT8_T;  // packed bytes (NF4): gathered and broadcast only
    default: throw std::invalid_argument(std::string("mpi: unsupported dtype ") + c10::toString(type));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

// Completes `count` nonblocking requests (CommWait::kBackoff). Open MPI progresses a request only
// inside an MPI call, so the loop tests it: without pause for the first kSpinFor (a collective
// between neighbours often ends within it), then with sleeps of 20 us doubling to 200 us between
// tests, which gives the core to compute threads and other processes. The added latency is at
// most one sleep per step of a collective's schedule.
void complete_backoff(MPI_Request* requests, int count, const char* call, const std::string& where) {
  constexpr auto kSpinFor = std::chrono::microseconds(50);
  constexpr auto kFirstSleep = std::chrono::microseconds(20);
  constexpr auto kLongestSleep = std::chrono::microseconds(200);
  const auto start = Clock::now();
  auto sleep = kFirstSleep;
  for (;;) {
    int done = 0;
    check_mpi(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), call, where);
    if (done) return;
    if (Clock::now() - start < kSpinFor) continue;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(2 * sleep, kLongestSleep);
  }
}

// Averages in place after a sum. Raw loops: the buffers may be aliased by autograd tensors,
// whose version counters a torch op would bump.
void divide_in_place(void* data, at::ScalarType type, int64_t n, int divisor) {
  if (type == at::kFloat) {
    float* p = static_cast<float*>(data);
    for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<float>(divisor);
  } else if (type == at::kDouble) {
    double* p = static_cast<double*>(data);
    for (int64_t i = 0; i < n; ++i) p[i] /= divisor;
  }
}

// Ring reduce-scatter of sums: N - 1 steps; in step s this rank sends its partial sum of block
// (rank - 1 - s) mod N to the next rank and receives the previous rank's partial sum of block
// (rank - 2 - s) mod N, adding its own input block to it. After the last step `output` holds the
// full sum of block `rank`. Each rank sends and receives (N - 1) / N of the input once, through one
// temporary block. Used for large buffers, where Open MPI 4.1's MPI_Reduce_scatter_block runs at
// ~0.1-3 GB/s on one machine (docs/benchmarks.md) against ~10 GB/s for its all-gather.
template <class T>
void ring_reduce_scatter_sum(const T* input, T* output, int count, MPI_Datatype type, MPI_Comm comm, int rank, int size,
                             CommWait wait, const std::string& where) {
  if (size == 1) {
    std::copy(input, input + count, output);
    return;
  }
  constexpr int kTag = 7301;
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  // Kept for the communication thread's life: a fresh buffer per call would be page-faulted in again.
  thread_local std::vector<T> received;
  if (received.size() < static_cast<size_t>(count)) received.resize(static_cast<size_t>(count));
  for (int step = 0; step < size - 1; ++step) {
    const int send_block = ((rank - 1 - step) % size + 2 * size) % size;
    const int receive_block = ((rank - 2 - step) % size + 2 * size) % size;
    const T* send = step == 0 ? input + static_cast<int64_t>(send_block) * count : output;
    if (wait == CommWait::kSpin) {
      check_mpi(MPI_Sendrecv(send, count, type, next, kTag, received.data(), count, type, previous, kTag, comm,
                             MPI_STATUS_IGNORE),
                "MPI_Sendrecv", where);
    } else {
      MPI_Request requests[2];
      check_mpi(MPI_Irecv(received.data(), count, type, previous, kTag, comm, &requests[0]), "MPI_Irecv", where);
      check_mpi(MPI_Isend(send, count, type, next, kTag, comm, &requests[1]), "MPI_Isend", where);
      complete_backoff(requests, 2, "MPI_Isend/MPI_Irecv", where);
    }
    const T* mine = input + static_cast<int64_t>(receive_block) * count;
    for (int i = 0; i < count; ++i) output[i] = received[static_cast<size_t>(i)] + mine[i];
  }
}

// Below this many elements per rank MPI's own reduce-scatter is as fast (small messages: latency).
constexpr int64_t kRingReduceScatterMinCount = 16384;
// Below this many elements in all, MPI's nonblocking all-gather is as fast as our ring (kBackoff).
constexpr int64_t kRingAllGatherMinCount = 16384;

// MPI has no 16-bit float types: bf16 and fp16 are reduced in fp32 and rounded once at the end.
bool is_16_bit_float(at::ScalarType type) { return type == at::kBFloat16 || type == at::kHalf; }

template <class Narrow>
std::vector<float> widen(const at::Tensor& t) {
  const auto* src = static_cast<const Narrow*>(t.data_ptr());
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(src[i]);
  return out;
}

template <class Narrow>
void narrow_into(const std::vector<float>& values, const at::Tensor& t, float divisor) {
  auto* dst = static_cast<Narrow*>(t.data_ptr());
  for (size_t i = 0; i < values.size(); ++i) dst[i] = Narrow(values[i] / divisor);
}

// t (bf16 or fp16) as fp32 values.
std::vector<float> to_float(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? widen<c10::Half>(t) : widen<c10::BFloat16>(t);
}

// values / divisor rounded into t (bf16 or fp16, values.size() elements).
void from_float(const std::vector<float>& values, const at::Tensor& t, float divisor) {
  if (t.scalar_type() == at::kHalf) narrow_into<c10::Half>(values, t, divisor);
  else narrow_into<c10::BFloat16>(values, t, divisor);
}

// Ring all-gather over point-to-point messages, for CommWait::kBackoff: Open MPI 4.1's nonblocking
// MPI_Iallgather (libnbc) runs at 0.66-0.88x its blocking one on 4-64 MiB here, while Isend/Irecv
// take the same single-copy path as the blocking calls. N - 1 steps; in step s this rank forwards
// block (rank - s) mod N to the next rank and receives block (rank - s - 1) mod N from the previous
// one, straight into `output` [N * count bytes of `type`]. `input` is this rank's block.
void ring_all_gather(const void* input, void* output, int count, MPI_Datatype type, MPI_Comm comm, int rank, int size,
                     const std::string& where) {
  int type_size = 0;
  MPI_Type_size(type, &type_size);
  const int64_t block_bytes = static_cast<int64_t>(count) * type_size;
  char* out = static_cast<char*>(output);
  if (out + rank * block_bytes != input) std::memcpy(out + rank * block_bytes, input, static_cast<size_t>(block_bytes));
  constexpr int kTag = 7302;
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  for (int step = 0; step < size - 1; ++step) {
    const int send_block = (rank - step + size) % size;
    const int receive_block = (rank - step - 1 + 2 * size) % size;
    MPI_Request requests[2];
    check_mpi(MPI_Irecv(out + receive_block * block_bytes, count, type, previous, kTag, comm, &requests[0]),
              "MPI_Irecv", where);
    check_mpi(MPI_Isend(out + send_block * block_bytes, count, type, next, kTag, comm, &requests[1]), "MPI_Isend",
              where);
    complete_backoff(requests, 2, "MPI_Isend/MPI_Irecv", where);
  }
}

// Ends the job from this process: MPI_Abort asks the launcher to end every rank. Across hosts the
// launcher may be unable to reach a host whose link is down, and MPI_Abort need not return then (a
// run on 2026-11-30 sat in it for 142 s, until the link came back), so a timer ends this process
// kAbortGrace later whatever MPI_Abort does. The launcher's own exit is its keepalive's business
// (docs/across-hosts.md).
constexpr std::chrono::seconds kAbortGrace{5};

[[noreturn]] void abort_world(int code) {
  std::thread([code] {
    std::this_thread::sleep_for(kAbortGrace);
    std::fprintf(stderr, "fsdp: MPI_Abort did not end this process within %lld s; exiting\n",
                 static_cast<long long>(kAbortGrace.count()));
    std::fflush(stderr);
    std::_Exit(code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// The ranks a collective on `comm` waits for besides this one, as world ranks: "1", "0 2 3", or
// the first eight and a count.
std::string peers_of(MPI_Comm comm, int rank, int size) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks, world_ranks;
  for (int r = 0; r < size; ++r)
    if (r != rank) ranks.push_back(r);
  world_ranks.resize(ranks.size());
  MPI_Group_translate_ranks(group, static_cast<int>(ranks.size()), ranks.data(), world, world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  std::string text;
  for (size_t i = 0; i < world_ranks.size() && i < 8; ++i) text += (i ? " " : "") + std::to_string(world_ranks[i]);
  if (world_ranks.size() > 8) text += " ... (" + std::to_string(world_ranks.size()) + " ranks)";
  return text.empty() ? "none" : text;
}

// A duplicate of MPI_COMM_WORLD used only when a wait times out: there the ranks exchange where each
// one waits, on a communicator no collective of theirs can be stuck in. MPI_COMM_NULL until init_world.
MPI_Comm g_watchdog = MPI_COMM_NULL;
// How long a timed-out rank waits for the others' positions before it gives up.
constexpr std::chrono::seconds kPositionsGrace{3};
// When some rank could not answer (its host or the link is down), how long the rank waits for the
// launcher to end the job before aborting itself. MPI_Abort makes the launcher send to every host;
// on a dead link that data is retransmitted for many minutes, and while it is, TCP keepalive (how
// Open MPI's daemons notice a dead link: docs/across-hosts.md) stays silent: the launcher would
// outlive the job. Left alone, the launcher notices within its keepalive time and ends every rank.
constexpr std::chrono::seconds kLauncherGrace{4};

struct Positions {
  std::string lines;        // to print after the timeout's message
  bool every_rank = false;  // every rank answered
};

// Called by the first wait of this process that times out: every rank that times out (they all do
// when ranks took different code paths) says which collective it waits in, so each message shows
// both sides. Returns the lines to print; a rank that does not answer within kPositionsGrace (dead,
// or computing rather than waiting) is named as such.
Positions positions_at_timeout(const std::string& mine) {
  if (g_watchdog == MPI_COMM_NULL) return {};
  constexpr int kSlot = 256;
  int rank = 0, size = 1;
  MPI_Comm_rank(g_watchdog, &rank);
  MPI_Comm_size(g_watchdog, &size);
  if (size < 2) return {"", true};
  std::vector<char> slot(kSlot, '\0'), all(static_cast<size_t>(kSlot) * size, '\0');
  std::memcpy(slot.data(), mine.data(), std::min<size_t>(mine.size(), kSlot - 1));
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Iallgather(slot.data(), kSlot, MPI_CHAR, all.data(), kSlot, MPI_CHAR, g_watchdog, &request) != MPI_SUCCESS)
    return {};
  const auto deadline = Clock::now() + kPositionsGrace;
  int done = 0;
  while (!done && Clock::now() < deadline) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!done) {
    return {"  The other ranks did not say where they wait within " + std::to_string(kPositionsGrace.count()) +
                " s (dead, unreachable, or computing rather than waiting in a collective); leaving the launcher " +
                std::to_string(kLauncherGrace.count()) + " s to end the job before aborting.\n",
            false};
  }
  std::string lines = "  Where every rank waits (the first that differ took another code path):\n";
  for (int r = 0; r < size; ++r) {
    const char* text = all.data() + static_cast<size_t>(r) * kSlot;
    lines += "    rank " + std::to_string(r) + ": " + std::string(text, strnlen(text, kSlot)) + "\n";
  }
  return {lines, true};
}

std::atomic<bool> g_timed_out{false};  // the first timeout reports; later ones on other groups only abort

class MpiWork final : public Work {
 public:
  MpiWork(std::string description, std::string who, std::string peers, std::string place,
          std::chrono::milliseconds timeout, std::shared_ptr<PendingAgreement> agreement,
          const std::vector<at::Tensor>& tensors)
      : description_(std::move(description)),
        who_(std::move(who)),
        peers_(std::move(peers)),
        place_(std::move(place)),
        timeout_(timeout),
        agreement_(std::move(agreement)),
        in_flight_(tensors, description_ + " [" + place_ + "]") {}

  void wait() override {
    if (agreement_) check_collective_agreement(*agreement_);  // before the result is used
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_cv_.wait_for(lock, timeout_, [this] { return done_; })) {
      if (g_timed_out.exchange(true)) {  // another wait of this process is reporting, then aborts
        std::this_thread::sleep_for(kPositionsGrace + kLauncherGrace + std::chrono::seconds(5));
        abort_world(3);
      }
      // The line first (a launcher may end this process while the positions are exchanged), then
      // where every rank waits.
      std::fprintf(stderr,
                   "%s: %s did not complete within %lld ms, waiting for world rank(s) %s: one of them "
                   "probably never joined it (it failed, its host or link is down, or it took another "
                   "code path). Here it was %s. Aborting every rank.\n",
                   who_.c_str(), description_.c_str(), static_cast<long long>(timeout_.count()), peers_.c_str(),
                   place_.c_str());
      std::fflush(stderr);
      const Positions positions = positions_at_timeout(place_ + ": " + description_);
      std::fprintf(stderr, "%s", positions.lines.c_str());
      std::fflush(stderr);
      if (!positions.every_rank) std::this_thread::sleep_for(kLauncherGrace);
      abort_world(3);
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  double busy_seconds() const override { return busy_seconds_; }

  // Blocks until completed, without this work's timeout: for a communication thread whose next
  // collective waits for it (all_reduce_after). If it never completes, the wait that times out is
  // the host's, on the collective it is really blocked in, and that one names it.
  void wait_for_completion() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

  void finish(std::exception_ptr error, double busy_seconds) {
    in_flight_.release();  // the thread is done with the tensors' memory
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      busy_seconds_ = busy_seconds;
      done_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  std::string description_;
  std::string who_;
  std::string peers_;  // the ranks waited for (peers_of)
  std::string place_;  // its place in this rank's step (record_collective)
  std::chrono::milliseconds timeout_;
  std::shared_ptr<PendingAgreement> agreement_;  // set while agreement is due (collective_agreement.h)
  InFlightStorage in_flight_;                    // the tensors' storages, until finish()
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  double busy_seconds_ = 0;
};

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// `first` completed (an MPI collective's without its timeout; another backend's by its wait()).
void wait_for_completion(const WorkPtr& first) {
  if (auto* mpi = dynamic_cast<MpiWork*>(first.get())) mpi->wait_for_completion();
  else first->wait();
}

class MpiProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<MpiProcessGroup> {
 public:
  MpiProcessGroup(MPI_Comm comm, std::string name, std::string channel, ProcessGroupOptions options)
      : comm_(comm), name_(std::move(name)), channel_(std::move(channel)), options_(options) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    who_ = "[fsdp rank " + std::to_string(world_rank) + ", group " + name_ + " rank " + std::to_string(rank_) + "/" +
           std::to_string(size_) + "]";
    peers_ = peers_of(comm_, rank_, size_);
    thread_ = std::thread([this] { run(); });
  }

  ~MpiProcessGroup() override {
    stop();
    if (!mpi_finalized() && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    queue_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  std::string channel() const override { return channel_; }
  double communication_seconds() const override { return busy_nanoseconds_.load() * 1e-9; }

  WorkPtr all_gather(const at::Tensor& output, const at::Tensor& input) override {
    check_all_gather_args(*this, output, input);
    std::string what = "all_gather(" + std::to_string(input.numel()) + " x " + std::to_string(size_) + " " +
                       c10::toString(input.scalar_type()) + ")";
    return enqueue(
        what,
        [this, output, input, what] {
          int count = checked_count(input.numel(), who_ + " " + what);
          MPI_Datatype type = transport_type(input.scalar_type());
          if (options_.wait == CommWait::kBackoff && static_cast<int64_t>(count) * size_ >= kRingAllGatherMinCount) {
            ring_all_gather(input.data_ptr(), output.data_ptr(), count, type, comm_, rank_, size_, who_ + " " + what);
            return;
          }
          collective(
              "MPI_Allgather", who_ + " " + what,
              [&] { return MPI_Allgather(input.data_ptr(), count, type, output.data_ptr(), count, type, comm_); },
              [&](MPI_Request* r) {
                return MPI_Iallgather(input.data_ptr(), count, type, output.data_ptr(), count, type, comm_, r);
              });
        },
        {output, input});
  }

  WorkPtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    check_reduce_scatter_args(*this, output, input, op);
    std::string what = std::string("reduce_scatter(") + to_string(op) + ", " + std::to_string(output.numel()) + " x " +
                       std::to_string(size_) + " " + c10::toString(input.scalar_type()) + ")";
    return enqueue(
        what,
        [this, output, input, op, what] {
          int count = checked_count(output.numel(), who_ + " " + what);
          const bool ring = op != ReduceOp::Max && count >= kRingReduceScatterMinCount;
          if (is_16_bit_float(input.scalar_type())) {
            std::vector<float> in32 = to_float(input), out32(static_cast<size_t>(output.numel()));
            if (ring) {
              ring_reduce_scatter_sum(in32.data(), out32.data(), count, MPI_FLOAT, comm_, rank_, size_, options_.wait,
                                      who_ + " " + what);
            } else {
              collective(
                  "MPI_Reduce_scatter_block", who_ + " " + what,
                  [&] {
                    return MPI_Reduce_scatter_block(in32.data(), out32.data(), count, MPI_FLOAT, mpi_op(op), comm_);
                  },
                  [&](MPI_Request* r) {
                    return MPI_Ireduce_scatter_block(in32.data(), out32.data(), count, MPI_FLOAT, mpi_op(op), comm_, r);
                  });
            }
            from_float(out32, output, op == ReduceOp::Average ? static_cast<float>(size_) : 1.0f);
            return;
          }
          MPI_Datatype type = transport_type(input.scalar_type());
          if (ring && input.scalar_type() == at::kFloat) {
            ring_reduce_scatter_sum(static_cast<const float*>(input.data_ptr()), static_cast<float*>(output.data_ptr()),
                                    count, type, comm_, rank_, size_, options_.wait, who_ + " " + what);
          } else if (ring && input.scalar_type() == at::kDouble) {
            ring_reduce_scatter_sum(static_cast<const double*>(input.data_ptr()),
                                    static_cast<double*>(output.data_ptr()), count, type, comm_, rank_, size_,
                                    options_.wait, who_ + " " + what);
          } else {
            collective(
                "MPI_Reduce_scatter_block", who_ + " " + what,
                [&] {
                  return MPI_Reduce_scatter_block(input.data_ptr(), output.data_ptr(), count, type, mpi_op(op), comm_);
                },
                [&](MPI_Request* r) {
                  return MPI_Ireduce_scatter_block(input.data_ptr(), output.data_ptr(), count, type, mpi_op(op), comm_,
                                                   r);
                });
          }
          if (op == ReduceOp::Average) divide_in_place(output.data_ptr(), output.scalar_type(), output.numel(), size_);
        },
        {output, input});
  }

  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) override { return all_reduce_after(nullptr, tensor, op); }

  // The communication thread waits for `first` (another group's, run by its own thread) before it
  // sums: the caller issues both at once and computes on.
  WorkPtr all_reduce_after(const WorkPtr& first, const at::Tensor& tensor, ReduceOp op) override {
    check_all_reduce_args(*this, tensor, op);
    std::string what = std::string("all_reduce(") + to_string(op) + ", " + std::to_string(tensor.numel()) + " " +
                       c10::toString(tensor.scalar_type()) + ")";
    return enqueue(
        what,
        [this, tensor, op, what] {
          int count = checked_count(tensor.numel(), who_ + " " + what);
          if (is_16_bit_float(tensor.scalar_type())) {
            std::vector<float> values = to_float(tensor);
            all_reduce_values(values.data(), count, MPI_FLOAT, op, who_ + " " + what);
            from_float(values, tensor, op == ReduceOp::Average ? static_cast<float>(size_) : 1.0f);
            return;
          }
          all_reduce_values(tensor.data_ptr(), count, transport_type(tensor.scalar_type()), op, who_ + " " + what);
          if (op == ReduceOp::Average) divide_in_place(tensor.data_ptr(), tensor.scalar_type(), tensor.numel(), size_);
        },
        {tensor}, first);
  }

  // Sums (or maxima) of `count` values in place. Under kBackoff, a large float or double sum that
  // splits evenly over the ranks runs as our ring reduce-scatter then ring all-gather: Open MPI
  // 4.1's nonblocking MPI_Iallreduce runs at 0.34-0.46x its blocking one on 4-256 MiB here.
  void all_reduce_values(void* data, int count, MPI_Datatype type, ReduceOp op, const std::string& where) {
    const int block = count / size_;
    if (options_.wait == CommWait::kBackoff && op != ReduceOp::Max && size_ > 1 && count % size_ == 0 &&
        block >= kRingReduceScatterMinCount && (type == MPI_FLOAT || type == MPI_DOUBLE)) {
      if (type == MPI_FLOAT) {
        ring_all_reduce_sum(static_cast<float*>(data), block, type, where);
      } else {
        ring_all_reduce_sum(static_cast<double*>(data), block, type, where);
      }
      return;
    }
    collective(
        "MPI_Allreduce", where, [&] { return MPI_Allreduce(MPI_IN_PLACE, data, count, type, mpi_op(op), comm_); },
        [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_op(op), comm_, r); });
  }

  template <class T>
  void ring_all_reduce_sum(T* data, int block, MPI_Datatype type, const std::string& where) {
    // This rank's summed block, then every block from every rank: data [size_ * block] in place.
    thread_local std::vector<T> mine;
    if (mine.size() < static_cast<size_t>(block)) mine.resize(static_cast<size_t>(block));
    ring_reduce_scatter_sum(data, mine.data(), block, type, comm_, rank_, size_, options_.wait, where);
    ring_all_gather(mine.data(), data, block, type, comm_, rank_, size_, where);
  }

  WorkPtr broadcast(const at::Tensor& tensor, int root) override {
    check_broadcast_args(*this, tensor, root);
    std::string what = "broadcast(" + std::to_string(tensor.numel()) + " " + c10::toString(tensor.scalar_type()) +
                       " from rank " + std::to_string(root) + ")";
    return enqueue(what,
                   [this, tensor, root, what] {
                     int count = checked_count(tensor.numel(), who_ + " " + what);
                     const MPI_Datatype type = transport_type(tensor.scalar_type());
                     collective(
                         "MPI_Bcast", who_ + " " + what,
                         [&] { return MPI_Bcast(tensor.data_ptr(), count, type, root, comm_); },
                         [&](MPI_Request* r) { return MPI_Ibcast(tensor.data_ptr(), count, type, root, comm_, r); });
                   },
                   {tensor});
  }

  WorkPtr barrier() override {
    return enqueue("barrier", [this] {
      collective(
          "MPI_Barrier", who_ + " barrier", [&] { return MPI_Barrier(comm_); },
          [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
    });
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    auto new_comm = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    std::string what = "split(color=" + std::to_string(color) + ", key=" + std::to_string(key) + ")";
    enqueue(what, [this, new_comm, color, key, what] {
      check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, new_comm.get()), "MPI_Comm_split",
                who_ + " " + what);
    })->wait();
    // Every member calls split in the same order, so the k-th split has the same channel on every
    // rank, whatever its color.
    const std::string channel = channel_ + "/split#" + std::to_string(++splits_);
    if (*new_comm == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiProcessGroup>(*new_comm, name_ + "/split(color=" + std::to_string(color) + ")", channel,
                                             options_);
  }

  [[noreturn]] void abort(const std::string& why) override {
    std::fprintf(stderr, "%s aborting the job: %s\n", who_.c_str(), why.c_str());
    std::fflush(stderr);
    abort_world(1);
  }

 private:
  // One collective, waited for as options_.wait says: `blocking()` returns the MPI code of the
  // blocking call (kSpin); `start(&request)` posts the nonblocking one (kBackoff).
  template <class Blocking, class Start>
  void collective(const char* call, const std::string& where, Blocking blocking, Start start) {
    if (options_.wait == CommWait::kSpin) {
      check_mpi(blocking(), call, where);
      return;
    }
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(start(&request), call, where);
    complete_backoff(&request, 1, call, where);
  }

  struct Task {
    std::shared_ptr<MpiWork> work;
    std::function<void()> body;
    WorkPtr after;  // the body runs once this completed (all_reduce_after); not counted as busy
  };

  // `tensors`: those the body reads or writes, marked in flight until it has run (in_flight_storage.h).
  WorkPtr enqueue(const std::string& what, std::function<void()> body, const std::vector<at::Tensor>& tensors = {},
                  WorkPtr after = nullptr) {
    // A split's color differs between ranks by design: it is fingerprinted without it.
    const std::string recorded = what.rfind("split(", 0) == 0 ? "split" : what;
    // A collective carrying another (an agreement's exchange, a staged group's host copy) is
    // neither recorded nor agreed on: the carried one was (collective_log.h).
    const std::string* carried = carried_collective_place();
    const std::string place = carried != nullptr ? *carried : record_collective(channel_, recorded);
    std::shared_ptr<PendingAgreement> agreement;
    if (carried == nullptr && collective_agreement_due(collective_agreement_mode(CollectiveAgreementMode::kOff))) {
      agreement =
          post_collective_agreement(*this, channel_, describe_collective(recorded), place);  // queued before the body
    }
    auto work = std::make_shared<MpiWork>(what, who_, peers_, place, options_.timeout, std::move(agreement), tensors);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) throw std::runtime_error(who_ + " " + what + ": the process group is shut down");
      queue_.push_back(Task{work, std::move(body), std::move(after)});
    }
    queue_cv_.notify_one();
    return work;
  }

  void run() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything queued has run
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      auto start = Clock::now();
      std::exception_ptr error;
      try {
        if (task.after) {
          wait_for_completion(task.after);
          start = Clock::now();  // waiting for it is not this group's communication
        }
        task.body();
      } catch (...) {
        error = std::current_exception();
      }
      auto busy = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      busy_nanoseconds_ += busy;
      task.work->finish(error, busy * 1e-9);
    }
  }

  MPI_Comm comm_;
  std::string name_;
  std::string channel_;  // the same on every rank for the same role (ProcessGroup::channel)
  int splits_ = 0;       // splits made from this group so far (names the next one's channel)
  ProcessGroupOptions options_;
  int rank_ = 0;
  int size_ = 1;
  std::string who_;
  std::string peers_;  // every other member of the group, as world ranks (peers_of)
  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::atomic<int64_t> busy_nanoseconds_{0};
  std::thread thread_;
};

std::weak_ptr<MpiProcessGroup> g_world;

void finalize_at_exit() {
  if (auto world = g_world.lock()) world->stop();
  if (!mpi_finalized()) MPI_Finalize();
}

}  // namespace

ProcessGroupPtr init_world(const ProcessGroupOptions& options) {
  static std::mutex init_mutex;
  static std::shared_ptr<MpiProcessGroup> world;  // keeps the world alive until exit
  std::lock_guard<std::mutex> lock(init_mutex);
  if (world) return world;

  LaunchInfo launch = launch_info_from_env();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      throw std::runtime_error("init_world: MPI_Init_thread failed");
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      throw std::runtime_error("init_world: this MPI grants thread level " + std::to_string(provided) +
                               ", fsdp.cpp needs MPI_THREAD_MULTIPLE (communication runs on its own thread)");
    }
    std::atexit(finalize_at_exit);
  }
  int mpi_rank = 0, mpi_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  if (mpi_rank != launch.rank || mpi_size != launch.world_size) {
    throw std::runtime_error("init_world: the launcher (" + launch.launcher + ") says rank " +
                             std::to_string(launch.rank) + " of " + std::to_string(launch.world_size) +
                             " but MPI says rank " + std::to_string(mpi_rank) + " of " + std::to_string(mpi_size) +
                             ": was the binary started by a different MPI's launcher?");
  }
  ProcessGroupOptions resolved = options;
  try {
    resolved.timeout = comm_timeout_from_env(options.timeout);
    resolved.wait = comm_wait_from_env(options.wait);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("init_world: ") + e.what());
  }
  if (g_watchdog == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &g_watchdog);
  world = std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD, "world", "world", resolved);
  g_world = world;
  return world;
}

}  // namespace fsdp::comm
