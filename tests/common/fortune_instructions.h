// Test helper: instruction examples made from Debian's fortunes, as JSONL.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "fsdp/data/text_corpus.h"

namespace fsdp::testing {

// Prompt-completion examples from the fortunes (a request, then the fortune), rendered in the plain
// format with the byte tokenizer: prompts of different lengths, answers of different lengths, so
// every rank's share of a global batch holds a different number of trained tokens.
inline std::string write_fortune_instructions(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const std::string path = (dir / "instructions.jsonl").string();
  std::ofstream out(path);
  int written = 0;
  for (const auto& document : fsdp::data::read_fortunes(fsdp::data::kFortunesDir)) {
    if (document.text.size() > 70) continue;  // fits the 96-token window with its request
    bool ascii = true;
    for (unsigned char c : document.text) ascii = ascii && c < 0x80;
    if (!ascii) continue;  // JSON needs UTF-8; a few fortunes are Latin-1
    const std::string topic = fs::path(document.source).filename().string();
    const std::string request = "Tell me a fortune about " + topic + ".\n";
    auto quote = [](const std::string& s) {
      std::string q = "\"";
      for (unsigned char c : s) {
        if (c == '"' || c == '\\') q += '\\', q += static_cast<char>(c);
        else if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          q += buffer;
        } else q += static_cast<char>(c);
      }
      return q + "\"";
    };
    out << "{\"prompt\": " << quote(request) << ", \"completion\": " << quote(document.text) << "}\n";
    if (++written == 600) break;
  }
  return path;
}

}  // namespace fsdp::testing
