// fsdp/models/model_config.h: the registered model families. A ModelConfig holds one family's
// config; the list below is the one place a family is registered (docs/architecture.md, "Adding a
// model family"). Nothing else names the list: callers ask the config's family (model_family.h).
#pragma once

#include <variant>

#include "fsdp/models/clip.h"
#include "fsdp/models/gemma3.h"
#include "fsdp/models/gpt.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llava.h"
#include "fsdp/models/mistral.h"
#include "fsdp/models/qwen2.h"
#include "fsdp/models/qwen3.h"
#include "fsdp/models/vit.h"

namespace fsdp::models {

// Each alternative has `static const ModelFamily& family()`, defined in its <family>_family.cpp.
// One alternative per line, so that registering a family is one line.
// clang-format off
using ModelConfig = std::variant<
    GptConfig,
    LlamaConfig,
    VitConfig,
    ClipConfig,
    LlavaConfig,
    Qwen2Config,
    Qwen3Config,
    MistralConfig,
    Gemma3Config>;
// clang-format on

}  // namespace fsdp::models
