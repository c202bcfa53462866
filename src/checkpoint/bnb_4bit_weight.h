// A weight that transformers saved 4-bit through bitsandbytes (Linear4bit's state dict), read as
// the NF4 it is, without requantizing: the tensors beside `name` are
//   name                                   uint8 [ceil(numel / 2), 1]: the packed codes
//   name.absmax                            uint8 [blocks] (double quantization) or fp32 [blocks]
//   name.quant_map                         fp32 [16]: NF4's code values
//   name.nested_absmax, .nested_quant_map  fp32 [ceil(blocks / 256)], fp32 [256] (double quantization)
//   name.quant_state.bitsandbytes__nf4     uint8: JSON {quant_type, blocksize, dtype, shape,
//                                          nested_blocksize, nested_dtype, nested_offset}
// (bitsandbytes' QuantState.as_dict(packed=True)); "__fp4" instead for its other 4-bit type.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/shard/nf4.h"

namespace fsdp::checkpoint {

struct Bnb4bitWeight {
  shard::Nf4Weight weight;
  at::ScalarType dtype = at::kBFloat16;  // the dtype it was quantized from (and dequantizes to)
};

// True when the weights hold a bitsandbytes 4-bit state for `name`.
bool is_bnb_4bit(const std::function<bool(const std::string&)>& contains, const std::string& name);

// The NF4 weight stored under `name`, or nullopt when `name` is stored plainly. `read(tensor)`
// reads a tensor of the weights, `contains(tensor)` says whether they hold it; `where` names the
// file in errors; `expected_shape` is the model's. Throws std::runtime_error naming the tensor for
// fp4, another block size, another shape, a code or map other than bitsandbytes' NF4 ones, a part
// missing or of the wrong size or dtype.
std::optional<Bnb4bitWeight> read_bnb_4bit(const std::string& where, const std::string& name,
                                           const std::vector<int64_t>& expected_shape,
                                           const std::function<bool(const std::string&)>& contains,
                                           const std::function<at::Tensor(const std::string&)>& read);

}  // namespace fsdp::checkpoint
