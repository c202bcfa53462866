// fsdp/models/plan_terms.h: what the memory planner (plan/memory_plan.h) asks of a model family
// (ModelFamily::plan_*): its FSDP units' sizes, the parameters that train, and the bytes a
// micro-batch keeps for backward. The planner adds the sharding, dtypes and buffers around them.
#pragma once

#include <cstdint>

namespace fsdp::models {

// The parameters of each kind of unit, as fsdp.wrap = "block" with embedding units makes them.
struct PlanUnits {
  int64_t layers = 0;         // blocks, every stack together (CLIP: both towers')
  int64_t largest_block = 0;  // parameters of the largest block
  int64_t all_blocks = 0;     // of every block together
  int64_t embedding = 0;      // the token embedding's unit (CLIP: the text tower's embeddings)
  int64_t head = 0;           // the output head's unit, 0 when tied (CLIP: the image tower's embeddings)
  bool tied = false;          // the embedding's unit is the head too (used first and last)
  // Other modules that are units of their own beside those, each gathered once a pass (LLaVA: the
  // image tower's embeddings): how many, and their parameters together.
  int64_t other_units = 0;
  int64_t other_params = 0;
};

// How a micro-batch computes, for the activations it keeps.
struct ActivationSettings {
  int64_t seq_len = 1;        // tokens per sample (language models)
  int64_t compute_bytes = 4;  // per element of the compute dtype
  int64_t micro_batch = 1;    // samples per micro-batch on a rank
  int ranks = 1;              // a loss over the global batch sees micro_batch x ranks samples
  bool fused_attention = true;
  bool fused_ops = true;
  bool attention_fp32 = false;
  // The fused kernel gets grouped k and v repeated to every query head rather than read in place
  // (compat::fused_kernel_takes_grouped_heads: the CPU's under libtorch 2.7).
  bool grouped_kv_repeated = false;
  bool checkpointing = false;
  int64_t checkpointing_every = 1;
  int64_t loss_chunk_tokens = 0;  // 0: the logits of every token at once
  // The chunked loss's logits stay in the compute dtype (a GPU's row kernel, fused_ops.h:
  // cross_entropy_rows) rather than widened into an fp32 buffer (the host's path).
  bool loss_rows_in_compute_dtype = false;
};

}  // namespace fsdp::models
