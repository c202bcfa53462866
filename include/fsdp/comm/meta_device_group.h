// fsdp/comm/meta_device_group.h: collectives over meta tensors, for a model constructed on the meta
// device (compat::MetaDeviceConstruction): fsdp-train --check builds and shards a config's model at
// its real size, on every rank of the job, without memory or values.
//
// A meta tensor has a shape and a dtype and nothing else, so a collective over meta tensors has
// nothing to move: it checks what it can check on this rank (the output's size against the
// input's and the group's, one dtype) and completes at once. While the model is constructed on
// the meta device every tensor made is meta, flags included; a CPU tensor made before (or outside
// the construction) goes to the bootstrap group, as beside any device group. A split splits the
// bootstrap group (collective, with the thread's own dispatch keys: compat::
// OutsideMetaDeviceConstruction) and wraps its result, so hybrid sharding's groups are real.
#pragma once

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

// Chosen by make_device_group for at::kMeta (device_group.h).
ProcessGroupPtr make_meta_device_group(const ProcessGroupPtr& bootstrap);

}  // namespace fsdp::comm
