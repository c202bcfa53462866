// The staged test backend of ProcessGroup (see fsdp/comm/staged_process_group.h).
#include "fsdp/comm/staged_process_group.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp/comm/collective_agreement.h"
#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/in_flight_storage.h"
#include "staging_copies.h"

namespace fsdp::comm {
namespace {

// One collective: its host collective over the staging buffers, and the copy back that wait()
// runs once that completed (the output is written then, and only then).
class StagedWork final : public Work {
 public:
  StagedWork(const std::string& description, std::shared_ptr<PendingAgreement> agreement,
             const std::vector<at::Tensor>& tensors)
      : agreement_(std::move(agreement)), in_flight_(tensors, description) {}

  void start(WorkPtr host_work, std::function<void()> copy_back) {
    host_work_ = std::move(host_work);
    copy_back_ = std::move(copy_back);
  }

  void wait() override {
    std::call_once(finished_, [this] {
      if (agreement_) check_collective_agreement(*agreement_);  // before the result is used
      host_work_->wait();
      if (copy_back_) copy_back_();
      copy_back_ = nullptr;  // lets go of the staging buffers and the output
      in_flight_.release();  // the caller's stream is ordered after the copy back
      done_ = true;
    });
  }

  bool is_completed() override { return done_ || host_work_->is_completed(); }
  double busy_seconds() const override { return host_work_->busy_seconds(); }

 private:
  std::shared_ptr<PendingAgreement> agreement_;
  InFlightStorage in_flight_;  // the caller's tensors, until the copy back is queued
  WorkPtr host_work_;
  std::function<void()> copy_back_;
  std::once_flag finished_;
  std::atomic<bool> done_{false};
};

class StagedProcessGroup final : public ProcessGroup {
 public:
  StagedProcessGroup(ProcessGroupPtr bootstrap, at::Device device, ProcessGroupOptions options)
      : bootstrap_(std::move(bootstrap)), device_(device), options_(options), copies_(make_staging_copies(device)) {
    // The staging buffers' collectives get an MPI communicator (and thread) of their own: issued
    // in this group's order, never interleaved with what the caller runs on the bootstrap group.
    data_ = bootstrap_->split(0, bootstrap_->rank());
    who_ = "[fsdp staged group " + bootstrap_->name() + " rank " + std::to_string(rank()) + "/" +
           std::to_string(size()) + ", " + device_.str() + "]";
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  std::string name() const override { return bootstrap_->name() + "/staged"; }
  std::string channel() const override { return bootstrap_->channel() + "/staged"; }
  at::DeviceType device_type() const override { return device_.type(); }
  bool needs_one_issue_order() const override { return true; }  // as NCCL
  double communication_seconds() const override { return data_->communication_seconds(); }

  WorkPtr all_gather(const at::Tensor& output, const at::Tensor& input) override {
    if (on_host(output, input)) return bootstrap_->all_gather(output, input);
    check_all_gather_args(*this, output, input);
    check_device(output, "all_gather");
    check_device(input, "all_gather");
    const std::string what = "all_gather(" + std::to_string(input.numel()) + " x " + std::to_string(size()) + " " +
                             c10::toString(input.scalar_type()) + ")";
    const at::Tensor staged_in = stage(input), staged_out = copies_->host_buffer(output);
    return issue(
        what, {output, input}, [&] { return data_->all_gather(staged_out, staged_in); }, copy_back(output, staged_out));
  }

  WorkPtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    if (on_host(output, input)) return bootstrap_->reduce_scatter(output, input, op);
    check_reduce_scatter_args(*this, output, input, op);
    check_device(output, "reduce_scatter");
    check_device(input, "reduce_scatter");
    const std::string what = std::string("reduce_scatter(") + to_string(op) + ", " + std::to_string(output.numel()) +
                             " x " + std::to_string(size()) + " " + c10::toString(input.scalar_type()) + ")";
    const at::Tensor staged_in = stage(input), staged_out = copies_->host_buffer(output);
    return issue(
        what, {output, input}, [&] { return data_->reduce_scatter(staged_out, staged_in, op); },
        copy_back(output, staged_out));
  }

  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    if (on_host(tensor, tensor)) return bootstrap_->all_reduce(tensor, op);
    check_all_reduce_args(*this, tensor, op);
    check_device(tensor, "all_reduce");
    const std::string what = std::string("all_reduce(") + to_string(op) + ", " + std::to_string(tensor.numel()) + " " +
                             c10::toString(tensor.scalar_type()) + ")";
    const at::Tensor staged = stage(tensor);
    return issue(
        what, {tensor}, [&] { return data_->all_reduce(staged, op); }, copy_back(tensor, staged));
  }

  WorkPtr broadcast(const at::Tensor& tensor, int root) override {
    if (on_host(tensor, tensor)) return bootstrap_->broadcast(tensor, root);
    check_broadcast_args(*this, tensor, root);
    check_device(tensor, "broadcast");
    const std::string what = "broadcast(" + std::to_string(tensor.numel()) + " " + c10::toString(tensor.scalar_type()) +
                             " from rank " + std::to_string(root) + ")";
    const at::Tensor staged = stage(tensor);
    return issue(
        what, {tensor}, [&] { return data_->broadcast(staged, root); }, copy_back(tensor, staged));
  }

  // Host-blocking, as the contract says: the caller's queued work and this group's earlier
  // collectives finish (the data communicator runs them in order), then the ranks meet.
  WorkPtr barrier() override {
    copies_->synchronize();
    return issue(
        "barrier", {}, [&] { return data_->barrier(); }, nullptr);
  }

  // Split through the bootstrap group (same colors and keys), then a staged group over each part.
  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    ProcessGroupPtr part = bootstrap_->split(color, key);
    if (!part) return nullptr;
    return std::make_shared<StagedProcessGroup>(part, device_, options_);
  }

  [[noreturn]] void abort(const std::string& why) override {
    bootstrap_->abort(who_ + " " + why);
    std::abort();  // not reached: the bootstrap's abort ends the process
  }

 private:
  // On a CUDA group, host tensors (control: losses, flags) go through the bootstrap group, as on
  // NCCL's. On the CPU every tensor is the device's.
  bool on_host(const at::Tensor& a, const at::Tensor& b) const {
    return device_.is_cuda() && a.defined() && b.defined() && a.device().is_cpu() && b.device().is_cpu();
  }

  void check_device(const at::Tensor& t, const char* op) const {
    if (t.device().type() != device_.type() || (device_.has_index() && t.device().index() != device_.index())) {
      throw std::invalid_argument(who_ + " " + op + ": the tensor is on " + t.device().str() +
                                  ", this group's device is " + device_.str());
    }
  }

  at::Tensor stage(const at::Tensor& device_tensor) {
    at::Tensor host = copies_->host_buffer(device_tensor);
    copies_->to_host(host, device_tensor);
    return host;
  }

  std::function<void()> copy_back(const at::Tensor& device_tensor, const at::Tensor& host) {
    StagingCopies* copies = copies_.get();
    return [copies, device_tensor, host] { copies->to_device(device_tensor, host); };
  }

  // Records the collective on this group's channel, posts its agreement while due (over the
  // bootstrap group, as NCCL's), then starts the host collective, which carries it unrecorded.
  WorkPtr issue(const std::string& what, const std::vector<at::Tensor>& tensors,
                const std::function<WorkPtr()>& start_host, std::function<void()> back) {
    const std::string place = record_collective(channel(), what);
    const std::string description = who_ + " " + what + " [" + place + "]";
    std::shared_ptr<PendingAgreement> agreement;
    if (collective_agreement_due(collective_agreement_mode(CollectiveAgreementMode::kFirstStep))) {
      agreement = post_collective_agreement(*bootstrap_, channel(), describe_collective(what), place);
    }
    auto work = std::make_shared<StagedWork>(description, std::move(agreement), tensors);
    CarriedCollectives carried(place);
    work->start(start_host(), std::move(back));
    return work;
  }

  ProcessGroupPtr bootstrap_;
  at::Device device_;
  ProcessGroupOptions options_;
  std::unique_ptr<StagingCopies> copies_;
  ProcessGroupPtr data_;  // the staging buffers' collectives (a split of bootstrap_ with every rank)
  std::string who_;
};

// Plain host copies: CPU tensors stand in for device memory.
class HostStagingCopies final : public StagingCopies {
 public:
  at::Tensor host_buffer(const at::Tensor& like) const override {
    return at::empty_like(like, at::MemoryFormat::Contiguous);
  }
  void to_host(const at::Tensor& host, const at::Tensor& device) override { host.copy_(device); }
  void to_device(const at::Tensor& device, const at::Tensor& host) override { device.copy_(host); }
  void synchronize() override {}
};

}  // namespace

std::unique_ptr<StagingCopies> make_staging_copies(at::Device device) {
  if (device.is_cpu()) return std::make_unique<HostStagingCopies>();
  if (device.is_cuda()) return make_cuda_staging_copies(device);
  throw std::invalid_argument("staged group: no staging copies for device " + device.str() + " (cpu or cuda)");
}

ProcessGroupPtr make_staged_group(const ProcessGroupPtr& bootstrap, at::Device device,
                                  const ProcessGroupOptions& options) {
  if (!bootstrap) throw std::invalid_argument("make_staged_group: no bootstrap group");
  ProcessGroupOptions resolved = options;
  resolved.timeout = comm_timeout_from_env(options.timeout);
  return std::make_shared<StagedProcessGroup>(bootstrap, device, resolved);
}

}  // namespace fsdp::comm
