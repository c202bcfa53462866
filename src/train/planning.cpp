#include "fsdp/train/planning.h"

#include <stdexcept>

#include "fsdp/train/sharded_model.h"
#include "training_data.h"

namespace fsdp::train {

plan::PlanInput plan_input(const TrainConfig& c, int ranks) {
  validate_for_world(c, ranks);
  if (c.fsdp.wrap == UnitWrap::Tower) {
    throw std::invalid_argument(
        "fsdp-plan models block units: fsdp.wrap = \"tower\" (each image or text tower one unit) is not modelled");
  }
  if (c.fsdp.wrap != UnitWrap::Block) {
    throw std::invalid_argument("fsdp-plan models block units: fsdp.wrap = \"" + std::string(enum_name(c.fsdp.wrap)) +
                                "\" is not modelled");
  }
  plan::PlanInput in;
  in.model = c.model;
  in.model_name = c.model_name;
  static_cast<runtime::ShardingSettings&>(in) = c.fsdp;
  in.async_checkpoint = c.checkpoint.async;
  in.embedding_units = c.fsdp.embedding_units && c.fsdp.wrap != UnitWrap::Root;
  in.optimizer = c.optimizer.name;
  // A language model's seq_len is resolved by now (0 -> its context); an image classifier has none (0): its tokens
  // are its patches and class token (plan::tokens_per_sample), and the planner needs only a positive value.
  in.seq_len = c.seq_len > 0 ? c.seq_len : 1;
  // An image-text model's rows are the chats the trainer writes (as long as the longest).
  if (models::family_of(c.model).task() == models::ModelTask::ImageText) {
    const data::ImageChatWriter chats = image_chat_writer(c.model);
    check_image_chats(c.model, chats);
    in.seq_len = chats.row_length();
  }
  in.loss_chunk_tokens = c.loss_chunk_tokens;
  in.fused_ops = c.fused_ops;
  const models::AttentionPath attention = attention_path_for(c);
  in.fused_attention = attention != models::AttentionPath::Math;
  in.attention_fp32 = attention == models::AttentionPath::FusedFp32 && c.fsdp.param_dtype != at::kFloat;
  in.micro_batches = c.micro_batches;
  in.sync_each_micro_batch = c.sync_each_micro_batch;
  in.ranks = ranks;
  // lora.base_dtype "auto" as the run resolves it (model.init_from's weights' own dtype) where there
  // are adapters; without them nothing is stored apart, and init_from need not be read.
  const models::LoraSpec* lora = models::lora_spec(c.model);
  in.lora_base_dtype = lora != nullptr && lora->enabled() ? resolved_lora_base_dtype(c) : c.lora_base_dtype;
  in.micro_batch = c.global_batch / (static_cast<int64_t>(ranks) * c.micro_batches);
  in.cpu = c.device == c10::DeviceType::CPU;
  in.overhead_bytes =
      in.cpu ? plan::kCpuProcessOverheadBytes + plan::kCpuHeapCacheBytes : plan::kGpuProcessOverheadBytes;
  return in;
}

plan::PlanInput plan_input_with_data(const TrainConfig& config, int ranks, const LoadedData& data) {
  TrainConfig resolved = config;
  if (models::is_language_model(config.model)) resolved.model = resolve_model(config, data.vocab);
  plan::PlanInput in = plan_input(resolved, ranks);
  in.data_bytes = held_bytes(data);
  return in;
}

plan::PlanInput plan_input_for_run(const TrainConfig& config, int ranks) {
  plan_input(config, ranks);  // what cannot be planned is said before any data is read
  return plan_input_with_data(config, ranks, load_data(config));
}

plan::PlanInput plan_input_here(const TrainConfig& config, int ranks, std::string& missing) {
  missing = missing_data_path(config);
  return missing.empty() ? plan_input_for_run(config, ranks) : plan_input(config, ranks);
}

namespace {

// Each searched setting's config keys: any of them given in a config fixes the setting.
const std::vector<std::pair<plan::FitSetting, std::vector<std::string>>>& fit_setting_keys() {
  static const std::vector<std::pair<plan::FitSetting, std::vector<std::string>>> keys = {
      {plan::FitSetting::Strategy, {"fsdp.strategy", "fsdp.shard_group_size"}},
      {plan::FitSetting::ActivationCheckpointing,
       {"fsdp.activation_checkpointing", "fsdp.activation_checkpointing_every"}},
      {plan::FitSetting::MicroBatches, {"train.micro_batches"}},
      {plan::FitSetting::CpuOffload, {"fsdp.cpu_offload"}},
      {plan::FitSetting::LoraBaseDtype, {"lora.base_dtype"}},
      {plan::FitSetting::MaxInflight, {"fsdp.max_inflight", "fsdp.prefetch"}},
      {plan::FitSetting::LossChunk, {"train.loss_chunk_tokens"}},
  };
  return keys;
}

std::string quoted(const char* text) { return std::string("\"") + text + "\""; }

}  // namespace

std::vector<std::pair<std::string, std::string>> fit_config_values(const plan::PlanInput& chosen,
                                                                   const std::set<plan::FitSetting>& fixed) {
  std::vector<std::pair<std::string, std::string>> values;
  const auto searched = [&](plan::FitSetting s) { return fixed.count(s) == 0; };
  if (searched(plan::FitSetting::Strategy)) values.emplace_back("fsdp.strategy", quoted(enum_name(chosen.strategy)));
  if (searched(plan::FitSetting::ActivationCheckpointing)) {
    values.emplace_back("fsdp.activation_checkpointing", chosen.activation_checkpointing ? "true" : "false");
    if (chosen.activation_checkpointing) {
      values.emplace_back("fsdp.activation_checkpointing_every", std::to_string(chosen.activation_checkpointing_every));
    }
  }
  if (searched(plan::FitSetting::MicroBatches))
    values.emplace_back("train.micro_batches", std::to_string(chosen.micro_batches));
  if (searched(plan::FitSetting::CpuOffload))
    values.emplace_back("fsdp.cpu_offload", chosen.cpu_offload ? "true" : "false");
  const models::LoraSpec* lora = models::lora_spec(chosen.model);
  if (searched(plan::FitSetting::LoraBaseDtype) && lora != nullptr && lora->enabled()) {
    values.emplace_back("lora.base_dtype", quoted(enum_name(chosen.lora_base_dtype)));
  }
  if (searched(plan::FitSetting::MaxInflight)) {
    // fsdp.prefetch = false plans as a depth of 0 (PlanInput::prefetch_depth): max_inflight 0 says the same.
    values.emplace_back("fsdp.max_inflight", std::to_string(chosen.prefetch_depth()));
    if (chosen.prefetch_depth() > 0) values.emplace_back("fsdp.prefetch", "true");
  }
  if (searched(plan::FitSetting::LossChunk) && models::is_language_model(chosen.model)) {
    values.emplace_back("train.loss_chunk_tokens", std::to_string(chosen.loss_chunk_tokens));
  }
  return values;
}

std::set<plan::FitSetting> fit_settings_of_keys(const std::set<std::string>& given_keys) {
  std::set<plan::FitSetting> given;
  for (const auto& [setting, keys] : fit_setting_keys()) {
    for (const std::string& key : keys) {
      if (given_keys.count(key) > 0) given.insert(setting);
    }
  }
  return given;
}

std::set<plan::FitSetting> fit_settings_given(const TrainConfig& config) {
  return fit_settings_of_keys(config.keys_given);
}

}  // namespace fsdp::train
