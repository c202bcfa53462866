// Building a model too large for one rank: with build_fully_sharded, each block is sharded as soon
// as it is built, so no rank ever holds the whole model. Run at 4 ranks with a model of ~1.07 B
// parameters (4.3 GB fp32, 64 blocks of two 4096 x 2048 linears): peak resident memory growth on
// each rank must stay under a quarter of the model plus three units (the block being built, its
// flat copy, and allocator slack), far below the 4.3 GB an unsharded build needs.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fully_shard.h"
#include "process_memory.h"

namespace construct_large_main {

struct BigBlockImpl : torch::nn::Module {
  torch::nn::Linear up{nullptr}, down{nullptr};
  BigBlockImpl() {
    up = register_module("up", torch::nn::Linear(torch::nn::LinearOptions(2048, 4096).bias(false)));
    down = register_module("down", torch::nn::Linear(torch::nn::LinearOptions(4096, 2048).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return x + down(torch::relu(up(x))); }
};
TORCH_MODULE(BigBlock);

struct BigModelImpl : torch::nn::Module {
  torch::nn::ModuleList blocks;
  torch::nn::Linear head{nullptr};
  explicit BigModelImpl(int layers) {
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < layers; ++i) fsdp::nn::push_block(blocks, BigBlock());
    head = register_module("head", torch::nn::Linear(2048, 16));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < blocks->size(); ++i) x = fsdp::nn::call(blocks->ptr<BigBlockImpl>(i), x);
    return head(x);
  }
};

}  // namespace construct_large_main
using namespace construct_large_main;  // (helpers above, used below)

int main() {
  torch::set_num_threads(1);
  auto world = fsdp::comm::init_world();
  const int64_t baseline = fsdp::testing::status_bytes("VmRSS:");
  fsdp::runtime::FsdpOptions options;
  options.wrap_policy.module_types = {"BigBlock"};
  torch::manual_seed(0);
  auto model = fsdp::runtime::build_fully_sharded<BigModelImpl>(world, options,
                                                                [] { return std::make_shared<BigModelImpl>(64); });
  const int64_t peak = fsdp::testing::status_bytes("VmHWM:");
  auto stats = model.state().memory_stats();
  const int64_t model_bytes = stats.unsharded_param_bytes;
  const int64_t bound = model_bytes / world->size() + 3 * stats.largest_unit_bytes;
  // A forward to show the sharded model works.
  auto out = model.forward(torch::randn({1, 2048}));
  const bool finite = torch::isfinite(out).all().item<bool>();
  at::Tensor worst = at::tensor({peak - baseline}, at::kLong);
  world->all_reduce(worst, fsdp::comm::ReduceOp::Max)->wait();
  if (world->rank() == 0) {
    std::printf(
        "model %.2f GB (%lld parameters) at %d ranks: worst rank's peak growth while building %.2f GB, "
        "bound %.2f GB (1/%d of the model + 3 units), unsharded build would need %.2f GB\n",
        model_bytes / 1e9, static_cast<long long>(model_bytes / 4), world->size(), worst.item<int64_t>() / 1e9,
        bound / 1e9, world->size(), model_bytes / 1e9);
  }
  const bool ok = worst.item<int64_t>() <= bound && finite;
  if (world->rank() == 0) std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
