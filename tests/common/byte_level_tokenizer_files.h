// Test helper: a GPT-2-format tokenizer (vocab.json + merges.txt) of the 256 bytes and
// <|endoftext|> (id 256), no merges: byte-level tokens like the byte tokenizer's, plus an
// end-of-text token, which the plain chat format ends each answer with (and data.packing needs).
#pragma once

#include <fstream>
#include <string>

namespace fsdp::testing {

// Writes DIR/vocab.json and DIR/merges.txt (DIR must exist).
inline void write_byte_level_gpt2_tokenizer(const std::string& dir) {
  // Byte symbols in GPT-2's order: printable Latin-1 as themselves, the rest as U+0100 onwards.
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  std::string vocab = "{";
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string symbol = utf8(printable ? b : 256 + extra++);
    if (symbol == "\"" || symbol == "\\") symbol = "\\" + symbol;
    vocab += "\"" + symbol + "\": " + std::to_string(b) + ", ";
  }
  vocab += "\"<|endoftext|>\": 256}";
  std::ofstream(dir + "/vocab.json") << vocab;
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\n";
}

}  // namespace fsdp::testing
