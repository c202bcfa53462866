// fsdp/data/tokenizer_kind.h: the kinds of tokenizer (data.tokenizer; the stamp token files carry).
#pragma once

#include <cstdint>

#include "fsdp/enum_names.h"

namespace fsdp::data {
// Byte: each byte a token; Gpt2: GPT-2's vocab.json + merges.txt; Hf: a Hugging Face tokenizer.json.
// The values are stored in token files' headers (token_file.h): never renumber.
enum class TokenizerKind : uint8_t { Unknown = 0, Byte = 1, Gpt2 = 2, Hf = 3 };
}  // namespace fsdp::data

namespace fsdp {
template <>
struct EnumNames<data::TokenizerKind> {  // data.tokenizer's values (Unknown has no name)
  static constexpr std::pair<data::TokenizerKind, const char*> values[] = {
      {data::TokenizerKind::Byte, "byte"},
      {data::TokenizerKind::Gpt2, "gpt2"},
      {data::TokenizerKind::Hf, "hf"},
  };
};
}  // namespace fsdp

namespace fsdp::data {
// The kind's name in a config (data.tokenizer): "byte", "gpt2", "hf", or "" when unknown.
const char* tokenizer_kind_name(TokenizerKind kind);
}  // namespace fsdp::data
