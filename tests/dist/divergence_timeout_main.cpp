// Ranks waiting in different collectives that can never pair: rank 0 in a barrier of the world,
// the others in a barrier of a group split from it (another communicator). Every rank times out,
// and each message must list where every rank waits, so one message shows both sides. Run with
// FSDP_COMM_TIMEOUT_MS small; the job exits non-zero by design (the CTest test matches the lines).
#include <ATen/ATen.h>

#include <cstdio>

#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/process_group.h"

int main() {
  auto world = fsdp::comm::init_world();
  auto everyone = world->split(0, world->rank());  // the same ranks, another communicator
  fsdp::comm::begin_collective_step(3);
  {
    const fsdp::comm::CollectiveLabel label("unit 'blocks.1'");
    world->all_reduce(at::ones({4}), fsdp::comm::ReduceOp::Sum)->wait();  // the ranks agree up to here
  }
  if (world->rank() == 0) {
    const fsdp::comm::CollectiveLabel label("unit 'blocks.2'");
    world->barrier()->wait();
  } else {
    const fsdp::comm::CollectiveLabel label("unit 'head'");
    everyone->barrier()->wait();
  }
  std::printf("unexpected: the barriers completed\n");
  return 0;
}
