// Module buffers under FSDP: a small CNN with BatchNorm on Fashion-MNIST at N = 1 to 4 against one
// process.
//
// Semantics (PyTorch DDP's broadcast_buffers): each rank normalises with its own batch's
// statistics, and after each training forward every rank takes rank 0's running statistics.
// Reference: one process that runs the N ranks' shares of each global batch one after another,
// each from the step's starting buffers, averages their gradients (each loss / N), and keeps the
// buffers the first share produced. Inputs: 8 steps of 24 test-split images (Debian's
// dataset-fashion-mnist), SGD with momentum 0.9, lr 0.05, no clipping.
// Tolerance 1e-5 on losses, parameters and buffers (only summation order differs); then every
// rank's evaluation-mode logits on 16 other images within 1e-4 of the reference's (they pass
// through two normalisations by those buffers, whose 1e-5 differences scale by up to 1/sqrt(var)).
// Without the broadcast, rank r > 0 keeps its own statistics and differs by ~1e-2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/comm/process_group.h"
#include "fsdp/data/fashion_mnist.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"

namespace buffers_test {

constexpr int kSteps = 8;
constexpr int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3 and 4 ranks
constexpr double kTolerance = 1e-5;

struct ConvBnBlockImpl : torch::nn::Module {
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
  ConvBnBlockImpl(int64_t in, int64_t out) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    norm = register_module("norm", torch::nn::BatchNorm2d(out));
  }
  // Smooth (tanh, average pooling): ReLU's and max pooling's ties would turn the ulp differences
  // of a summation order into different routes for the gradient.
  at::Tensor forward(const at::Tensor& x) { return torch::avg_pool2d(torch::tanh(norm(conv(x))), 2); }
};
TORCH_MODULE(ConvBnBlock);

struct BnCnnImpl : torch::nn::Module {
  torch::nn::ModuleList blocks;
  torch::nn::Linear head{nullptr};
  BnCnnImpl() {
    blocks = register_module("blocks", torch::nn::ModuleList());
    fsdp::nn::push_block(blocks, ConvBnBlock(1, 8));
    fsdp::nn::push_block(blocks, ConvBnBlock(8, 16));
    head = register_module("head", torch::nn::Linear(16 * 7 * 7, 10));
  }
  at::Tensor forward(const at::Tensor& images) {
    at::Tensor x = images;
    for (size_t i = 0; i < blocks->size(); ++i) x = fsdp::nn::call(blocks->ptr<ConvBnBlockImpl>(i), x);
    return head(x.flatten(1));
  }
};
TORCH_MODULE(BnCnn);

const fsdp::data::ImageSet& images() {
  static const fsdp::data::ImageSet set = fsdp::data::load_fashion_mnist(fsdp::data::kFashionMnistDir, "test");
  return set;
}

struct Result {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params, buffers;
  at::Tensor eval_logits;
};

at::Tensor eval_logits(torch::nn::Module& module, const std::function<at::Tensor(const at::Tensor&)>& forward) {
  torch::NoGradGuard no_grad;
  module.eval();
  at::Tensor logits = forward(images().images(5000, 16));
  module.train();
  return logits;
}

std::map<std::string, at::Tensor> buffers_of(torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : module.named_buffers()) out[item.key()] = item.value().detach().clone();
  return out;
}

Result run_reference(int ranks) {
  torch::manual_seed(11);
  BnCnn model;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const int64_t local = kGlobalBatch / ranks;
  Result out;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const auto start = buffers_of(*model);
    std::map<std::string, at::Tensor> first_share;
    double loss_sum = 0;
    for (int r = 0; r < ranks; ++r) {
      {
        torch::NoGradGuard no_grad;
        for (auto& item : model->named_buffers()) item.value().copy_(start.at(item.key()));
      }
      const int64_t begin = step * kGlobalBatch + r * local;
      auto loss = torch::nn::functional::cross_entropy(model->forward(images().images(begin, local)),
                                                       images().labels.narrow(0, begin, local));
      (loss / ranks).backward();
      loss_sum += loss.item<double>();
      if (r == 0) first_share = buffers_of(*model);
    }
    {
      torch::NoGradGuard no_grad;
      for (auto& item : model->named_buffers()) item.value().copy_(first_share.at(item.key()));
    }
    optimizer.step();
    out.losses.push_back(loss_sum / ranks);
  }
  for (const auto& item : model->named_parameters()) out.params[item.key()] = item.value().detach().clone();
  out.buffers = buffers_of(*model);
  out.eval_logits = eval_logits(*model, [&](const at::Tensor& x) { return model->forward(x); });
  return out;
}

Result run_fsdp() {
  auto world = fsdp::comm::init_world();
  fsdp::runtime::FsdpOptions options;
  options.wrap_policy.module_types = {"ConvBnBlock"};
  torch::manual_seed(11);
  auto model =
      fsdp::runtime::build_fully_sharded<BnCnnImpl>(world, options, [] { return std::make_shared<BnCnnImpl>(); });
  fsdp::optim::SgdOptions sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 0;
  fsdp::optim::ShardedSgd optimizer(model.state(), sgd);
  const int64_t local = kGlobalBatch / world->size();
  Result out;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const int64_t begin = step * kGlobalBatch + world->rank() * local;
    auto loss = torch::nn::functional::cross_entropy(model.forward(images().images(begin, local)),
                                                     images().labels.narrow(0, begin, local));
    loss.backward();
    optimizer.step();
    at::Tensor global = at::tensor({loss.item<double>()}, at::kDouble);
    world->all_reduce(global, fsdp::comm::ReduceOp::Average)->wait();
    out.losses.push_back(global.item<double>());
  }
  for (auto& [name, tensor] : model.state().full_parameters()) out.params[name] = tensor;
  out.buffers = buffers_of(*model.module());
  out.eval_logits = eval_logits(*model.module(), [&](const at::Tensor& x) { return model.forward(x); });
  return out;
}

TEST(Buffers, BatchNormTrainsLikeOneProcessAndStaysEqualOnEveryRank) {
  const int n = fsdp::comm::init_world()->size();
  const Result reference = run_reference(n);
  const Result sharded = run_fsdp();
  const int rank = fsdp::comm::init_world()->rank();
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(sharded.losses[step], reference.losses[step], kTolerance) << "step " << step;
  }
  ASSERT_EQ(sharded.params.size(), reference.params.size());
  for (const auto& [name, expected] : reference.params) {
    EXPECT_LE((sharded.params.at(name) - expected).abs().max().item<double>(), kTolerance) << name;
  }
  ASSERT_EQ(sharded.buffers.size(), 6u) << "two BatchNorms: running_mean, running_var, num_batches_tracked";
  for (const auto& [name, expected] : reference.buffers) {
    EXPECT_LE((sharded.buffers.at(name).to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>(),
              kTolerance)
        << "rank " << rank << " buffer " << name;
  }
  EXPECT_LE((sharded.eval_logits - reference.eval_logits).abs().max().item<double>(), 1e-4) << "rank " << rank;
  EXPECT_LT(reference.losses.back(), reference.losses.front()) << "the loss should fall";
}

}  // namespace buffers_test
