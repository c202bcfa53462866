// The planner's activation term for one block (ModelFamily::plan_activation_bytes) against the bytes
// a block's forward leaves alive for backward, measured: the heap's bytes in use after a forward
// with gradients, for a model of L + 1 blocks less one of L blocks (the embedding, the head and the
// output cancel), on glibc's heap (shard/host_heap.h). Before 2026-12-06 the plan's terms were
// 5-27% off for GPT's composed and fp32 attention, Qwen3's composed norms and Gemma 3, and Llama's
// keys and values were repeated to every query head: this test failed on each of them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <variant>

#include "fsdp/compat.h"
#include "fsdp/models/attention.h"
#include "fsdp/models/fused_ops.h"
#include "fsdp/models/built_model.h"
#include "fsdp/models/model_family.h"
#include "fsdp/models/registry.h"
#include "fsdp/shard/host_heap.h"

namespace block_activation_tests {

// One way of computing a block: the compute dtype, the attention path, fused or composed ops.
struct Computation {
  at::ScalarType dtype;
  fsdp::models::AttentionPath attention;
  bool fused_ops;
};

// `name`'s config with `layers` blocks.
template <class Config>
auto set_layers(Config& c, int64_t layers, int) -> decltype(c.layers = layers, void()) {
  c.layers = layers;
}
template <class Config>
void set_layers(Config&, int64_t, long) {}  // a family without one stack of blocks

fsdp::models::ModelConfig with_layers(const std::string& name, int64_t layers) {
  fsdp::models::ModelConfig config = fsdp::models::model_config(name);
  std::visit([&](auto& c) { set_layers(c, layers, 0); }, config);
  return config;
}

// Bytes alive after a forward of `config` over ids [b, t] (the output included) in `dtype`.
int64_t kept_by_forward(const fsdp::models::ModelConfig& config, int64_t b, int64_t t, at::ScalarType dtype) {
  torch::manual_seed(0);
  const fsdp::models::BuiltModel model = fsdp::models::family_of(config).build(config);
  model.module->to(dtype);
  const at::Tensor ids = at::randint(fsdp::models::family_of(config).vocab_size(config), {b, t}, at::kLong);
  (void)model.forward(ids);  // first: lazily made tables and kernels' caches
  const int64_t before = fsdp::shard::host_heap_bytes().in_use;
  const at::Tensor logits = model.forward(ids);
  return fsdp::shard::host_heap_bytes().in_use - before;
}

// The text decoders of the zoo, each way the trainer may compute them: the bytes one more block
// keeps for b more samples of t tokens within 3% of the plan's term for it (b = 16 of 64 tokens;
// llama-small 4 of 128).
// GPT-2's LayerNorm blocks; Llama's grouped-query attention (8 query heads over 4 key/value heads);
// Qwen3's per-head q and k norms; Mistral's sliding window (a mask); Gemma 3's six norms, GeGLU
// and local layers. One intra-op thread: which thread frees what then never moves bytes between
// glibc's per-thread caches, which mallinfo2 counts as in use.
TEST(BlockActivations, EachDecoderBlockKeepsWhatThePlanCounts) {
  if (fsdp::shard::host_heap() != fsdp::shard::HostHeap::Glibc) GTEST_SKIP() << "measured on glibc's heap";
  using fsdp::models::AttentionPath;
  // The process's attention paths, fused ops and threads, put back however the test ends.
  struct Restore {
    int threads = at::get_num_threads();
    ~Restore() {
      fsdp::models::set_attention_path(at::kFloat, AttentionPath::Fused);
      fsdp::models::set_attention_path(at::kBFloat16, AttentionPath::Fused);
      fsdp::models::set_fused_ops(true);
      at::set_num_threads(threads);
    }
  } restore;
  at::set_num_threads(1);
  for (const std::string name : {"gpt-tiny", "llama-small", "qwen3-test", "mistral-test", "gemma3-test"}) {
    const int64_t b = name == "llama-small" ? 4 : 16, t = name == "llama-small" ? 128 : 64;
    for (const Computation how :
         {Computation{at::kFloat, AttentionPath::Fused, true}, Computation{at::kFloat, AttentionPath::Fused, false},
          Computation{at::kFloat, AttentionPath::Math, true},
          Computation{at::kBFloat16, AttentionPath::FusedFp32, true},
          Computation{at::kBFloat16, AttentionPath::Fused, true}}) {
      fsdp::models::set_attention_path(how.dtype, how.attention);
      fsdp::models::set_fused_ops(how.fused_ops);
      // One block's bytes for b more samples: what grows with the tokens (a block's autograd nodes,
      // some 50-80 KB however many tokens, cancel; they are not the plan's).
      const auto block = [&](int64_t samples) {
        return kept_by_forward(with_layers(name, 3), samples, t, how.dtype) -
               kept_by_forward(with_layers(name, 2), samples, t, how.dtype);
      };
      const int64_t measured = block(2 * b) - block(b);
      fsdp::models::ActivationSettings s;
      s.seq_len = t;
      s.micro_batch = b;
      s.compute_bytes = how.dtype == at::kFloat ? 4 : 2;
      s.fused_attention = how.attention != AttentionPath::Math;
      s.attention_fp32 = how.attention == AttentionPath::FusedFp32;
      s.fused_ops = how.fused_ops;
      s.grouped_kv_repeated = !fsdp::compat::cpu_fused_attention_takes_grouped_heads();  // libtorch 2.7
      const auto& family = fsdp::models::family_of(with_layers(name, 2));
      const int64_t planned =
          family.plan_activation_bytes(with_layers(name, 3), s) - family.plan_activation_bytes(with_layers(name, 2), s);
      const std::string what = name + " block, " + c10::toString(how.dtype) + ", " + fsdp::enum_name(how.attention) +
                               " attention, " + (how.fused_ops ? "fused" : "composed") + " ops";
      std::printf("%-62s measured %8.3f MiB, planned %8.3f MiB (%+.1f%%)\n", what.c_str(), measured / 1048576.0,
                  planned / 1048576.0, 100.0 * (planned - measured) / measured);
      EXPECT_NEAR(static_cast<double>(planned), static_cast<double>(measured), 0.03 * measured) << what;
    }
  }
}

}  // namespace block_activation_tests
