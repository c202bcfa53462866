// fsdp/models/stacked_linear.h: linear layers that read one input (attention's q, k and v
// projections; the MLP's gate and up) computed as one GEMM, where their weights lie back to back
// in one buffer.
//
// An FSDP unit's gathered parameters do: the flat buffer holds a module's parameters in
// registration order, each a view of it (shard/flat_param.h), so q_proj's, k_proj's and
// v_proj's weights [q, in], [kv, in], [kv, in] are together the rows of one [q + 2 kv, in]
// matrix. One GEMM of that matrix replaces three narrower ones forward, and backward's input
// gradient is one GEMM too, where autograd would add three partial products; the weight gradient
// is one GEMM whose rows are each weight's gradient (contiguous views of it). Separately built
// tensors (a model outside FSDP, a reference) never share a buffer: their layers compute as
// before.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace fsdp::models {

// Whether `weights` (each [out_i, in], 2-D) are contiguous rows of one storage, each starting
// where the one before ends, in one dtype and on one device: the rows of one [sum out_i, in]
// matrix. False for fewer than two weights.
bool weights_back_to_back(const std::vector<at::Tensor>& weights);

// x [..., in] -> [..., sum out_i]: x times the stacked weights transposed, with autograd (the input
// and each weight's gradient), computed as models::linear computes (bf16_matmul.h). The weights
// must be back to back (std::invalid_argument otherwise, naming the first that is not) and stay
// so until backward, which checks again (std::logic_error): FSDP's gathers refill the one buffer.
at::Tensor stacked_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights);

}  // namespace fsdp::models
