#include "fsdp/train/sharded_model.h"

#include <torch/torch.h>

#include "fsdp/comm/device_group.h"
#include "fsdp/compat.h"
#include "fsdp/comm/launch.h"
#include "fsdp/comm/nccl_process_group.h"
#include "fsdp/runtime/cpu_features.h"

namespace fsdp::train {

runtime::FsdpOptions fsdp_options(const TrainConfig& c) {
  runtime::FsdpOptions options;
  static_cast<runtime::ShardingSettings&>(options) = c.fsdp;
  if (c.fsdp.wrap == UnitWrap::Block) options.wrap_policy.module_types = models::block_type_names(c.model);
  if (c.fsdp.wrap == UnitWrap::MinParams) options.wrap_policy.min_params = c.fsdp.min_params;
  if (c.fsdp.wrap != UnitWrap::Root && c.fsdp.wrap != UnitWrap::Tower && c.fsdp.embedding_units) {
    options.wrap_policy.module_paths = models::embedding_and_head_paths(c.model);
  }
  if (c.fsdp.wrap == UnitWrap::Tower) {
    // Each tower one unit, its embeddings and blocks inside (one gather a tower a pass); what lies
    // outside the towers (an image-text model's decoder) keeps a unit per block and embedding, as torchtitan wraps
    // a VLM's decoder.
    const std::vector<std::string> towers = models::tower_paths(c.model);
    auto inside_a_tower = [&](const std::string& path) {
      for (const auto& tower : towers) {
        if (path == tower || path.rfind(tower + ".", 0) == 0) return true;
      }
      return false;
    };
    options.wrap_policy.module_paths = towers;
    options.wrap_policy.module_types = models::family_of(c.model).block_types_outside_towers(c.model);
    if (c.fsdp.embedding_units) {
      for (const std::string& path : models::embedding_and_head_paths(c.model)) {
        if (!inside_a_tower(path)) options.wrap_policy.module_paths.push_back(path);
      }
    }
  }
  // A LoRA base is frozen: its shards may be kept in bf16 (gathered as bf16, widened after), or
  // (QLoRA) its blocks' linear weights in NF4 and the rest of it in bf16.
  const models::LoraSpec* lora = models::lora_spec(c.model);
  using models::LoraBaseDtype;
  const LoraBaseDtype base_dtype =
      lora != nullptr && lora->enabled() ? resolved_lora_base_dtype(c) : LoraBaseDtype::Float32;
  if (base_dtype == LoraBaseDtype::BFloat16 || base_dtype == LoraBaseDtype::Nf4) options.frozen_dtype = at::kBFloat16;
  if (base_dtype == LoraBaseDtype::Nf4) {
    // Names inside their unit ("self_attn.q_proj.weight"): a linear layer's weight, as
    // bitsandbytes' Linear4bit replaces every linear layer but the head.
    options.frozen_nf4 = [layers = models::linear_layers(c.model)](const std::string& name, const at::Tensor& p) {
      if (p.dim() != 2) return false;
      for (const std::string& layer : layers) {
        const std::string suffix = layer + ".weight";
        if (name == suffix || (name.size() > suffix.size() &&
                               name.compare(name.size() - suffix.size() - 1, suffix.size() + 1, "." + suffix) == 0)) {
          return true;
        }
      }
      return false;
    };
  }
  return options;
}

models::AttentionPath attention_path_for(const TrainConfig& c) {
  if (c.attention) return *c.attention;
  const bool lower_precision = c.fsdp.param_dtype != at::kFloat;
  return lower_precision && c.device == c10::DeviceType::CPU ? models::AttentionPath::FusedFp32
                                                             : models::AttentionPath::Fused;
}

models::Bf16Matmul bf16_matmul_for(const TrainConfig& c) {
  if (c.bf16_matmul) return *c.bf16_matmul;
  return c.device == c10::DeviceType::CPU && !runtime::cpu_has_bf16_instructions() ? models::Bf16Matmul::Fp32
                                                                                   : models::Bf16Matmul::Native;
}

namespace {

// The model of `config` with the vocabulary given, sharded over `group` as it is built, on the
// device `options` name: the CPU, a GPU, or the meta device.
ShardedModel build_and_shard(const TrainConfig& config, int64_t vocab, const comm::ProcessGroupPtr& group,
                             runtime::FsdpOptions options) {
  ShardedModel sharded;
  sharded.config = config.model;
  models::family_of(sharded.config).take_data_vocab(sharded.config, vocab);
  // NCCL over the same ranks for a GPU, bootstrapped through `group` (host tensors still go
  // there); MPI's `group` itself for the CPU; FSDP_DEVICE_COMM=staged: the test backend; nothing
  // moved for the meta device.
  const comm::ProcessGroupPtr fsdp_group = comm::make_device_group(group, options.device);
  torch::manual_seed(config.seed);  // the model is built on the CPU, the same on every rank, whatever the device
  runtime::BuildListener listener(fsdp_group, options);
  sharded.model = models::build_model(sharded.config);
  sharded.state = runtime::make_fsdp_state(sharded.model.module, fsdp_group, options, listener.take_units());
  return sharded;
}

runtime::FsdpOptions options_with_vocab(const TrainConfig& config, int64_t vocab) {
  TrainConfig resolved = config;
  models::family_of(resolved.model).take_data_vocab(resolved.model, vocab);
  return fsdp_options(resolved);
}

}  // namespace

ShardedModel build_sharded_model(const TrainConfig& config, int64_t vocab, const comm::ProcessGroupPtr& group,
                                 bool weights_loaded_after) {
  check_this_build_runs(config);  // a GPU run's config on a CPU build (fsdp-ckpt, the tests), said plainly
  runtime::FsdpOptions options = options_with_vocab(config, vocab);
  options.nf4_values_loaded_later = weights_loaded_after;
  if (config.device == c10::DeviceType::CUDA) {
    // The launcher's local rank picks the GPU (comm/device_assignment.h).
    options.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(comm::local_device_index()));
  }
  return build_and_shard(config, vocab, group, std::move(options));
}

ShardedModel construct_on_meta_device(const TrainConfig& config, int64_t vocab, const comm::ProcessGroupPtr& group) {
  runtime::FsdpOptions options = options_with_vocab(config, vocab);
  options.device = at::Device(at::kMeta);
  options.nf4_values_loaded_later = true;  // no values to quantize
  compat::MetaDeviceConstruction on_meta;
  return build_and_shard(config, vocab, group, std::move(options));
}

}  // namespace fsdp::train
