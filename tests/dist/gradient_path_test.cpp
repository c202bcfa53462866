// The gradient's way from autograd to the gradient shard, at N = 1 to 4 (issue 54, item 2: FSDP2's
// gradient path).
//
// What is measured: the elements the bookkeeping writes between backward's start and the shard
// gradient, by every aten::zero_, fill_, add_ and copy_ the test's thread runs outside the model's
// own backward nodes (autograd's AccumulateGrad counts: it is where gradients land) and outside
// the gathers, into a tensor the size of a parameter, a flat buffer or a shard (the engine's own
// sums of activation gradients, the residual stream's [4, 8, 30], are the model's). Collectives
// write their outputs by raw loops (MPI) and are not counted.
//   Before (a zeroed flat gradient whose views were each parameter's .grad): zeros, AccumulateGrad's
//   add into them, a cast copy for a reduce dtype, the reduced shard copied into shard_grad: 1.26-3
//   elements per gradient element (seen at N = 1 and 2).
//   Now: autograd's gradient is kept as it comes, cast once into the reduction's input (or, alone,
//   into the shard gradient), and the reduction writes the shard gradient itself: one.
// Inputs: the parity tests' TinyTransformer (vocabulary 61, padded buffers at 2-4 ranks), 6 blocks,
// one micro-batch, each strategy the world allows, fp32 and bf16 compute (fp32 reduction).
// Bound: the trainable flat buffers' padded size (each element once), plus 1% for what a kernel
// may touch twice, which the old path exceeds in every setting.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"
#include "tiny_transformer.h"

namespace gradient_path_test {

using fsdp::models::TinyConfig;
using fsdp::models::TinyTransformerImpl;
using fsdp::runtime::FsdpOptions;
using fsdp::runtime::ShardingStrategy;

// Elements written by the counted ops on this thread since the last reset. A thread-local stack of
// the scopes entered says whether an op runs inside a model's backward node or a gather.
struct WrittenElements {
  static int64_t& count() {
    static thread_local int64_t written = 0;
    return written;
  }
  static std::vector<bool>& excluded_scopes() {  // one entry per open scope: does it exclude?
    static thread_local std::vector<bool> stack;
    return stack;
  }
  // The numels of the gradient's tensors: each parameter's, each flat buffer's and its shard's.
  static std::set<int64_t>& gradient_sizes() {
    static thread_local std::set<int64_t> sizes;
    return sizes;
  }
  static bool inside_excluded() {
    for (bool excluded : excluded_scopes())
      if (excluded) return true;
    return false;
  }
  static bool excludes(const at::RecordFunction& fn) {
    const std::string name = fn.name();
    // A backward node, as the engine names it ("autograd::engine::evaluate_function: AddBackward0").
    if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION || name.find("evaluate_function") != std::string::npos)
      return name.find("AccumulateGrad") == std::string::npos;
    return name.rfind("fsdp::gather", 0) == 0 || name.rfind("fsdp::prefetch", 0) == 0 ||
           name.rfind("fsdp::wait_gather", 0) == 0;
  }
  static bool counted(const std::string& name) {
    return name == "aten::zero_" || name == "aten::fill_" || name == "aten::add_" || name == "aten::copy_";
  }
};

at::CallbackHandle count_written_elements() {
  return at::addThreadLocalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
            if (!WrittenElements::inside_excluded() && WrittenElements::counted(fn.name())) {
              const auto inputs = fn.inputs();
              if (!inputs.empty() && inputs[0].isTensor()) {
                const int64_t numel = inputs[0].toTensor().numel();
                if (WrittenElements::gradient_sizes().count(numel)) {
                  WrittenElements::count() += numel;
                }
              }
            }
            WrittenElements::excluded_scopes().push_back(WrittenElements::excludes(fn));
            return nullptr;
          },
          [](const at::RecordFunction&, at::ObserverContext*) { WrittenElements::excluded_scopes().pop_back(); })
          .needsInputs(true));
}

struct Setting {
  ShardingStrategy strategy;
  int64_t shard_group_size;
  at::ScalarType dtype;
};

std::vector<Setting> settings_for(int world) {
  std::vector<Setting> out;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    out.push_back({ShardingStrategy::FullShard, 0, dtype});
    out.push_back({ShardingStrategy::ShardGradOp, 0, dtype});
    if (dtype == at::kFloat) out.push_back({ShardingStrategy::NoShard, 0, dtype});  // no_shard keeps fp32
    if (world % 2 == 0) out.push_back({ShardingStrategy::HybridShard, world / 2, dtype});
  }
  return out;
}

TEST(GradientPath, EachGradientElementIsWrittenOnce) {
  const int world = fsdp::comm::init_world()->size();
  TinyConfig config;
  config.layers = 6;
  for (const Setting& setting : settings_for(world)) {
    SCOPED_TRACE(std::string(fsdp::runtime::to_string(setting.strategy)) + " " + c10::toString(setting.dtype));
    FsdpOptions options;
    options.strategy = setting.strategy;
    options.shard_group_size = setting.shard_group_size;
    options.param_dtype = setting.dtype;
    options.wrap_policy.module_types = {"AttentionMlpBlock"};
    torch::manual_seed(17);
    auto model = fsdp::runtime::build_fully_sharded<TinyTransformerImpl>(
        fsdp::comm::init_world(), options, [&] { return std::make_shared<TinyTransformerImpl>(config); });
    int64_t padded = 0;
    WrittenElements::gradient_sizes().clear();
    for (fsdp::shard::FlatParam* flat : model.state().flat_params()) {
      if (!flat->trainable()) continue;
      padded += flat->layout().padded_numel;
      WrittenElements::gradient_sizes().insert({flat->layout().padded_numel, flat->layout().shard_numel});
      for (const fsdp::shard::FlatEntry& entry : flat->layout().entries)
        WrittenElements::gradient_sizes().insert(entry.numel);
    }
    fsdp::optim::ShardedAdamW optimizer(model.state(), fsdp::optim::AdamWOptions{});
    for (int step = 0; step < 2; ++step) {  // the second step finds shard_grad allocated and zeroed
      optimizer.zero_grad();
      auto generator = at::detail::createCPUGenerator(300 + step * 8 + model.state().group()->rank());
      const at::Tensor ids = at::randint(config.vocab, {4, 9}, generator, at::kLong);
      const at::Tensor logits = model.forward(ids.narrow(1, 0, 8)).to(at::kFloat);
      const at::Tensor loss =
          torch::nn::functional::cross_entropy(logits.reshape({-1, config.vocab}), ids.narrow(1, 1, 8).reshape(-1));
      const auto handle = count_written_elements();
      WrittenElements::count() = 0;
      loss.backward();
      for (fsdp::shard::FlatParam* flat : model.state().flat_params()) {
        if (flat->trainable()) flat->wait_for_shard_grad();
      }
      at::removeCallback(handle);
      const int64_t written = WrittenElements::count();
      EXPECT_LE(written, padded + padded / 100)
          << "step " << step << ": " << written << " elements written for " << padded
          << " gradient elements (padded) between backward and the shard gradients";
      optimizer.step();
    }
  }
}

}  // namespace gradient_path_test
