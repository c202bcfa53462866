#include "bf16_matmul_choice.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "fsdp/comm/agreement.h"
#include "fsdp/runtime/cpu_features.h"

namespace fsdp::train {

std::optional<models::Bf16MatmulTimes> choose_bf16_matmul_by_timing(torch::nn::Module& model, int64_t rows,
                                                                    const comm::ProcessGroupPtr& world) {
  const int n = world->size();
  at::Tensor with_instructions = at::tensor({runtime::cpu_has_bf16_instructions() ? 1.0 : 0.0}, at::kDouble);
  if (n > 1) world->all_reduce(with_instructions, comm::ReduceOp::Sum)->wait();
  if (with_instructions.item<double>() < n) return std::nullopt;
  rows = std::min<int64_t>(4096, std::max<int64_t>(1, rows));
  // Each 2-D parameter's GEMM once, at most 2^30 multiply-adds each way (fewer rows for a wide
  // one), leaving out those over 2^26 elements (a large vocabulary's embedding and head: their
  // fp32 copies alone would take gigabytes).
  std::vector<models::LinearShape> shapes;
  for (const auto& named : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = named.value();
    if (p.dim() != 2 || p.numel() > (int64_t{1} << 26)) continue;
    const int64_t shape_rows = std::max<int64_t>(16, std::min<int64_t>(rows, (int64_t{1} << 30) / p.numel()));
    const models::LinearShape shape{shape_rows, p.size(1), p.size(0)};
    const bool seen = std::any_of(shapes.begin(), shapes.end(),
                                  [&](const models::LinearShape& s) { return s.in == shape.in && s.out == shape.out; });
    if (!seen) shapes.push_back(shape);
  }
  if (shapes.empty()) return std::nullopt;
  models::Bf16MatmulTimes times;
  comm::on_every_rank(world, "timing bf16 GEMMs (train.bf16_matmul = auto)",
                      [&] { times = models::time_bf16_matmuls(shapes); });
  at::Tensor measured = at::tensor({times.native_seconds, times.fp32_seconds}, at::kDouble);
  if (n > 1) world->broadcast(measured, 0)->wait();
  times = {measured[0].item<double>(), measured[1].item<double>()};
  models::set_bf16_matmul(times.faster());
  return times;
}

}  // namespace fsdp::train
