// fsdp/plan/workload_settings.h: what a run does besides sharding that its memory and time depend
// on: the optimizer, the batch and sequence, the loss's chunks, the embedding's units, attention's
// kind, async checkpoint staging, the frozen base's dtype. Declared once, as the sharding settings
// are (runtime/sharding_settings.h): plan::PlanInput is both, fsdp-plan has one flag per setting
// (--<name> with dashes; a boolean that is on by default is turned off with --<name>=false), and
// each names the config key a run gives it by, which train::plan_input reads it from.
//
// To add one: a member below and its line in for_each_workload_setting; train::plan_input sets it
// from its key, and memory_plan.cpp counts it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "fsdp/models/lora_base_dtype.h"
#include "fsdp/optim/optimizer_kind.h"

namespace fsdp::plan {

struct WorkloadSettings {
  optim::OptimizerKind optimizer = optim::OptimizerKind::AdamW;
  int64_t micro_batch = 1;    // samples per rank per forward
  int64_t micro_batches = 1;  // gradient accumulation steps
  // Each micro-batch reduces its gradients; false: autograd's gradients of every unit are kept
  // (unsharded, the compute dtype) across the micro-batches and reduced once, at the last.
  bool sync_each_micro_batch = true;
  int64_t seq_len = 2048;         // tokens per sample (language models)
  int64_t loss_chunk_tokens = 0;  // language models: the head and loss this many tokens at a time (0: all)
  bool embedding_units = true;    // token embedding and output head are units of their own
  // Fused attention (scaled_dot_product_attention's flash or memory-efficient kernels, on a GPU and,
  // from libtorch 2.2, on the CPU: what fsdp.cpp's models call) keeps no [heads, t, t] probabilities;
  // composed attention (matmul, softmax, matmul: an explicit mask or an old libtorch) keeps them.
  bool fused_attention = true;
  bool async_checkpoint = false;  // checkpoint.async: staging copies in host memory while a save is written
  // LoRA (the model's LoraSpec enabled): the base frozen, its shards in this dtype, no gradient or
  // optimizer state for it; the adapters fp32 with AdamW. BFloat16, Float32 or Nf4 (the blocks'
  // linear weights in NF4 with double quantization, the rest bf16); Auto is resolved before planning.
  models::LoraBaseDtype lora_base_dtype = models::LoraBaseDtype::BFloat16;
};

// Each setting's name, member, the config key a run gives it by ("" where none does: the config
// gives train.global_batch, of which micro_batch is a rank's share), and one line of help.
template <class Visit>
void for_each_workload_setting(Visit&& visit) {
  using W = WorkloadSettings;
  visit("optimizer", &W::optimizer, "optimizer.name", "the optimizer (its state per parameter)");
  visit("micro_batch", &W::micro_batch, "",
        "samples per rank per forward (a config: train.global_batch / N / micro_batches)");
  visit("micro_batches", &W::micro_batches, "train.micro_batches", "gradient accumulation steps");
  visit("sync_each_micro_batch", &W::sync_each_micro_batch, "train.sync_each_micro_batch",
        "reduce the gradients after every micro-batch (false: keep every unit's unsharded gradients until the last)");
  visit("seq_len", &W::seq_len, "train.seq_len", "tokens per sample (language models)");
  visit("loss_chunk_tokens", &W::loss_chunk_tokens, "train.loss_chunk_tokens",
        "language models: the head and loss this many tokens at a time (0: whole logits)");
  visit("embedding_units", &W::embedding_units, "fsdp.embedding_units",
        "the token embedding and output head as units of their own (false: in the root unit)");
  visit("fused_attention", &W::fused_attention, "train.attention",
        "fused attention (scaled_dot_product_attention), keeping no [heads, t, t] probabilities (false: composed, "
        "train.attention = \"math\")");
  visit("async_checkpoint", &W::async_checkpoint, "checkpoint.async",
        "count the asynchronous save's staging copies (host memory)");
  visit("lora_base_dtype", &W::lora_base_dtype, "lora.base_dtype",
        "LoRA: the frozen base's storage (nf4: QLoRA, the blocks' linear weights in 4-bit NF4, the rest bf16)");
}

// A number setting whose default is positive takes no 0 (a micro-batch, a sequence length): fsdp-plan
// refuses it as it parses. loss_chunk_tokens' 0 means the whole logits.
template <class T>
constexpr bool takes_no_zero(T WorkloadSettings::*member) {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) return WorkloadSettings{}.*member > 0;
  return false;
}

}  // namespace fsdp::plan
