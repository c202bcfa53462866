// A collective that one rank never joins: the waiting rank must end the job with a message naming
// the operation and itself, instead of hanging. Run with FSDP_COMM_TIMEOUT_MS small; the CTest
// test passes when the message appears (the job exits non-zero by design).
#include <chrono>
#include <cstdio>
#include <thread>

#include "fsdp/comm/process_group.h"

int main() {
  auto world = fsdp::comm::init_world();
  if (world->rank() == 0) {
    world->barrier()->wait();  // rank 1.. sleep instead
    std::printf("unexpected: barrier completed\n");
    return 0;
  }
  // The other ranks never join: they sleep until rank 0's timeout ends the job.
  std::this_thread::sleep_for(std::chrono::minutes(5));
  std::printf("unexpected: not aborted\n");
  return 0;
}
