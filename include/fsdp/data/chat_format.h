// fsdp/data/chat_format.h: the chat formats instruction data is rendered in (data.chat_format;
// data/instructions.h has each one's layout, src/data/chat_text.h its exact text). An optional one
// is "auto": the format the tokenizer's tokens tell (data::resolve_chat_format).
#pragma once

#include "fsdp/enum_names.h"

namespace fsdp::data {
enum class ChatFormat { Llama3, ChatMl, Mistral, Gemma, Plain };
}  // namespace fsdp::data

namespace fsdp {
template <>
struct EnumNames<data::ChatFormat> {  // data.chat_format's values
  static constexpr std::pair<data::ChatFormat, const char*> values[] = {
      {data::ChatFormat::Llama3, "llama3"},   {data::ChatFormat::ChatMl, "chatml"},
      {data::ChatFormat::Mistral, "mistral"}, {data::ChatFormat::Gemma, "gemma"},
      {data::ChatFormat::Plain, "plain"},
  };
};
}  // namespace fsdp
