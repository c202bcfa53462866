// The model zoo: published parameter counts, layers against slow direct implementations, causality.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>

#include "fsdp/models/attention.h"
#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/fused_ops.h"
#include "fsdp/models/layers.h"
#include "fsdp/models/linear_cross_entropy.h"
#include "fsdp/models/registry.h"
#include "fsdp/models/vit.h"

namespace model_tests {

using fsdp::models::model_config;
using fsdp::models::parameter_count;

int64_t counted(const std::shared_ptr<torch::nn::Module>& module) {
  int64_t total = 0;
  for (const auto& p : module->parameters()) total += p.numel();
  return total;
}

// Published counts (Hugging Face model cards / configs), exact.
TEST(ModelZoo, PublishedParameterCounts) {
  EXPECT_EQ(parameter_count(model_config("gpt2")), 124439808);  // GPT-2 124M, tied embeddings
  EXPECT_EQ(parameter_count(model_config("gpt2-medium")), 354823168);
  EXPECT_EQ(parameter_count(model_config("gpt2-large")), 774030080);
  EXPECT_EQ(parameter_count(model_config("gpt2-xl")), 1557611200);
  EXPECT_EQ(parameter_count(model_config("llama3-8b")), 8030261248);  // Meta-Llama-3-8B
  EXPECT_EQ(parameter_count(model_config("llama3-70b")), 70553706496);
  EXPECT_EQ(parameter_count(model_config("llama3-1b")), 1235814400);  // Llama-3.2-1B, tied
  EXPECT_EQ(parameter_count(model_config("vit-s16")), 22050664);      // timm vit_small_patch16_224
  EXPECT_EQ(parameter_count(model_config("vit-b16")), 86567656);      // timm vit_base_patch16_224
  EXPECT_EQ(parameter_count(model_config("vit-l16")), 304326632);     // timm vit_large_patch16_224
}

// The formula is what a built model holds: every small size, and GPT-2 124M itself (0.5 GB).
TEST(ModelZoo, FormulaMatchesBuiltModels) {
  for (const auto& name : fsdp::models::model_names()) {
    auto config = model_config(name);
    if (parameter_count(config) > 130'000'000) continue;  // the 8B would need 32 GB
    auto built = fsdp::models::build_model(config);
    EXPECT_EQ(counted(built.module), parameter_count(config)) << name;
  }
}

TEST(ModelZoo, UnknownNameListsKnownOnes) {
  try {
    model_config("gpt5");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model 'gpt5'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("llama3-8b"), std::string::npos);
  }
}

TEST(ModelZoo, FlopsPerTokenIsSixTimesMatmulWeightsPlusAttention) {
  // GPT-2 124M at 1024 tokens: matmul weights = blocks (12 x 12 x 768^2) + tied head (50257 x 768).
  const double weights = 12.0 * 12 * 768 * 768 + 50257.0 * 768;
  EXPECT_DOUBLE_EQ(fsdp::models::flops_per_sample(model_config("gpt2"), 1024), 6 * weights + 12.0 * 12 * 1024 * 768);
}

// Slow attention: explicit loops in fp64 over batch, head, query and key positions.
at::Tensor slow_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  auto qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3), group = h / k.size(1);
  auto out = at::zeros({b, h, t, d}, at::kDouble);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t i = 0; i < t; ++i) {
        const int64_t last = causal ? i : t - 1;
        std::vector<double> scores;
        double max_score = -1e300;
        for (int64_t j = 0; j <= last; ++j) {
          double s = (qd[bi][hi][i] * kd[bi][hi / group][j]).sum().item<double>() / std::sqrt(static_cast<double>(d));
          scores.push_back(s);
          max_score = std::max(max_score, s);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - max_score));
        for (int64_t j = 0; j <= last; ++j) out[bi][hi][i] += vd[bi][hi / group][j] * (scores[j] / total);
      }
    }
  }
  return out;
}

// Tolerance 1e-5: fp32 attention against fp64 loops on unit-scale inputs (errors ~1e-7).
TEST(Layers, AttentionMatchesSlowDirectImplementation) {
  torch::manual_seed(3);
  for (bool causal : {true, false}) {
    for (int64_t kv_heads : {4, 2, 1}) {  // multi-head, grouped-query, multi-query
      auto q = torch::randn({2, 4, 5, 8}), k = torch::randn({2, kv_heads, 5, 8}), v = torch::randn({2, kv_heads, 5, 8});
      auto fast = fsdp::models::attention(q, k, v, causal).to(at::kDouble);
      auto slow = slow_attention(q, k, v, causal);
      EXPECT_LE((fast - slow).abs().max().item<double>(), 1e-5) << "causal " << causal << " kv_heads " << kv_heads;
    }
  }
}

// Rotary embedding by its definition: the pair (c, c + d/2) at position p rotated by the angle
// p * theta^(-2c/d), computed element by element in fp64.
TEST(Layers, RotaryMatchesSlowDirectImplementation) {
  torch::manual_seed(4);
  const int64_t t = 7, d = 8;
  const double theta = 10000.0;
  auto x = torch::randn({1, t, 2, d});  // [b, t, heads, hd]
  auto [cos, sin] = fsdp::models::rotary_tables(t, d, theta);
  auto fast = fsdp::models::rotary(x, cos, sin).to(at::kDouble);
  auto xd = x.to(at::kDouble);
  auto slow = at::zeros_like(xd);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t p = 0; p < t; ++p) {
      for (int64_t c = 0; c < d / 2; ++c) {
        const double angle = p * std::pow(theta, -2.0 * c / d);
        const double a = xd[0][p][h][c].item<double>(), b = xd[0][p][h][c + d / 2].item<double>();
        slow[0][p][h][c] = a * std::cos(angle) - b * std::sin(angle);
        slow[0][p][h][c + d / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  EXPECT_LE((fast - slow).abs().max().item<double>(), 1e-5);
  // What rotary embeddings are for: q.k depends on positions only through their difference.
  auto q = torch::randn({1, 1, 1, d}), k = torch::randn({1, 1, 1, d});
  auto at_position = [&](const at::Tensor& v, int64_t p) {
    return fsdp::models::rotary(v, cos.narrow(0, p, 1), sin.narrow(0, p, 1));
  };
  auto dot_1_3 = (at_position(q, 3) * at_position(k, 1)).sum().item<double>();
  auto dot_4_6 = (at_position(q, 6) * at_position(k, 4)).sum().item<double>();
  EXPECT_NEAR(dot_1_3, dot_4_6, 1e-5);
}

// A causal language model's logits at position i do not depend on tokens after i.
TEST(Models, LanguageModelsAreCausal) {
  for (const char* name : {"gpt-test", "llama-test"}) {
    torch::manual_seed(5);
    auto model = fsdp::models::build_model(model_config(name));
    auto ids = torch::randint(0, 256, {2, 10}, torch::kLong);
    auto changed = ids.clone();
    changed.narrow(1, 6, 4).random_(0, 256);
    torch::NoGradGuard no_grad;
    auto a = model.forward(ids), b = model.forward(changed);
    EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 10, 256})) << name;
    EXPECT_TRUE(torch::equal(a.narrow(1, 0, 6), b.narrow(1, 0, 6))) << name;
    EXPECT_FALSE(torch::equal(a.narrow(1, 6, 4), b.narrow(1, 6, 4))) << name;
  }
}

TEST(Models, VitClassifiesImages) {
  auto model = fsdp::models::build_model(model_config("vit-test"));
  auto logits = model.forward(torch::randn({3, 1, 28, 28}));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_THROW(model.forward(torch::randn({3, 1, 32, 32})), c10::Error);
}

// The ViT's patch embedding, computed as a GEMM over the patches, is its convolution (timm's
// patch_embed.proj, stride = kernel): outputs and the gradients of weight, bias and images equal
// torch's conv2d in fp64 to 1e-12, with 3 channels and a non-square patch grid order to catch a
// wrong permutation (channel-major pixels per patch, patches row by row).
TEST(Models, VitPatchEmbeddingIsItsConvolution) {
  fsdp::models::VitConfig config;
  config.image_size = 12;
  config.patch = 4;
  config.channels = 3;
  config.dim = 5;
  config.heads = 1;
  config.layers = 1;
  config.mlp_hidden = 8;
  config.classes = 2;
  torch::manual_seed(2);
  fsdp::models::Vit vit(config);
  vit->to(at::kDouble);
  const at::Tensor images = torch::randn({2, 3, 12, 12}, torch::kDouble).requires_grad_();
  const at::Tensor ours = vit->embed_patches(images);  // [2, 9, 5]
  const at::Tensor weight = vit->patch_embed->weight.detach().clone().requires_grad_();
  const at::Tensor bias = vit->patch_embed->bias.detach().clone().requires_grad_();
  const at::Tensor images_again = images.detach().clone().requires_grad_();
  const at::Tensor theirs = torch::conv2d(images_again, weight, bias, 4).flatten(2).transpose(1, 2);
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-12);
  const at::Tensor upstream = torch::randn(ours.sizes(), torch::kDouble);
  (ours * upstream).sum().backward();
  (theirs * upstream).sum().backward();
  EXPECT_LE((vit->patch_embed->weight.grad() - weight.grad()).abs().max().item<double>(), 1e-12);
  EXPECT_LE((vit->patch_embed->bias.grad() - bias.grad()).abs().max().item<double>(), 1e-12);
  EXPECT_LE((images.grad() - images_again.grad()).abs().max().item<double>(), 1e-12);
}

// GPT-2's initialisation: std 0.02, residual projections 0.02 / sqrt(2 * layers).
TEST(Models, GptInitialisationFollowsGpt2) {
  auto config = std::get<fsdp::models::GptConfig>(model_config("gpt-mini"));  // 6 layers, width 256
  torch::manual_seed(6);
  fsdp::models::Gpt model(config);
  auto block = model->h->ptr<fsdp::models::GptBlockImpl>(0);
  EXPECT_NEAR(block->attn->c_attn->weight.std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(block->mlp->c_proj->weight.std().item<double>(), 0.02 / std::sqrt(12.0), 0.0005);
  EXPECT_EQ(block->attn->c_attn->bias.abs().max().item<double>(), 0.0);
  EXPECT_NEAR(model->wte->weight.std().item<double>(), 0.02, 0.001);
}

}  // namespace model_tests

namespace model_tests {

// LoRA (models/layers.h): adapters on the targeted layers only, PEFT's names and shapes, B = 0 so
// the model starts equal to its base, everything but the adapters frozen; bad specs refused.
// The chunked head + cross-entropy equals the composed one (linear, to fp32, cross_entropy with
// reduction sum and ignore_index -100): loss, d hidden and d weight, in fp32 (tolerance 1e-5
// relative) and bf16 (1e-2: chunked accumulation of the weight's gradient rounds differently), for
// chunk sizes that divide the rows, do not, and exceed them. A wrong sign, a missed ignored row or
// a lost chunk moves these by far more.
TEST(LinearCrossEntropy, EqualsTheComposedHeadAndLoss) {
  torch::manual_seed(0);
  const int64_t n = 37, dim = 24, vocab = 101;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
    const at::Tensor hidden0 = torch::randn({n, dim}).to(dtype), weight0 = (torch::randn({vocab, dim}) * 0.3).to(dtype);
    at::Tensor targets = torch::randint(0, vocab, {n}, at::kLong);
    targets.index_put_({torch::arange(0, n, 5)}, -100);  // every 5th row not counted
    auto composed_h = hidden0.clone().set_requires_grad(true), composed_w = weight0.clone().set_requires_grad(true);
    const at::Tensor reference = torch::nn::functional::cross_entropy(
        torch::matmul(composed_h, composed_w.t()).to(at::kFloat), targets,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100));
    (reference * 0.7).backward();
    for (int64_t chunk : {1, 8, 37, 1000}) {
      auto h = hidden0.clone().set_requires_grad(true), w = weight0.clone().set_requires_grad(true);
      const at::Tensor loss = fsdp::models::linear_cross_entropy_sum(h, w, targets, chunk);
      (loss * 0.7).backward();
      EXPECT_EQ(loss.scalar_type(), at::kFloat);
      EXPECT_NEAR(loss.item<double>(), reference.item<double>(), tol * std::abs(reference.item<double>()))
          << "chunk " << chunk;
      auto relative = [](const at::Tensor& a, const at::Tensor& b) {
        return ((a.to(at::kFloat) - b.to(at::kFloat)).abs().max() / b.to(at::kFloat).abs().max()).item<double>();
      };
      EXPECT_LT(relative(h.grad(), composed_h.grad()), tol) << "d hidden, chunk " << chunk;
      EXPECT_LT(relative(w.grad(), composed_w.grad()), tol) << "d weight, chunk " << chunk;
      EXPECT_EQ(h.grad().scalar_type(), dtype);
    }
  }
  EXPECT_THROW(fsdp::models::linear_cross_entropy_sum(torch::randn({4, 3}), torch::randn({5, 3}),
                                                      torch::zeros({4}, at::kLong), 0),
               std::invalid_argument);
}

// Where bf16 products widen to fp32 (train.bf16_matmul = fp32), the head's weight is widened a
// slice of 8,192 vocabulary rows at a time, not whole (2.1 GB at 8 B). Over a vocabulary of three
// slices the op gives the loss of the widened product taken whole (rounded to bf16, as the
// composed head is) and its gradients: d hidden summed slice by slice in fp32, d weight per slice.
TEST(LinearCrossEntropy, WidenedHeadSliceBySliceEqualsTheWholeProduct) {
  torch::manual_seed(6);
  const int64_t n = 23, dim = 16, vocab = 20000;
  const at::Tensor hidden0 = torch::randn({n, dim}).to(at::kBFloat16);
  const at::Tensor weight0 = (torch::randn({vocab, dim}) * 0.3).to(at::kBFloat16);
  const at::Tensor targets = torch::randint(0, vocab, {n}, at::kLong);
  auto ref_h = hidden0.to(at::kFloat).set_requires_grad(true), ref_w = weight0.to(at::kFloat).set_requires_grad(true);
  // The whole widened product, rounded to bf16 (straight through for the gradient), then the loss.
  const at::Tensor logits = torch::matmul(ref_h, ref_w.t());
  const at::Tensor rounded = logits + (logits.to(at::kBFloat16).to(at::kFloat) - logits).detach();
  const at::Tensor reference = torch::nn::functional::cross_entropy(
      rounded, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  reference.backward();
  const auto mode = fsdp::models::bf16_matmul();
  fsdp::models::set_bf16_matmul(fsdp::models::Bf16Matmul::Fp32);
  for (int64_t chunk : {7, 1000}) {
    auto h = hidden0.clone().set_requires_grad(true), w = weight0.clone().set_requires_grad(true);
    const at::Tensor loss = fsdp::models::linear_cross_entropy_sum(h, w, targets, chunk);
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-5 * std::abs(reference.item<double>())) << chunk;
    auto relative = [](const at::Tensor& a, const at::Tensor& b) {
      return ((a.to(at::kFloat) - b.to(at::kFloat)).abs().max() / b.to(at::kFloat).abs().max()).item<double>();
    };
    EXPECT_LT(relative(h.grad(), ref_h.grad()), 8e-3) << "d hidden (bf16), chunk " << chunk;
    EXPECT_LT(relative(w.grad(), ref_w.grad()), 8e-3) << "d weight (bf16), chunk " << chunk;
    EXPECT_EQ(h.grad().scalar_type(), at::kBFloat16);
  }
  fsdp::models::set_bf16_matmul(mode);
}

// The op computes each chunk's logits once, in one reused fp32 buffer (the logits, log-sum-exp and
// softmax in place, then their gradient in place), and its gradients in forward, for the factor
// the caller says backward will bring (ChunkedLoss::gradient). In fp32, with that factor right, it
// gives the bits of the same chunked sums written with a fresh tensor per step: loss, d hidden and
// d weight equal exactly, for chunks that divide the rows and do not. With the factor left at 1,
// backward's correction (x 0.7 after the sums instead of before) moves them by rounding only.
TEST(LinearCrossEntropy, OneChunkBufferGivesTheBitsOfFreshTensors) {
  torch::manual_seed(4);
  const int64_t n = 29, dim = 16, vocab = 67;
  const at::Tensor hidden = torch::randn({n, dim}), weight = torch::randn({vocab, dim}) * 0.3;
  at::Tensor targets = torch::randint(0, vocab, {n}, at::kLong);
  targets.index_put_({torch::arange(0, n, 4)}, -100);
  const float g = 0.7f;
  for (int64_t chunk : {5, 29, 8}) {
    at::Tensor total = at::zeros({});
    at::Tensor grad_hidden = at::empty_like(hidden), grad_weight = at::zeros_like(weight);
    {
      torch::NoGradGuard no_grad;
      for (int64_t start = 0; start < n; start += chunk) {
        const int64_t rows = std::min(chunk, n - start);
        const at::Tensor h = hidden.narrow(0, start, rows), t = targets.narrow(0, start, rows), counted = t.ne(-100);
        const at::Tensor z = at::matmul(h, weight.t());
        const at::Tensor maxes = at::amax(z, {1}, true);
        const at::Tensor e = at::exp(z - maxes), sums = e.sum(1, true);
        const at::Tensor lse = (at::log(sums) + maxes).squeeze(1);
        const at::Tensor picked = z.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);
        total += at::where(counted, lse - picked, at::zeros_like(picked)).sum();
        at::Tensor dz = e / sums;
        dz.scatter_add_(1, t.clamp_min(0).unsqueeze(1), at::full({rows, 1}, -1.0f));
        dz.mul_((counted.to(at::kFloat) * at::tensor(g)).unsqueeze(1));
        grad_hidden.narrow(0, start, rows).copy_(at::matmul(dz, weight));
        grad_weight.addmm_(dz.t(), h);
      }
    }
    for (double said : {static_cast<double>(g), 1.0}) {
      auto h = hidden.clone().set_requires_grad(true), w = weight.clone().set_requires_grad(true);
      const at::Tensor loss = fsdp::models::linear_cross_entropy_sum(h, w, targets, {chunk, said});
      loss.backward(at::tensor(g));
      EXPECT_TRUE(torch::equal(loss, total))
          << "chunk " << chunk << ": " << loss.item<double>() << " vs " << total.item<double>();
      if (said == g) {
        EXPECT_TRUE(torch::equal(h.grad(), grad_hidden)) << "d hidden, chunk " << chunk;
        EXPECT_TRUE(torch::equal(w.grad(), grad_weight)) << "d weight, chunk " << chunk;
      } else {
        EXPECT_TRUE(torch::allclose(h.grad(), grad_hidden, 1e-6, 1e-7)) << "d hidden, chunk " << chunk;
        EXPECT_TRUE(torch::allclose(w.grad(), grad_weight, 1e-6, 1e-7)) << "d weight, chunk " << chunk;
        EXPECT_FALSE(torch::equal(h.grad(), grad_hidden) && torch::equal(w.grad(), grad_weight))
            << "chunk " << chunk << ": the correction after the sums rounds differently somewhere";
      }
    }
  }
}

// The head's GEMMs run once per chunk, in forward (fsdp-train's head on a GPU spent 7-9 ms of a
// 190 ms step recomputing the logits in backward, 2026-12-04): counted by the profiler's record of
// every aten::mm and aten::addmm the op calls, per chunk of rows. With both gradients wanted:
// forward 3 (logits, d hidden, d weight), backward none; a frozen weight (LoRA): 2; evaluation (no
// grad mode): 1.
TEST(LinearCrossEntropy, HeadGemmsRunOnceInForward) {
  torch::manual_seed(5);
  const int64_t n = 12, dim = 8, vocab = 40, chunk = 4;  // 3 chunks
  const at::Tensor targets = torch::randint(0, vocab, {n}, at::kLong);
  static thread_local int64_t gemms = 0;
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        const std::string name = fn.name();
        if (name == "aten::mm" || name == "aten::addmm" || name == "aten::addmm_") ++gemms;
        return nullptr;
      }));
  auto count = [&](bool hidden_grad, bool weight_grad, bool grad_mode) {
    const at::Tensor h = torch::randn({n, dim}).set_requires_grad(hidden_grad);
    const at::Tensor w = torch::randn({vocab, dim}).set_requires_grad(weight_grad);
    torch::AutoGradMode mode(grad_mode);
    gemms = 0;
    const at::Tensor loss = fsdp::models::linear_cross_entropy_sum(h, w, targets, chunk);
    const int64_t forward = gemms;
    gemms = 0;
    if (loss.requires_grad()) loss.backward();
    return std::make_pair(forward, gemms);
  };
  EXPECT_EQ(count(true, true, true), std::make_pair(int64_t{9}, int64_t{0}));
  EXPECT_EQ(count(true, false, true), std::make_pair(int64_t{6}, int64_t{0}));
  EXPECT_EQ(count(true, true, false), std::make_pair(int64_t{3}, int64_t{0}));
  at::removeCallback(handle);
}

// A factor that cannot scale the gradients (0, inf, NaN: the trainer's loss faults make them) is
// not refused: forward computes for 1 and backward's correction carries the factor that came, so
// the guard sees NaN gradients where backward brings NaN, and right ones otherwise.
TEST(LinearCrossEntropy, AFactorThatCannotScaleIsLeftToBackward) {
  torch::manual_seed(7);
  const at::Tensor hidden = torch::randn({10, 6}), weight = torch::randn({13, 6});
  const at::Tensor targets = torch::randint(0, 13, {10}, at::kLong);
  auto grad_for = [&](double said, float g) {
    auto h = hidden.clone().set_requires_grad(true);
    fsdp::models::linear_cross_entropy_sum(h, weight, targets, {4, said}).backward(at::tensor(g));
    return h.grad();
  };
  const at::Tensor right = grad_for(0.5, 0.5f);
  for (double said : {0.0, std::nan(""), static_cast<double>(INFINITY)}) {
    EXPECT_TRUE(torch::allclose(grad_for(said, 0.5f), right, 1e-6, 1e-7)) << said;
    EXPECT_TRUE(grad_for(said, NAN).isnan().all().item<bool>()) << said;
  }
}

// Backward hands over the gradients forward computed, once: a second backward through the same
// graph (retain_graph) is refused by name, not answered with gradients scaled twice.
TEST(LinearCrossEntropy, RefusesASecondBackward) {
  const at::Tensor h = torch::randn({6, 4}).set_requires_grad(true), w = torch::randn({9, 4});
  const at::Tensor loss = fsdp::models::linear_cross_entropy_sum(h, w, torch::zeros({6}, at::kLong), 4);
  loss.backward({}, /*retain_graph=*/true);
  try {
    loss.backward();
    FAIL() << "a second backward was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("backward ran twice through one forward"), std::string::npos) << e.what();
  }
}

// A target outside [0, vocab) other than the ignore index (-100) is refused, as cross_entropy
// refuses it; before 2026-12-02 a negative one was clamped to class 0 and trained on.
TEST(LinearCrossEntropy, RefusesTargetsOutOfBounds) {
  const at::Tensor hidden = torch::randn({4, 3}), weight = torch::randn({5, 3});
  auto error_for = [&](std::vector<int64_t> targets) {
    try {
      fsdp::models::linear_cross_entropy_sum(hidden, weight, torch::tensor(targets, at::kLong), 2);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_for({0, -5, 1, 2}).find("target -5 at row 1 is out of bounds (classes [0, 5)"), std::string::npos)
      << error_for({0, -5, 1, 2});
  EXPECT_NE(error_for({0, 1, 2, 5}).find("target 5 at row 3 is out of bounds"), std::string::npos);
  EXPECT_EQ(error_for({0, -100, 4, -100}), "accepted");
}

// The models' loss path (ids, targets -> summed loss through the chunked head) equals their logits
// path followed by the composed loss, tied (GPT, Llama 3.2 style) and untied (Llama).
TEST(LinearCrossEntropy, ModelsLossPathEqualsLogitsPath) {
  for (const char* name : {"gpt-test", "llama-test"}) {
    for (bool tie : {false, true}) {
      auto config = model_config(name);
      if (auto* l = std::get_if<fsdp::models::LlamaConfig>(&config)) l->tie_embeddings = tie;
      else if (!tie) continue;  // GPT is always tied
      torch::manual_seed(1);
      auto built = fsdp::models::build_model(config);
      built.module->eval();  // no dropout: both paths see the same network
      const int64_t vocab = fsdp::models::vocab_size(config);
      const at::Tensor ids = torch::randint(0, vocab, {2, 9}, at::kLong),
                       targets = torch::randint(0, vocab, {2, 9}, at::kLong);
      const at::Tensor logits = built.forward(ids);
      const double composed =
          torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}).to(at::kFloat), targets.reshape(-1),
                                               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
              .item<double>();
      ASSERT_TRUE(built.has_loss_sum());
      EXPECT_NEAR(built.loss_sum(ids, targets, 4).item<double>(), composed, 1e-5 * composed)
          << name << (tie ? " tied" : "");
    }
  }
  EXPECT_FALSE(fsdp::models::build_model(model_config("vit-fmnist")).has_loss_sum());
}

// Packed rows (data.packing): three examples back to back in one row, positions restarting at 0
// for each, then padding. Each example's logits and summed loss equal its own in a row alone
// (fp32, 1e-5), for GPT (learned positions) and Llama (rotary), on every attention path, through
// both the logits and the chunked-loss paths. The check sees the error it guards against: the same
// row without positions (one causal sequence, examples attending to their neighbours) is another.
TEST(Packing, EachExampleInAPackedRowIsItselfAlone) {
  const std::vector<int64_t> lengths = {7, 11, 5};  // then 9 places of padding: a row of 32
  const int64_t row = 32;
  for (const char* name : {"gpt-test", "llama-test"}) {
    for (auto path : {fsdp::models::AttentionPath::Fused, fsdp::models::AttentionPath::Math}) {
      fsdp::models::set_attention_path(at::kFloat, path);
      auto config = model_config(name);
      torch::manual_seed(3);
      auto built = fsdp::models::build_model(config);
      built.module->eval();
      const int64_t vocab = fsdp::models::vocab_size(config);
      at::Tensor ids = torch::randint(0, vocab, {1, row}, at::kLong),
                 targets = torch::randint(0, vocab, {1, row}, at::kLong);
      at::Tensor positions = at::empty({1, row}, at::kLong);
      int64_t start = 0;
      for (int64_t length : lengths) {
        positions.narrow(1, start, length).copy_(torch::arange(length, at::kLong));
        start += length;
      }
      positions.narrow(1, start, row - start).copy_(torch::arange(row - start, at::kLong));
      const at::Tensor packed_logits = built.forward(ids, positions);
      const at::Tensor causal_logits = built.forward(ids);
      start = 0;
      double worst = 0.0, neighbours_seen = 0.0;
      for (int64_t length : lengths) {
        const at::Tensor alone = built.forward(ids.narrow(1, start, length));
        worst = std::max(worst, (packed_logits.narrow(1, start, length) - alone).abs().max().item<double>());
        neighbours_seen =
            std::max(neighbours_seen, (causal_logits.narrow(1, start, length) - alone).abs().max().item<double>());
        const double loss_alone =
            built.loss_sum(ids.narrow(1, start, length), targets.narrow(1, start, length), 4).item<double>();
        at::Tensor only = at::full_like(targets, -100);
        only.narrow(1, start, length).copy_(targets.narrow(1, start, length));
        EXPECT_NEAR(built.loss_sum(ids, only, 4, positions).item<double>(), loss_alone, 1e-5 * loss_alone)
            << name << " " << fsdp::enum_name(path);
        start += length;
      }
      EXPECT_LE(worst, 1e-5) << name << " " << fsdp::enum_name(path);
      EXPECT_GT(neighbours_seen, 1e-3) << name << ": without positions the later examples see the earlier ones";
    }
  }
  fsdp::models::set_attention_path(at::kFloat, fsdp::models::AttentionPath::Fused);
}

TEST(Packing, DocumentCausalMaskKeepsExamplesApart) {
  const at::Tensor positions = at::tensor({0, 1, 2, 0, 1, 0}, at::kLong).view({1, 6});
  const at::Tensor allowed = fsdp::models::document_causal_mask(positions);
  ASSERT_EQ(allowed.sizes(), (std::vector<int64_t>{1, 1, 6, 6}));
  const at::Tensor expected = at::tensor({1, 0, 0, 0, 0, 0,  //
                                          1, 1, 0, 0, 0, 0,  //
                                          1, 1, 1, 0, 0, 0,  //
                                          0, 0, 0, 1, 0, 0,  //
                                          0, 0, 0, 1, 1, 0,  //
                                          0, 0, 0, 0, 0, 1},
                                         at::kLong)
                                  .to(at::kBool)
                                  .view({1, 1, 6, 6});
  EXPECT_TRUE(allowed.equal(expected)) << allowed;
}

TEST(Lora, AdaptersStartAtTheBaseAndFreezeIt) {
  auto base_config = std::get<fsdp::models::LlamaConfig>(fsdp::models::model_config("llama-test"));
  auto lora_config = base_config;
  lora_config.lora.rank = 4;
  lora_config.lora.alpha = 8;
  lora_config.lora.targets = {"q_proj", "v_proj", "down_proj"};
  torch::manual_seed(0);
  fsdp::models::Llama base(base_config);
  torch::manual_seed(1);
  fsdp::models::Llama lora(lora_config);
  auto base_params = base->named_parameters();
  int adapters = 0, trainable = 0;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : lora->named_parameters()) {
      if (item.key().find("lora_") != std::string::npos) {
        ++adapters;
        EXPECT_TRUE(item.value().requires_grad()) << item.key();
        continue;
      }
      EXPECT_FALSE(item.value().requires_grad()) << item.key() << " is base: frozen";
      item.value().copy_(base_params[item.key()]);  // the base's weights, as init_from loads them
    }
  }
  for (auto& p : lora->parameters()) trainable += p.requires_grad();
  EXPECT_EQ(adapters, 2 * 3 * static_cast<int>(base_config.layers));
  EXPECT_EQ(trainable, adapters);
  auto params = lora->named_parameters();
  EXPECT_EQ(params["layers.0.self_attn.q_proj.lora_A.weight"].sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(params["layers.0.self_attn.q_proj.lora_B.weight"].sizes(), (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(params["layers.1.mlp.down_proj.lora_B.weight"].abs().max().item<double>(), 0.0);
  EXPECT_FALSE(params.contains("layers.0.self_attn.k_proj.lora_A.weight"));
  torch::manual_seed(2);
  auto ids = torch::randint(0, base_config.vocab, {2, 16});
  EXPECT_TRUE(torch::equal(lora->forward(ids), base->forward(ids))) << "B = 0: the model starts equal to its base";
  // Trained adapters move the output; the update is (alpha / rank) B A.
  {
    torch::NoGradGuard no_grad;
    params["layers.0.self_attn.q_proj.lora_B.weight"].normal_(0.0, 0.1);
  }
  EXPECT_FALSE(torch::equal(lora->forward(ids), base->forward(ids)));
}

// The adapted layer's output against the closed form, computed here from its tensors in fp64:
// y = x W^T + b + s (dropout(x) A^T) B^T with s = alpha / r, or alpha / sqrt(r) with rsLoRA, and
// dropout (train mode) applied to the adapter's input only, as PEFT does: the same mask drawn
// again from the same seed. A wrong scale (alpha instead of alpha / r) is off by a factor of r; a
// dropout on the output, or none, by the dropped share. Tolerance 1e-5 relative (fp32 sums).
TEST(Lora, AdaptedLinearIsTheClosedForm) {
  for (bool rslora : {false, true}) {
    for (double dropout : {0.0, 0.3}) {
      SCOPED_TRACE(std::string(rslora ? "rslora" : "lora") + ", dropout " + std::to_string(dropout));
      fsdp::models::LoraSpec spec;
      spec.rank = 4;
      spec.alpha = 8;
      spec.rslora = rslora;
      spec.dropout = dropout;
      spec.targets = {"q_proj"};
      torch::manual_seed(3);
      fsdp::models::AdaptedLinear layer(12, 10, /*bias=*/true);
      layer->add_adapter(spec);
      {
        torch::NoGradGuard no_grad;
        layer->lora_B->weight.normal_(0.0, 0.5);  // trained: B != 0
      }
      layer->train();
      const at::Tensor x = torch::randn({3, 5, 12});
      torch::manual_seed(7);
      const at::Tensor y = layer->forward(x);
      torch::manual_seed(7);  // the same draw: the mask dropout applied
      const at::Tensor dropped = dropout > 0 ? torch::dropout(x, dropout, /*train=*/true) : x;
      const double scale = rslora ? 8.0 / std::sqrt(4.0) : 8.0 / 4.0;
      auto d = [](const at::Tensor& t) { return t.detach().to(at::kDouble); };
      const at::Tensor expected =
          at::matmul(d(x), d(layer->weight).t()) + d(layer->bias) +
          scale * at::matmul(at::matmul(d(dropped), d(layer->lora_A->weight).t()), d(layer->lora_B->weight).t());
      const double error = (d(y) - expected).abs().max().item<double>();
      EXPECT_LE(error, 1e-5 * expected.abs().max().item<double>()) << "scale " << scale;
      EXPECT_DOUBLE_EQ(layer->lora_scale, scale);
    }
  }
}

TEST(Lora, RefusesBadSpecsByName) {
  auto lora_config = std::get<fsdp::models::LlamaConfig>(fsdp::models::model_config("llama-test"));
  lora_config.lora.rank = 4;
  lora_config.lora.alpha = 8;
  lora_config.lora.targets = {"q_proj", "v_proj", "down_proj"};

  auto refused = [&](std::function<void(fsdp::models::LoraSpec&)> edit) {
    auto config = lora_config;
    edit(config.lora);
    try {
      config.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused([](auto& l) { l.targets = {"qkv_proj"}; }).find("lora target 'qkv_proj' matches no layer"),
            std::string::npos);
  EXPECT_NE(refused([](auto& l) { l.rank = -2; }).find("lora rank must be positive"), std::string::npos);
  EXPECT_NE(refused([](auto& l) { l.targets.clear(); }).find("needs target layers"), std::string::npos);
}

// bf16 linear by fp32 GEMMs (train.bf16_matmul = "fp32", models/bf16_matmul.h) is the composition
// it stands for, forward and backward, bit for bit: widen the bf16 operands, at::linear in fp32,
// round to bf16 (autograd's own backward of that composition is the reference). Against libtorch's
// bf16 GEMM (the same function, another summation order) it agrees to bf16's rounding.
TEST(Bf16Matmul, Fp32GemmsAreTheWidenedCompositionExactly) {
  torch::manual_seed(7);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const at::Tensor x0 = torch::randn({2, 5, 48}, bf16), w0 = torch::randn({24, 48}, bf16),
                   b0 = torch::randn({24}, bf16);
  const at::Tensor g = torch::randn({2, 5, 24}, bf16);
  struct Result {
    at::Tensor y, gx, gw, gb;
  };
  auto run = [&](const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& f) {
    at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
               b = b0.clone().requires_grad_(true);
    at::Tensor y = f(x, w, b);
    y.backward(g);
    return Result{y.detach(), x.grad(), w.grad(), b.grad()};
  };
  fsdp::models::set_bf16_matmul(fsdp::models::Bf16Matmul::Fp32);
  const Result widened = run([](auto& x, auto& w, auto& b) { return fsdp::models::linear(x, w, b); });
  fsdp::models::set_bf16_matmul(fsdp::models::Bf16Matmul::Native);
  const Result composed = run([](auto& x, auto& w, auto& b) {
    return at::linear(x.to(torch::kFloat), w.to(torch::kFloat), b.to(torch::kFloat)).to(torch::kBFloat16);
  });
  const Result native = run([](auto& x, auto& w, auto& b) { return fsdp::models::linear(x, w, b); });
  for (auto [got, want, what] : {std::tuple{widened.y, composed.y, "y"},
                                 {widened.gx, composed.gx, "dx"},
                                 {widened.gw, composed.gw, "dW"},
                                 {widened.gb, composed.gb, "db"}}) {
    ASSERT_EQ(got.scalar_type(), torch::kBFloat16) << what;
    EXPECT_TRUE(torch::equal(got, want)) << what << ": max difference " << (got - want).abs().max().item<float>();
  }
  // Native: libtorch's bf16 GEMM. Values are O(7) (sums of 48 or 10 products of N(0, 1) values):
  // within 2 bf16 steps (2^-7 relative) of the widened result.
  for (auto [got, want, what] :
       {std::tuple{native.y, widened.y, "y"}, {native.gx, widened.gx, "dx"}, {native.gw, widened.gw, "dW"}}) {
    EXPECT_TRUE(torch::allclose(got.to(torch::kFloat), want.to(torch::kFloat), 2.0 / 128, 0.05)) << what;
  }
  fsdp::models::set_bf16_matmul(fsdp::models::Bf16Matmul::Fp32);
  {  // No bias, and a frozen weight (a LoRA base): only x's gradient.
    at::Tensor x = x0.clone().requires_grad_(true);
    fsdp::models::linear(x, w0).backward(g);
    at::Tensor xr = x0.clone().requires_grad_(true);
    at::linear(xr.to(torch::kFloat), w0.to(torch::kFloat)).to(torch::kBFloat16).backward(g);
    EXPECT_TRUE(torch::equal(x.grad(), xr.grad()));
  }
  // fp32 inputs take at::linear whatever the mode.
  const at::Tensor xf = x0.to(torch::kFloat), wf = w0.to(torch::kFloat);
  EXPECT_TRUE(torch::equal(fsdp::models::linear(xf, wf), at::linear(xf, wf)));
  fsdp::models::set_bf16_matmul(fsdp::models::Bf16Matmul::Native);
}

// train.bf16_matmul = "auto"'s start-up measurement: both ways timed on the shapes given (each
// positive), the faster named by the smaller time, the process-wide mode it found restored
// whichever it was (a measurement that left "fp32" set would silently decide the run), and the
// global random generator untouched (it drives dropout; a resumed run restores it exactly).
TEST(Bf16Matmul, StartUpTimingMeasuresBothWaysAndRestoresTheMode) {
  const std::vector<fsdp::models::LinearShape> shapes = {{64, 32, 48}, {64, 48, 32}};
  for (auto mode : {fsdp::models::Bf16Matmul::Fp32, fsdp::models::Bf16Matmul::Native}) {
    fsdp::models::set_bf16_matmul(mode);
    torch::manual_seed(7);
    const at::Tensor expected = torch::randn({4});
    torch::manual_seed(7);
    const fsdp::models::Bf16MatmulTimes times = fsdp::models::time_bf16_matmuls(shapes, 1);
    EXPECT_TRUE(torch::equal(torch::randn({4}), expected)) << "the timing drew from the global generator";
    EXPECT_GT(times.native_seconds, 0.0);
    EXPECT_GT(times.fp32_seconds, 0.0);
    EXPECT_EQ(fsdp::models::bf16_matmul(), mode);
  }
  EXPECT_EQ((fsdp::models::Bf16MatmulTimes{2.0, 1.0}.faster()), fsdp::models::Bf16Matmul::Fp32);
  EXPECT_EQ((fsdp::models::Bf16MatmulTimes{1.0, 2.0}.faster()), fsdp::models::Bf16Matmul::Native);
  fsdp::models::set_bf16_matmul(fsdp::models::Bf16Matmul::Native);
}

}  // namespace model_tests

namespace model_tests {

// CLIP: OpenAI's published shapes as transformers' CLIPModel counts them (openai/clip-vit-base-patch32
// and clip-vit-large-patch14: position_ids are buffers, logit_scale one parameter). The small sizes
// are checked against their built models in FormulaMatchesBuiltModels.
TEST(ModelZoo, ClipParameterCounts) {
  EXPECT_EQ(parameter_count(model_config("clip-vit-b32")), 151277313);
  EXPECT_EQ(parameter_count(model_config("clip-vit-l14")), 427616513);
}

// Each caption is read at its first end-of-text token: what follows it (padding, or anything)
// changes nothing, and the embeddings have unit norm; images and captions may differ in number.
TEST(Models, ClipReadsEachCaptionAtItsFirstEndOfText) {
  const auto config = std::get<fsdp::models::ClipConfig>(model_config("clip-test"));
  torch::manual_seed(3);
  auto built = fsdp::models::build_model(config);
  torch::NoGradGuard no_grad;
  at::Tensor ids = torch::randint(32, 127, {3, config.context}, at::kLong);
  ids.index_put_({0, 5}, config.eos_token);
  ids.index_put_({1, 9}, config.eos_token);
  ids.index_put_({2, config.context - 1}, config.eos_token);
  at::Tensor changed = ids.clone();
  changed.index_put_({0, 20}, 40);  // after row 0's first eos
  changed.index_put_({1, 30}, config.eos_token);
  const at::Tensor images = torch::randn({2, 1, 28, 28});
  const auto out = built.contrastive(images, ids), again = built.contrastive(images, changed);
  EXPECT_EQ(out.image_embeds.sizes(), (std::vector<int64_t>{2, config.projection_dim}));
  EXPECT_EQ(out.text_embeds.sizes(), (std::vector<int64_t>{3, config.projection_dim}));
  EXPECT_LE((out.text_embeds - again.text_embeds).abs().max().item<double>(), 0.0);
  EXPECT_NEAR(out.image_embeds.norm(2, 1).min().item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(out.scale.item<double>(), 1.0 / 0.07, 1e-4);
  changed.index_put_({2, 3}, 40);  // before row 2's eos: its feature moves
  EXPECT_GT((built.contrastive(images, changed).text_embeds[2] - out.text_embeds[2]).abs().max().item<double>(), 1e-4);
}

// LLaVA: llava-hf/llava-1.5-7b-hf's shape as transformers' LlavaForConditionalGeneration counts it
// (7,063,427,072, built on the meta device; tests/hf/check_llava.py checks it again), and the small
// sizes as it counts theirs (their built models: FormulaMatchesBuiltModels).
TEST(ModelZoo, LlavaParameterCounts) {
  EXPECT_EQ(parameter_count(model_config("llava-1.5-7b")), 7063427072);
  EXPECT_EQ(parameter_count(model_config("llava-test")), 56576);
  EXPECT_EQ(parameter_count(model_config("llava-fmnist")), 1641472);
}

// The image's features stand where its tokens are: an image changes the logits from its first
// token on and not before (causal), wherever the tokens sit in the row; a row with another number
// of image tokens is refused, naming the count.
TEST(Models, LlavaReadsTheImageAtItsTokens) {
  const auto config = std::get<fsdp::models::LlavaConfig>(model_config("llava-test"));
  torch::manual_seed(3);
  auto built = fsdp::models::build_model(config);
  torch::NoGradGuard no_grad;
  at::Tensor ids = torch::randint(0, 256, {2, 40}, at::kLong);
  ids.narrow(1, 5, 16).fill_(config.image_token);  // row 0 and 1: tokens 5..20
  ids[1].narrow(0, 5, 16).random_(0, 256);
  ids[1].narrow(0, 12, 16).fill_(config.image_token);  // row 1: tokens 12..27
  const at::Tensor images = torch::randn({2, 1, 28, 28});
  at::Tensor other = images.clone();
  other[1].add_(1.0);
  const at::Tensor a = built.image_text_logits(images, ids), b = built.image_text_logits(other, ids);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{2, 40, config.text.vocab}));
  EXPECT_TRUE(a[0].equal(b[0])) << "row 0's image did not change";
  EXPECT_LE((a[1].narrow(0, 0, 12) - b[1].narrow(0, 0, 12)).abs().max().item<double>(), 0.0) << "before row 1's image";
  EXPECT_GT((a[1].narrow(0, 12, 28) - b[1].narrow(0, 12, 28)).abs().max().item<double>(), 1e-4)
      << "from row 1's image on";
  at::Tensor short_row = ids.clone();
  short_row[0][5] = 65;
  try {
    built.image_text_logits(images, short_row);
    FAIL() << "expected a refusal";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("each row must hold 16 image tokens"), std::string::npos) << e.what();
  }
}

}  // namespace model_tests
