// main() for multi-rank GoogleTest binaries: every rank runs every test; the process group is the
// world. Only rank 0 prints the usual progress; other ranks print failures only.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/comm/process_group.h"

namespace dist_main {
class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
    }
  }

 private:
  int rank_;
};
}  // namespace dist_main
using namespace dist_main;  // (helpers above, used below)

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);  // ranks share 2 cores in CI
  auto world = fsdp::comm::init_world();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(world->rank()));
  }
  int failed = RUN_ALL_TESTS();
  // Every rank reports the job's verdict.
  at::Tensor verdict = at::tensor({static_cast<int64_t>(failed)}, at::kLong);
  world->all_reduce(verdict, fsdp::comm::ReduceOp::Max)->wait();
  return verdict.item<int64_t>() != 0 ? 1 : 0;
}
