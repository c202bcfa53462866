// Instruction data (JSONL lines: messages, or prompt and completion): one line parsed, then rendered
// in every chat format with the byte tokenizer (those that need tokens it lacks throw). Bad input must throw, never
// crash.
#include <stdexcept>
#include <string>

#include "fsdp/data/instructions.h"
#include "fsdp/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizer = fsdp::data::make_tokenizer("byte");
  try {
    const auto example =
        fsdp::data::parse_instruction_line(std::string(reinterpret_cast<const char*>(data), size), "fuzz:1");
    for (const auto& name : fsdp::enum_names_with_auto<fsdp::data::ChatFormat>()) {
      try {
        const auto format = fsdp::optional_enum_from_name<fsdp::data::ChatFormat>(name);
        (void)fsdp::data::render_chat(example, fsdp::data::resolve_chat_format(format, *tokenizer), *tokenizer);
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception&) {
  }
  return 0;
}
