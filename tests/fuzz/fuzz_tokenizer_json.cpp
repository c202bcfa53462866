// Hugging Face tokenizer.json files (byte-level BPE): load, then encode and decode a text with
// special tokens, Unicode and digits. A malformed file must throw, never crash.
#include <stdexcept>

#include "fsdp/data/tokenizer.h"
#include "fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz_input_file(data, size, ".json");
  try {
    auto tokenizer = fsdp::data::make_tokenizer("hf", "", "", path);
    const auto ids = tokenizer->encode("Hello, world! <|eot_id|> 12345 caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd  \n\t x");
    (void)tokenizer->decode(ids);
  } catch (const std::exception&) {
  }
  return 0;
}
