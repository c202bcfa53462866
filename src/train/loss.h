// Private to train/: the objective training minimises and evaluation reports: cross-entropy, in
// fp32 whatever the compute dtype, over tokens ([b, seq, vocab] logits, [b, seq] targets) or
// images ([b, classes] logits, [b] targets).
#pragma once

#include <torch/torch.h>

namespace fsdp::train {

inline at::Tensor loss_of(const at::Tensor& model_output, const at::Tensor& targets,
                          torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction) {
  const at::Tensor logits = model_output.to(at::kFloat);  // bf16 compute: the loss in fp32
  if (logits.dim() == 3) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape(-1),
                                                torch::nn::functional::CrossEntropyFuncOptions().reduction(reduction));
  }
  return torch::nn::functional::cross_entropy(logits, targets,
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(reduction));
}

}  // namespace fsdp::train
