// fsdp/models/lora_base_dtype.h: how a LoRA run stores its frozen base's shards (lora.base_dtype,
// fsdp-plan --lora-base-dtype).
#pragma once

#include "fsdp/enum_names.h"

namespace fsdp::models {
// Auto: the weights' own dtype (train/config.h's resolved_lora_base_dtype resolves it before anything
// is built or planned). Nf4: QLoRA: the blocks' linear weights in bitsandbytes' 4-bit NF4 with double
// quantization, the rest bf16.
enum class LoraBaseDtype { Auto, BFloat16, Float32, Nf4 };
}  // namespace fsdp::models

namespace fsdp {
template <>
struct EnumNames<models::LoraBaseDtype> {
  static constexpr std::pair<models::LoraBaseDtype, const char*> values[] = {
      {models::LoraBaseDtype::Auto, "auto"},
      {models::LoraBaseDtype::BFloat16, "bfloat16"},
      {models::LoraBaseDtype::Float32, "float32"},
      {models::LoraBaseDtype::Nf4, "nf4"},
  };
};
}  // namespace fsdp
