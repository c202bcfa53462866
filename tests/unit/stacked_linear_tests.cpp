// Linear layers reading one input as one GEMM (fsdp/models/stacked_linear.h, layers.h's
// projections), on the CPU and, where this build and machine have one (gpu-check's `kernels`
// stage sets FSDP_TEST_DEVICE=cuda), the GPU.
//
// The weights are put back to back in one buffer as an FSDP unit's gathered parameters are
// (shard/flat_param.cpp: each parameter keeps its tensor, its data a view of the buffer). The
// criterion: the stacked product and its gradients equal each layer's own product and gradients
// up to the GEMM's summation order (fp32: 1e-5 of the largest magnitude; bf16: 1e-2, a few bf16
// ulps), where a wrong split of the stacked rows (a weight's gradient taken from its neighbour's
// rows, the input gradient missing a part) is off by O(1).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/fused_ops.h"
#include "fsdp/models/layers.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/stacked_linear.h"
#include "test_devices.h"

namespace stacked_linear_tests {

// Every parameter of `module` (in registration order) made a view of one buffer, as FlatParam
// does; returns the buffer.
at::Tensor put_in_one_buffer(torch::nn::Module& module, const at::TensorOptions& options) {
  torch::NoGradGuard no_grad;
  auto params = module.parameters();
  int64_t numel = 0;
  for (const at::Tensor& p : params) numel += p.numel();
  at::Tensor buffer = torch::empty({numel}, options);
  int64_t offset = 0;
  for (at::Tensor& p : params) {
    at::Tensor view = buffer.narrow(0, offset, p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
    offset += p.numel();
  }
  return buffer;
}

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

void expect_close(const at::Tensor& stacked, const at::Tensor& separate, const std::string& what) {
  ASSERT_EQ(stacked.sizes(), separate.sizes()) << what;
  const double tolerance = (stacked.scalar_type() == at::kFloat ? 1e-5 : 1e-2) * max_abs(separate.to(at::kFloat));
  EXPECT_LE(max_abs((stacked - separate).to(at::kFloat)), tolerance) << what;
}

// bf16 both ways train.bf16_matmul multiplies: libtorch's bf16 GEMM and fp32 GEMMs on the widened
// operands (bf16_matmul.h), against the separate layers computed the same way (models::linear).
// Both ways accumulate in fp32, so this holds the widened path to the right values, not to being
// widened (the two agree within the bf16 tolerance).
TEST(StackedLinear, OneGemmEqualsEachLayersProductAndGradients) {
  struct Mode {
    at::ScalarType dtype;
    fsdp::models::Bf16Matmul matmul;
  };
  for (const at::Device& device : fsdp_tests::test_devices()) {
    if (!fsdp_tests::usable(device)) continue;
    for (const Mode mode :
         {Mode{at::kFloat, fsdp::models::Bf16Matmul::Native}, Mode{at::kBFloat16, fsdp::models::Bf16Matmul::Native},
          Mode{at::kBFloat16, fsdp::models::Bf16Matmul::Fp32}}) {
      const at::ScalarType dtype = mode.dtype;
      SCOPED_TRACE(std::string(device.is_cuda() ? "cuda " : "cpu ") + c10::toString(dtype) +
                   (mode.matmul == fsdp::models::Bf16Matmul::Fp32 ? ", widened" : ""));
      fsdp::models::set_bf16_matmul(mode.matmul);
      torch::manual_seed(3);
      const auto options = at::TensorOptions().device(device).dtype(dtype);
      const int64_t in = 24, q = 32, kv = 8;  // q, k, v of 4 heads and 1 key/value head of 8
      const at::Tensor buffer = torch::randn({(q + 2 * kv) * in}, options);
      std::vector<at::Tensor> stacked_weights, own_weights;
      int64_t offset = 0;
      for (int64_t rows : {q, kv, kv}) {
        stacked_weights.push_back(buffer.narrow(0, offset, rows * in).view({rows, in}).detach().requires_grad_(true));
        own_weights.push_back(stacked_weights.back().detach().clone().requires_grad_(true));
        offset += rows * in;
      }
      ASSERT_TRUE(fsdp::models::weights_back_to_back(stacked_weights));
      ASSERT_FALSE(fsdp::models::weights_back_to_back(own_weights));
      const at::Tensor x0 = torch::randn({2, 5, in}, options);
      at::Tensor x_stacked = x0.clone().requires_grad_(true), x_own = x0.clone().requires_grad_(true);

      const at::Tensor y = fsdp::models::stacked_linear(x_stacked, stacked_weights);
      ASSERT_EQ(y.sizes(), (at::IntArrayRef{2, 5, q + 2 * kv}));
      std::vector<at::Tensor> parts;
      for (const at::Tensor& w : own_weights) parts.push_back(fsdp::models::linear(x_own, w));
      expect_close(y, at::cat(parts, -1), "forward");

      const at::Tensor grad = torch::randn(y.sizes(), options);
      y.backward(grad);
      at::cat(parts, -1).backward(grad);
      expect_close(x_stacked.grad(), x_own.grad(), "gradient of x");
      for (size_t i = 0; i < 3; ++i) {
        expect_close(stacked_weights[i].grad(), own_weights[i].grad(), "gradient of weight " + std::to_string(i));
      }
      fsdp::models::set_bf16_matmul(fsdp::models::Bf16Matmul::Native);
    }
  }
}

TEST(StackedLinear, RefusesWeightsNotBackToBack) {
  const at::Tensor buffer = torch::randn({100});
  const at::Tensor a = buffer.narrow(0, 0, 20).view({5, 4}), b = buffer.narrow(0, 20, 12).view({3, 4});
  const at::Tensor gap = buffer.narrow(0, 24, 12).view({3, 4}), narrower = buffer.narrow(0, 20, 9).view({3, 3});
  EXPECT_TRUE(fsdp::models::weights_back_to_back({a, b}));
  EXPECT_FALSE(fsdp::models::weights_back_to_back({b, a})) << "out of order";
  EXPECT_FALSE(fsdp::models::weights_back_to_back({a, gap})) << "a gap between them";
  EXPECT_FALSE(fsdp::models::weights_back_to_back({a, narrower})) << "another input width";
  EXPECT_FALSE(fsdp::models::weights_back_to_back({a, b.clone()})) << "another buffer";
  EXPECT_FALSE(fsdp::models::weights_back_to_back({a})) << "one weight is no stack";
  try {
    fsdp::models::stacked_linear(torch::randn({2, 4}), {a, gap});
    ADD_FAILURE() << "a gap was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("weight 1"), std::string::npos) << e.what();
  }
}

// Backward checks the stack again: a weight given other memory after forward is refused, not read
// from the rows where it used to be.
TEST(StackedLinear, BackwardRefusesWeightsMovedApart) {
  const at::Tensor buffer = torch::randn({32});
  at::Tensor a = buffer.narrow(0, 0, 16).view({4, 4}).detach().requires_grad_(true);
  at::Tensor b = buffer.narrow(0, 16, 16).view({4, 4}).detach().requires_grad_(true);
  const at::Tensor y = fsdp::models::stacked_linear(torch::randn({3, 4}), {a, b});
  {
    torch::NoGradGuard no_grad;
    b.set_data(torch::randn({4, 4}));
  }
  EXPECT_THROW(y.sum().backward(), std::logic_error);
}

// A Llama block whose parameters are one buffer (an FSDP unit's) computes q, k, v and gate, up as
// one GEMM each: 4 products forward where separate parameters take 7, and 8 backward where they
// take 14; its outputs and every parameter's gradient are the separate block's.
TEST(StackedLinear, ALlamaBlockInOneBufferTakesFourGemmsNotSeven) {
  fsdp::models::LlamaConfig config;
  config.vocab = 64, config.context = 16, config.dim = 32, config.heads = 4, config.kv_heads = 2, config.layers = 1;
  config.ffn_hidden = 48;
  for (const at::Device& device : fsdp_tests::test_devices()) {
    if (!fsdp_tests::usable(device)) continue;
    SCOPED_TRACE(device.is_cuda() ? "cuda" : "cpu");
    torch::manual_seed(4);
    fsdp::models::LlamaBlock separate(config), stacked(config);
    {
      torch::NoGradGuard no_grad;
      auto from = separate->parameters(), to = stacked->parameters();
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    separate->to(device);
    stacked->to(device);
    put_in_one_buffer(*stacked, at::TensorOptions().device(device));
    auto [cos, sin] = fsdp::models::rotary_tables(config.context, config.head_size(), config.rope_theta);
    cos = cos.narrow(0, 0, 8).to(device), sin = sin.narrow(0, 0, 8).to(device);
    const at::Tensor x = torch::randn({2, 8, config.dim}).to(device),
                     grad = torch::randn({2, 8, config.dim}).to(device);

    // Not thread-local: on CUDA, backward runs on the autograd engine's device thread, which the
    // callback follows.
    static std::atomic<int64_t> gemms{0};
    const auto handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
          const std::string name = fn.name();
          if (name == "aten::mm" || name == "aten::addmm") ++gemms;
          return nullptr;
        }));
    auto run = [&](fsdp::models::LlamaBlock& block) {
      gemms = 0;
      const at::Tensor y = block->forward(x, cos, sin, {});
      const int64_t forward = gemms.load();
      gemms = 0;
      y.backward(grad);
      return std::make_tuple(y.detach(), forward, gemms.load());
    };
    const auto [y_separate, forward_separate, backward_separate] = run(separate);
    const auto [y_stacked, forward_stacked, backward_stacked] = run(stacked);
    at::removeCallback(handle);
    EXPECT_EQ(forward_separate - forward_stacked, 3)
        << forward_separate << " products forward, stacked " << forward_stacked;
    EXPECT_EQ(backward_separate - backward_stacked, 6)
        << backward_separate << " products backward, stacked " << backward_stacked;
    expect_close(y_stacked, y_separate, "block output");
    const auto named_separate = separate->named_parameters(), named_stacked = stacked->named_parameters();
    for (const auto& item : named_separate) {
      expect_close(named_stacked[item.key()].grad(), item.value().grad(), "gradient of " + item.key());
    }
  }
}

// projections() gives each layer's output: narrow views of one product where the weights stack,
// an adapter's term added to its own layer's part only; with fused operations off
// (train.fused_ops = false: the references, for comparisons) each layer computes on its own.
TEST(StackedLinear, ProjectionsAreEachLayersOutput) {
  fsdp::models::AdaptedLinear a(4, 3, false), b(4, 2, false);
  fsdp::models::LoraSpec spec;
  spec.rank = 2, spec.targets = {"b"};
  b->add_adapter(spec);
  const at::Tensor buffer = torch::randn({20});
  {
    torch::NoGradGuard no_grad;
    a->weight.set_data(buffer.narrow(0, 0, 12).view({3, 4}));
    b->weight.set_data(buffer.narrow(0, 12, 8).view({2, 4}));
    b->lora_B->weight.normal_();  // zeros at first: the term would add nothing
  }
  const at::Tensor x = torch::randn({5, 4});
  EXPECT_FALSE(fsdp::models::stacked_projections(x, {a.get(), b.get()}).defined()) << "b has an adapter";
  auto parts = fsdp::models::projections(x, {a.get(), b.get()});
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_TRUE(parts[0].is_view()) << "a's part: a narrow view of one product (b's: its view plus the term)";
  expect_close(parts[0], a->forward(x), "a, stacked");
  expect_close(parts[1], b->forward(x), "b with its adapter, stacked");
  EXPECT_GT(max_abs(b->adapter_term(x)), 0.0);

  fsdp::models::set_fused_ops(false);
  parts = fsdp::models::projections(x, {a.get(), b.get()});
  fsdp::models::set_fused_ops(true);
  EXPECT_TRUE(torch::equal(parts[0], a->forward(x)) && torch::equal(parts[1], b->forward(x))) << "fused ops off";
  EXPECT_FALSE(parts[0].is_view()) << "fused ops off: each layer's own product";
}

}  // namespace stacked_linear_tests
