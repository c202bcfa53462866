// What a parity test compares: a run's losses, gradient norms and final parameters, the reference
// (one process, libtorch's optimizer) against FSDP; and the reference's SGD, grouped as the
// sharded SGD applies weight decay (matrices decayed, vectors not; frozen parameters left out).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fsdp_test {

struct Trajectory {
  std::vector<double> losses, grad_norms;
  std::map<std::string, at::Tensor> params;
};

// Every step's loss within `tolerance`, its gradient norm within `tolerance` relative (absolute
// below 1), every parameter (by name, same shape) within `tolerance`.
inline void expect_same_trajectory(const Trajectory& reference, const Trajectory& sharded, double tolerance) {
  ASSERT_EQ(sharded.losses.size(), reference.losses.size());
  for (size_t step = 0; step < reference.losses.size(); ++step) {
    EXPECT_NEAR(sharded.losses[step], reference.losses[step], tolerance) << "step " << step;
    EXPECT_NEAR(sharded.grad_norms[step], reference.grad_norms[step],
                tolerance * std::max(1.0, reference.grad_norms[step]))
        << "step " << step;
  }
  ASSERT_EQ(sharded.params.size(), reference.params.size());
  for (const auto& [name, expected] : reference.params) {
    auto found = sharded.params.find(name);
    ASSERT_NE(found, sharded.params.end()) << "missing parameter " << name;
    ASSERT_EQ(found->second.sizes(), expected.sizes()) << name;
    EXPECT_LE((found->second - expected).abs().max().item<double>(), tolerance) << name;
  }
}

// SGD with momentum 0.9 and weight decay on the trainable matrices only (fsdp::optim::ShardedSgd's
// grouping, which decays parameters of two or more dimensions).
inline std::unique_ptr<torch::optim::SGD> reference_sgd(torch::nn::Module& module, double lr, double weight_decay) {
  std::vector<at::Tensor> decay, no_decay;
  for (auto& p : module.parameters()) {
    if (p.requires_grad()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  auto options = torch::optim::SGDOptions(lr).momentum(0.9);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(options.weight_decay(weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::SGDOptions>(options.weight_decay(0.0)));
  return std::make_unique<torch::optim::SGD>(groups, options);
}

}  // namespace fsdp_test
