// Hugging Face tokenizer.json files (BPE, byte-level or SentencePiece-style): load, then encode and
// decode a text. The input is the file, then (after a NUL byte, if any) the text to encode, so that
// the text is fuzzed too (long runs, special-token text, broken UTF-8, against the file's own split
// pattern); without a NUL, a fixed text with special tokens, Unicode and digits. A malformed file or
// text must throw, never crash or hang.
#include <stdexcept>
#include <string>

#include "fsdp/data/tokenizer.h"
#include "fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string file = input.substr(0, split);
  const std::string text =
      split == std::string::npos
          ? std::string("Hello, world! <|eot_id|> 12345 caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd  \n\t x")
          : input.substr(split + 1);
  const std::string& path = fuzz_input_file(reinterpret_cast<const uint8_t*>(file.data()), file.size(), ".json");
  try {
    auto tokenizer = fsdp::data::make_tokenizer("hf", "", "", path);
    (void)tokenizer->decode(tokenizer->encode(text));
    (void)tokenizer->decode(tokenizer->encode_plain(text));
  } catch (const std::exception&) {
  }
  return 0;
}
