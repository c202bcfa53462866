// Private to models/: the entry points of a model that reads token ids (GPT, Llama): its forward to
// logits and its chunked summed loss, each called through fsdp::nn::call so wrappers' hooks run.
#pragma once

#include <memory>

#include "fsdp/models/built_model.h"
#include "fsdp/nn/hooks.h"

namespace fsdp::models {

template <class Module>
BuiltModel language_model_entry_points(std::shared_ptr<Module> module) {
  BuiltModel built;
  built.module = module;
  built.forward_function = [module](const at::Tensor& ids, const at::Tensor& positions) {
    return fsdp::nn::call(module, ids, positions);
  };
  built.loss_sum_function = [module](const at::Tensor& ids, const at::Tensor& targets, const ChunkedLoss& chunks,
                                     const at::Tensor& positions) {
    return fsdp::nn::call(module, ids, targets, chunks, positions);
  };
  return built;
}

}  // namespace fsdp::models
