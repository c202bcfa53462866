// train.attention_kernel = "auto" on a GPU: every rank times CUDA's attention kernels at start and
// all take rank 0's timings, so that all ranks prefer the same kernel and compute alike
// (fsdp/train/attention_kernel_choice.h). The agreement, on the CPU: each rank brings timings of
// its own in which a different kernel is the fastest (rank 0 one kernel fewer); every rank ends
// with rank 0's list and rank 0's fastest. A rank keeping its own timings fails at N >= 2 (seen).
// And the fastest is the fastest whose result was right.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/train/attention_kernel_choice.h"

namespace attention_kernel_agreement_test {

using fsdp::models::AttentionKernel;
using fsdp::models::AttentionKernelTiming;

TEST(AttentionKernelChoice, EveryRankTakesRankZerosTimings) {
  auto world = fsdp::comm::init_world();
  const int rank = world->rank();
  // Rank 0: cudnn fastest, efficient not timed. Others: flash fastest, all three timed.
  std::vector<AttentionKernelTiming> mine;
  if (rank == 0) {
    mine = {{AttentionKernel::Flash, 3e-3}, {AttentionKernel::Cudnn, 2e-3}};
  } else {
    mine = {{AttentionKernel::Flash, 1e-3 * rank}, {AttentionKernel::Cudnn, 9e-3}, {AttentionKernel::Efficient, 8e-3}};
  }
  const std::vector<AttentionKernelTiming> agreed = fsdp::train::rank0_attention_timings(mine, world);
  ASSERT_EQ(agreed.size(), 2u) << "rank " << rank;
  EXPECT_EQ(agreed[0].kernel, AttentionKernel::Flash);
  EXPECT_DOUBLE_EQ(agreed[0].seconds, 3e-3);
  EXPECT_EQ(agreed[1].kernel, AttentionKernel::Cudnn);
  EXPECT_DOUBLE_EQ(agreed[1].seconds, 2e-3);
  EXPECT_EQ(fsdp::train::fastest_attention_kernel(agreed), AttentionKernel::Cudnn) << "rank " << rank;
  // A kernel whose result was wrong is timed +inf: never the fastest; none right, none chosen.
  const double wrong = std::numeric_limits<double>::infinity();
  EXPECT_EQ(fsdp::train::fastest_attention_kernel({{AttentionKernel::Cudnn, wrong}, {AttentionKernel::Flash, 5e-3}}),
            AttentionKernel::Flash);
  EXPECT_FALSE(fsdp::train::fastest_attention_kernel({{AttentionKernel::Cudnn, wrong}}).has_value());
  EXPECT_FALSE(fsdp::train::fastest_attention_kernel({}).has_value());
}

}  // namespace attention_kernel_agreement_test
