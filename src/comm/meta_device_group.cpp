#include "fsdp/comm/meta_device_group.h"

#include "fsdp/compat.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace fsdp::comm {
namespace {

class MetaDeviceGroup final : public ProcessGroup {
 public:
  explicit MetaDeviceGroup(ProcessGroupPtr bootstrap) : bootstrap_(std::move(bootstrap)) {}

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  std::string name() const override { return bootstrap_->name() + "/meta"; }
  std::string channel() const override { return bootstrap_->channel() + "/meta"; }
  at::DeviceType device_type() const override { return at::kMeta; }

  WorkPtr all_gather(const at::Tensor& output, const at::Tensor& input) override {
    if (!is_meta(output, input)) return host()->all_gather(output, input);
    check_sizes("all_gather", output, input, output.numel() == input.numel() * size());
    return done();
  }
  WorkPtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    if (!is_meta(output, input)) return host()->reduce_scatter(output, input, op);
    check_sizes("reduce_scatter", output, input, input.numel() == output.numel() * size());
    return done();
  }
  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    return tensor.is_meta() ? done() : host()->all_reduce(tensor, op);
  }
  WorkPtr broadcast(const at::Tensor& tensor, int root) override {
    return tensor.is_meta() ? done() : host()->broadcast(tensor, root);
  }
  WorkPtr barrier() override { return host()->barrier(); }
  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    ProcessGroupPtr part = host()->split(color, key);
    return part ? std::make_shared<MetaDeviceGroup>(std::move(part)) : nullptr;
  }
  [[noreturn]] void abort(const std::string& why) override {
    bootstrap_->abort(why);
    std::abort();  // not reached: the bootstrap group ends the job
  }
  double communication_seconds() const override { return bootstrap_->communication_seconds(); }

 private:
  // Both meta, or both host tensors for the bootstrap group; one of each is a mistake.
  bool is_meta(const at::Tensor& output, const at::Tensor& input) const {
    if (output.is_meta() != input.is_meta()) {
      throw std::invalid_argument("meta device group (" + name() + "): a collective between a meta tensor and a " +
                                  (output.is_meta() ? input : output).device().str() + " tensor");
    }
    return output.is_meta();
  }
  void check_sizes(const char* what, const at::Tensor& output, const at::Tensor& input, bool consistent) const {
    if (consistent && output.scalar_type() == input.scalar_type()) return;
    throw std::invalid_argument(std::string("meta device group (") + name() + "): " + what + " of " +
                                std::to_string(input.numel()) + " " + c10::toString(input.scalar_type()) +
                                " values into " + std::to_string(output.numel()) + " " +
                                c10::toString(output.scalar_type()) + " over " + std::to_string(size()) + " ranks");
  }
  static WorkPtr done() { return completed_work(); }
  // The bootstrap group, called with the thread's own dispatch keys: the tensors MPI's side makes
  // for itself (a split's agreement) are the CPU's, not meta.
  struct Host {
    compat::OutsideMetaDeviceConstruction outside;
    ProcessGroup& group;
    ProcessGroup* operator->() { return &group; }
  };
  Host host() const { return Host{{}, *bootstrap_}; }

  ProcessGroupPtr bootstrap_;
};

}  // namespace

ProcessGroupPtr make_meta_device_group(const ProcessGroupPtr& bootstrap) {
  if (!bootstrap) throw std::invalid_argument("make_meta_device_group: the bootstrap group is null");
  return std::make_shared<MetaDeviceGroup>(bootstrap);
}

}  // namespace fsdp::comm
