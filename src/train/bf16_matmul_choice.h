// src/train/bf16_matmul_choice.h: train.bf16_matmul = "auto" on a CPU with bf16 instructions.
#pragma once

#include <torch/nn/module.h>

#include <optional>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/bf16_matmul.h"

namespace fsdp::train {

// libtorch's bf16 GEMMs or fp32 GEMMs on the bf16 operands, whichever ran this model's linear
// layers faster here (models::time_bf16_matmuls; the CPU flag alone does not say:
// docs/benchmarks.md), set process-wide (models::set_bf16_matmul). Every rank measures at once,
// as it will train, and takes rank 0's choice, so that all ranks compute alike. Measured only
// where every rank's CPU has bf16 instructions (hosts may differ); elsewhere, or for a model
// with no linear layer to time, each rank keeps its mode (fp32 GEMMs without the instructions)
// and nullopt is returned. Like cuDNN's benchmark mode, two runs may choose differently where the
// two are close; a run that must repeat another's bf16 arithmetic to the bit names the way.
// rows: GEMM rows per micro-batch (its examples times each one's tokens). Collective.
std::optional<models::Bf16MatmulTimes> choose_bf16_matmul_by_timing(torch::nn::Module& model, int64_t rows,
                                                                    const comm::ProcessGroupPtr& world);

}  // namespace fsdp::train
