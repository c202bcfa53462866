#include "fsdp/models/layers.h"

#include "fsdp/nn/hooks.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "fsdp/compat.h"
#include "fsdp/models/bf16_matmul.h"
#include "fsdp/models/fused_ops.h"
#include "fsdp/models/linear_cross_entropy.h"
#include "fsdp/models/stacked_linear.h"

namespace fsdp::models {

std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t t, int64_t head_dim, double theta, const RopeScaling& scaling) {
  TORCH_CHECK(head_dim % 2 == 0, "rotary_tables: head_dim ", head_dim, " must be even");
  // fp32 like transformers' _compute_default_rope_parameters: 1 / theta^(arange(0, hd, 2) / hd).
  auto exponents = torch::arange(0, head_dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(head_dim);
  auto inverse_frequency = 1.0 / torch::pow(theta, exponents);  // [hd/2] fp32
  if (scaling.enabled) {
    // transformers' _compute_llama3_parameters, step for step.
    const double old_context = static_cast<double>(scaling.original_context);
    const double low_freq_wavelength = old_context / scaling.low_freq_factor;
    const double high_freq_wavelength = old_context / scaling.high_freq_factor;
    auto wavelength = 2.0 * M_PI / inverse_frequency;
    auto scaled = torch::where(wavelength > low_freq_wavelength, inverse_frequency / scaling.factor, inverse_frequency);
    auto smooth =
        (old_context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
    auto smoothed = (1.0 - smooth) * scaled / scaling.factor + smooth * scaled;
    auto medium = (wavelength >= high_freq_wavelength).logical_and(wavelength <= low_freq_wavelength);
    inverse_frequency = torch::where(medium, smoothed, scaled);
  }
  auto angles = torch::outer(torch::arange(t, torch::kFloat), inverse_frequency);  // [t, hd/2] fp32
  angles = torch::cat({angles, angles}, 1);                                        // [t, hd]
  return {angles.cos(), angles.sin()};
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) { return rms_norm(x, weight, eps); }

const std::vector<std::string>& gated_block_linear_layers() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

int64_t gated_block_lora_parameters(const LoraSpec& spec, int64_t layers, int64_t dim, int64_t q, int64_t kv,
                                    int64_t ffn) {
  if (!spec.enabled()) return 0;
  int64_t per_layer = 0;
  auto add = [&](const char* name, int64_t in, int64_t out) {
    if (spec.targets_layer(name)) per_layer += spec.rank * (in + out);
  };
  add("q_proj", dim, q), add("k_proj", dim, kv), add("v_proj", dim, kv), add("o_proj", q, dim);
  add("gate_proj", dim, ffn), add("up_proj", dim, ffn), add("down_proj", ffn, dim);
  return layers * per_layer;
}

bool LoraSpec::targets_layer(const std::string& name) const {
  if (all_linear()) return true;  // every AdaptedLinear is one of the family's linear layers
  for (const auto& target : targets) {
    if (name == target) return true;
  }
  return false;
}

double LoraSpec::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

std::vector<std::string> LoraSpec::target_layers(const std::vector<std::string>& layers) const {
  return all_linear() ? layers : targets;
}

std::vector<std::string> LoraSpec::parse_targets(const std::string& text) {
  std::vector<std::string> names;
  std::string name;
  for (char ch : text + " ") {
    if (ch == ' ' || ch == ',') {
      if (!name.empty()) names.push_back(name);
      name.clear();
    } else {
      name += ch;
    }
  }
  return names;
}

void LoraSpec::validate(const char* family, const std::vector<std::string>& layers) const {
  if (rank == 0 && targets.empty()) return;
  if (rank <= 0)
    throw std::invalid_argument(std::string(family) + ": lora rank must be positive, got " + std::to_string(rank));
  if (targets.empty()) throw std::invalid_argument(std::string(family) + ": lora needs target layers");
  if (!(alpha > 0.0)) throw std::invalid_argument(std::string(family) + ": lora alpha must be positive");
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw std::invalid_argument(std::string(family) + ": lora dropout must be in [0, 1)");
  if (all_linear()) return;
  for (const auto& target : targets) {
    if (target == kAllLinear) {
      throw std::invalid_argument(std::string(family) +
                                  ": lora target 'all-linear' means every linear layer: give it alone");
    }
    bool known = false;
    for (const auto& layer : layers) known = known || layer == target;
    if (!known) {
      std::string names;
      for (const auto& layer : layers) names += (names.empty() ? "" : ", ") + layer;
      throw std::invalid_argument(std::string(family) + ": lora target '" + target +
                                  "' matches no layer (its linear layers: " + names + ")");
    }
  }
}

AdaptedLinearImpl::AdaptedLinearImpl(int64_t in, int64_t out, bool with_bias) {
  weight = register_parameter("weight", torch::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}));
  // torch::nn::Linear's reset_parameters, draw for draw, so a model's initial values do not change.
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void AdaptedLinearImpl::add_adapter(const LoraSpec& spec) {
  const int64_t in = weight.size(1), out = weight.size(0);
  lora_dropout = register_module("lora_dropout", torch::nn::Dropout(spec.dropout));
  lora_A = register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in, spec.rank).bias(false)));
  lora_B = register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(spec.rank, out).bias(false)));
  torch::NoGradGuard no_grad;
  lora_B->weight.zero_();
  lora_scale = spec.scale();
}

at::Tensor AdaptedLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = models::linear(x, weight, bias);
  if (lora_A.is_empty()) return y;
  return y + adapter_term(x);
}

at::Tensor AdaptedLinearImpl::adapter_term(const at::Tensor& x) {
  if (lora_A.is_empty()) return {};
  return models::linear(models::linear(lora_dropout(x), lora_A->weight), lora_B->weight) * lora_scale;
}

namespace {

// The layers' base weights where they can be one GEMM (no bias, back to back, fused ops on); empty otherwise.
std::vector<at::Tensor> stackable_weights(const std::vector<AdaptedLinearImpl*>& linears) {
  if (!fused_ops_enabled()) return {};
  std::vector<at::Tensor> weights;
  for (const AdaptedLinearImpl* linear : linears) {
    if (linear->bias.defined()) return {};
    weights.push_back(linear->weight);
  }
  return weights_back_to_back(weights) ? weights : std::vector<at::Tensor>{};
}

}  // namespace

at::Tensor stacked_projections(const at::Tensor& x, const std::vector<AdaptedLinearImpl*>& linears) {
  for (const AdaptedLinearImpl* linear : linears) {
    if (!linear->lora_A.is_empty()) return {};
  }
  const std::vector<at::Tensor> weights = stackable_weights(linears);
  return weights.empty() ? at::Tensor() : stacked_linear(x, weights);
}

std::vector<at::Tensor> projections(const at::Tensor& x, const std::vector<AdaptedLinearImpl*>& linears) {
  const std::vector<at::Tensor> weights = stackable_weights(linears);
  std::vector<at::Tensor> out;
  if (weights.empty()) {
    for (AdaptedLinearImpl* linear : linears) out.push_back(linear->forward(x));
    return out;
  }
  std::vector<int64_t> widths;
  for (const at::Tensor& weight : weights) widths.push_back(weight.size(0));
  out = stacked_linear(x, weights).split_with_sizes(widths, -1);
  for (size_t i = 0; i < linears.size(); ++i) {
    if (!linears[i]->lora_A.is_empty()) out[i] = out[i] + linears[i]->adapter_term(x);
  }
  return out;
}

void apply_lora(torch::nn::Module& module, const LoraSpec& spec) {
  if (!spec.enabled()) return;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    auto* linear = item.value()->as<AdaptedLinear>();
    if (linear == nullptr) continue;
    const std::string& path = item.key();
    const std::string name = path.substr(path.find_last_of('.') == std::string::npos ? 0 : path.find_last_of('.') + 1);
    if (spec.targets_layer(name)) linear->add_adapter(spec);
  }
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.key().find("lora_") == std::string::npos) item.value().set_requires_grad(false);
  }
}

void require_positive(const char* family, int64_t value, const char* field) {
  if (value <= 0) {
    throw std::invalid_argument(std::string(family) + ": " + field + " must be positive, got " + std::to_string(value));
  }
}

TokenEmbeddingImpl::TokenEmbeddingImpl(int64_t vocab, int64_t dim) {
  weight = register_parameter("weight", torch::empty({vocab, dim}));
  // The same draw as torch::nn::Embedding's reset(), so a model keeps its initial values.
  torch::nn::init::normal_(weight);
}

at::Tensor TokenEmbeddingImpl::forward(const at::Tensor& ids_or_hidden) {
  if (!at::isFloatingType(ids_or_hidden.scalar_type())) {
    // A lookup's backward scatters the rows' gradients by index: it keeps the table's size, not its values.
    fsdp::nn::backward_reads_no_parameters(*this);
    return at::embedding(weight, ids_or_hidden);
  }
  return models::linear(ids_or_hidden, weight);
}

at::Tensor TokenEmbeddingImpl::forward(const at::Tensor& hidden, const at::Tensor& targets, const ChunkedLoss& chunks) {
  fsdp::nn::backward_reads_no_parameters(*this);  // the chunked loss computes its gradients in forward
  return linear_cross_entropy_sum(hidden.reshape({-1, hidden.size(-1)}), weight, targets.reshape(-1), chunks);
}

LmHeadImpl::LmHeadImpl(int64_t dim, int64_t vocab) {
  weight = register_parameter("weight", torch::empty({vocab, dim}));
  // torch::nn::Linear's draw (kaiming-uniform, a = sqrt(5)), so the random stream after it is unchanged.
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
}

at::Tensor LmHeadImpl::forward(const at::Tensor& hidden) { return models::linear(hidden, weight); }

at::Tensor LmHeadImpl::forward(const at::Tensor& hidden, const at::Tensor& targets, const ChunkedLoss& chunks) {
  fsdp::nn::backward_reads_no_parameters(*this);  // the chunked loss computes its gradients in forward
  return linear_cross_entropy_sum(hidden.reshape({-1, hidden.size(-1)}), weight, targets.reshape(-1), chunks);
}

void init_normal(torch::nn::Module& module, double std) {
  torch::NoGradGuard no_grad;
  // include_self=false: this runs inside constructors, before the module is owned by a shared_ptr;
  // the module itself is a container, not a Linear or an Embedding.
  for (auto& child : module.modules(/*include_self=*/false)) {
    if (auto* linear = child->as<torch::nn::Linear>()) {
      linear->weight.normal_(0.0, std);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* adapted = child->as<AdaptedLinear>()) {
      adapted->weight.normal_(0.0, std);
      if (adapted->bias.defined()) adapted->bias.zero_();
    } else if (auto* embedding = child->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0.0, std);
    } else if (auto* tokens = child->as<TokenEmbedding>()) {
      tokens->weight.normal_(0.0, std);
    }
  }
}

}  // namespace fsdp::models
