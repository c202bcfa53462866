// examples/custom_loop.cpp: a training loop of your own, without fsdp.cpp's trainer: gradient
// accumulation (the gradient reduced once per step with no_sync), global-norm clipping, a
// non-finite step skipped, bf16 mixed precision, and prefetching under a memory budget.
//
//   mpirun -np 2 ./custom_loop [--fp32]
//
// Prints the loss of each step (it falls) and the runtime's memory and communication figures.
#include <fsdp/comm/process_group.h>
#include <fsdp/optim/lr_schedule.h>
#include <fsdp/optim/nonfinite_guard.h>
#include <fsdp/optim/sharded_optimizer.h>
#include <fsdp/runtime/fully_shard.h>

#include <cstdio>
#include <string>

#include "residual_mlp.h"

int main(int argc, char** argv) {
  try {
    const bool fp32 = argc > 1 && std::string(argv[1]) == "--fp32";
    auto world = fsdp::comm::init_world();

    fsdp::runtime::FsdpOptions options;
    options.wrap_policy.module_types = {"ResidualBlock"};
    options.max_inflight = 2;                        // up to 2 blocks gathered ahead, or reductions in flight
    if (!fp32) options.param_dtype = at::kBFloat16;  // fp32 master shards, bf16 compute
    torch::manual_seed(0);
    // Sharded block by block while it is built: no rank ever holds the whole model.
    auto model = fsdp::runtime::build_fully_sharded<ResidualMlpImpl>(
        world, options, [] { return std::make_shared<ResidualMlpImpl>(8, 64, 6); });

    fsdp::optim::AdamWOptions adamw;
    adamw.lr = 3e-3;
    fsdp::optim::ShardedAdamW optimizer(model.state(), adamw);
    const int steps = 20, micro_batches = 4;
    fsdp::optim::WarmupCosineSchedule schedule{3e-3, 3e-4, 3, steps};
    fsdp::optim::NonFiniteStepGuard guard(/*max_consecutive=*/3);
    const int64_t rows = 16;  // per rank per micro-batch

    for (int step = 0; step < steps; ++step) {
      optimizer.set_lr(schedule.lr_at(step));
      optimizer.zero_grad();
      double step_loss = 0;
      for (int m = 0; m < micro_batches; ++m) {
        // Reduce once, on the last micro-batch: the others keep unsharded gradients (more memory,
        // less communication). Leave it true to reduce every micro-batch into the shards.
        model.state().set_requires_gradient_sync(m == micro_batches - 1);
        auto [x, y] = batch_of_step(step * 1000 + m * world->size() + world->rank(), rows);
        // The model computes in bf16; the loss in fp32.
        auto loss = torch::mse_loss(model.forward(x).to(at::kFloat), y) / micro_batches;
        loss.backward();
        step_loss += loss.item<double>();
      }
      const double norm = fsdp::optim::clip_grad_norm(model.state(), 1.0);  // collective
      const bool stepped = guard.should_step(norm, step);                   // the same decision on every rank
      if (stepped) optimizer.step();
      at::Tensor global = at::tensor({step_loss}, at::kDouble);
      world->all_reduce(global, fsdp::comm::ReduceOp::Average)->wait();
      if (world->rank() == 0) {
        std::printf("step %2d loss %.5f grad norm %.4f%s\n", step, global.item<double>(), norm,
                    stepped ? "" : " (skipped: not finite)");
      }
    }
    const auto memory = model.state().memory_stats();
    const auto comm = model.state().comm_stats();
    if (world->rank() == 0) {
      std::printf(
          "rank 0: shards %lld B, peak gathered %lld B (largest unit %lld B); %lld gathers (%lld prefetched), "
          "%lld reductions, %.3f s exposed communication\n",
          static_cast<long long>(memory.sharded_param_bytes), static_cast<long long>(memory.peak_gathered_bytes),
          static_cast<long long>(memory.largest_unit_bytes), static_cast<long long>(comm.gathers),
          static_cast<long long>(comm.prefetched_gathers), static_cast<long long>(comm.reductions),
          comm.exposed_seconds);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_loop: %s\n", e.what());
    return 1;
  }
}
