// The staged group's CUDA copies in a build without CUDA (FSDP_CUDA=OFF, the default): refused by name.
#include <stdexcept>

#include "staging_copies.h"

namespace fsdp::comm {

std::unique_ptr<StagingCopies> make_cuda_staging_copies(at::Device device) {
  throw std::runtime_error("staged group on " + device.str() +
                           ": this build has no CUDA support; configure with "
                           "-DFSDP_CUDA=ON against a CUDA libtorch (see docs/gpu.md)");
}

}  // namespace fsdp::comm
