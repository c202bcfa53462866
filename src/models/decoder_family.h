// Private to models/: the spec shared by the families built on Llama's decoder (llama.h): Llama,
// Qwen2, Qwen3, Mistral. The model, its FSDP units, LoRA targets, counts, FLOPs, Hugging Face tensor
// names and planner terms are the decoder's, whatever it is called; each family's own file gives
// its name, sizes, [model] fields and config.json, and fixes the decoder's variations
// (LlamaConfig's head_dim, qkv_bias, qk_norm, sliding_window) as its published models have them.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/models/hf_config_reader.h"
#include "fsdp/models/model_family.h"
#include "language_model_entry_points.h"
#include "plan_formulas.h"

namespace fsdp::models {

// The decoder's shape and rotary fields, as every family built on it reads them: vocab, context,
// dim, heads, kv_heads, layers, ffn_hidden, norm_eps, tie_embeddings, rope_theta, rope_scaling.
std::vector<ModelField> decoder_fields(LlamaConfig& c);
// head_dim (0 = dim / heads) and sliding_window (0 = none), for the families that let them vary.
ModelField head_dim_field(LlamaConfig& c);
ModelField sliding_window_field(LlamaConfig& c);

// The config.json keys every causal LM of this shape has (vocab_size, hidden_size, ...,
// rope_theta or rope_parameters, rope_scaling; head_dim where given) into `c`, leaving the
// family's own keys to the family. Refuses hidden_act other than silu and rope types other than
// default and llama3, by name.
void read_decoder_hf_config(const HfConfigReader& r, LlamaConfig& c);
// The same keys out (head_dim always written), without model_type or the family's own keys.
nlohmann::json decoder_hf_config(const LlamaConfig& c);
// Qwen2's and Qwen3's sliding window applies only to the layers from max_window_layers on (and
// only with use_sliding_window): refused, by name, where a config.json turns it on (a layer_types
// entry other than "full_attention"); their published models keep it off.
void refuse_layer_sliding_window(const HfConfigReader& r);

// A decoder of this shape, every other field at the config type's default (the zoo's sizes).
template <class Config>
Config decoder_shape(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                     int64_t context, double theta, bool tied) {
  Config c;
  c.layers = layers;
  c.dim = dim;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn_hidden = ffn;
  c.vocab = vocab;
  c.context = context;
  c.rope_theta = theta;
  c.tie_embeddings = tied;
  return c;
}

// The ModelFamily answers of a decoder family whose config type `Config` is (or derives from)
// LlamaConfig: everything but name, display_name, sizes, fields and the config.json form.
template <class Config>
class DecoderFamily : public FamilyOf<Config> {
 public:
  using FamilyOf<Config>::of;

  ModelTask task() const override { return ModelTask::Language; }
  BuiltModel build(const ModelConfig& config) const override {
    return language_model_entry_points(std::make_shared<LlamaImpl>(of(config)));
  }
  int64_t vocab_size(const ModelConfig& config) const override { return of(config).vocab; }
  int64_t text_context(const ModelConfig& config) const override { return of(config).context; }
  double flops_per_sample(const ModelConfig& config, int64_t seq) const override {
    return of(config).flops_per_token(seq);
  }
  void take_data_vocab(ModelConfig& config, int64_t rows) const override { of(config).vocab = rows; }
  // Fine-tuning rows rarely reach these models' 8k-128k positions.
  int64_t plan_sequence(const ModelConfig& config) const override {
    return std::min<int64_t>(of(config).context, 4096);
  }
  std::optional<AttentionCall> attention_call(const ModelConfig& config, int64_t tokens) const override {
    const LlamaConfig& c = of(config);
    AttentionCall call;
    call.heads = c.heads;
    call.kv_heads = c.kv_heads;
    call.head_dim = c.head_size();
    call.tokens = tokens;
    call.masked = c.sliding_window > 0 && tokens > c.sliding_window;
    return call;
  }
  std::vector<std::string> block_type_names(const ModelConfig&) const override { return {"LlamaBlock"}; }
  // A tied embedding and head is one module called twice, so one path.
  std::vector<std::string> embedding_and_head_paths(const ModelConfig& config) const override {
    if (of(config).tie_embeddings) return {"embed_tokens"};
    return {"embed_tokens", "lm_head"};
  }
  LoraSpec* lora(ModelConfig& config) const override { return &of(config).lora; }
  std::vector<std::string> linear_layers(const ModelConfig&) const override { return LlamaConfig::linear_layers(); }
  int64_t linear_weight_count(const ModelConfig& config) const override { return of(config).linear_weight_count(); }

  // <Family>ForCausalLM: the body under "model.", the head beside it.
  std::string hf_name(const ModelConfig&, const std::string& name) const override {
    return name.rfind("lm_head", 0) == 0 ? name : "model." + name;
  }
  bool hf_unread_buffer(const std::string& name) const override {
    const std::string inv_freq = ".rotary_emb.inv_freq";
    return name.size() >= inv_freq.size() &&
           name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
  }

  PlanUnits plan_units(const ModelConfig& config) const override {
    const LlamaConfig& c = of(config);
    const int64_t block = one_block_params(c);
    return {c.layers,        block, c.layers * block, c.vocab * c.dim, c.tie_embeddings ? 0 : c.vocab * c.dim,
            c.tie_embeddings};
  }
  int64_t plan_adapter_params(const ModelConfig& config) const override { return of(config).lora_parameter_count(); }
  // A block for one sample of t tokens: each RMSNorm keeps its input (composed: an fp32 copy of it
  // and the normalised output, 2 d; fused: the input and 1/rms per row, 1 d), and the normalised
  // outputs the projections read (2 d); with qk_norm, the per-head norms' likewise over q and k; the
  // attention (attention_activation_bytes: q, k, v after rotary, rotary keeping only its
  // tables); the SwiGLU's gate and up (the fused op's closed-form backward needs no SiLU(gate); the
  // composed one keeps it too) and their product (3 or 4 ffn). Measured against the forward of a
  // llama-small block, every way it computes, in tests/unit/block_activation_tests.cpp.
  int64_t plan_activation_bytes(const ModelConfig& config, const ActivationSettings& s) const override {
    const LlamaConfig& c = of(config);
    const int64_t t = s.seq_len, q = c.heads * c.head_size(), kv = c.kv_heads * c.head_size();
    const int64_t norms = s.fused_ops ? 1 : 2;  // widths an RMSNorm keeps of its input
    const int64_t widths =
        (2 + 2 * norms) * c.dim + (c.qk_norm ? norms * (q + kv) : 0) + (s.fused_ops ? 3 : 4) * c.ffn_hidden;
    const int64_t block = s.compute_bytes * t * widths + attention_activation_bytes(c.heads, q, kv, t, s);
    const int64_t head = language_head_activation_bytes(c.dim, c.vocab, s.micro_batch * t, s);
    return block_stack_activation_bytes(c.layers, c.dim, t, block, head, s);
  }
  int64_t largest_module_params(const ModelConfig& config) const override {
    const LlamaConfig& c = of(config);
    return std::max(c.vocab * c.dim, c.dim * c.ffn_hidden);
  }
};

}  // namespace fsdp::models
