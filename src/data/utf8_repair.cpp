#include "utf8_repair.h"

#include <cstddef>

namespace fsdp::data {
namespace {

// How many bytes of a well-formed character start at bytes[i] (Unicode table 3-7), or, when none
// does, how long the maximal subpart is that one U+FFFD stands for (at least 1). `complete` says
// which of the two it is.
size_t well_formed_prefix(const std::string& bytes, size_t i, bool& complete) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(bytes[k]); };
  const unsigned char lead = at(i);
  complete = lead < 0x80;
  if (complete) return 1;
  size_t length = 0;
  unsigned char second_low = 0x80, second_high = 0xBF;  // the second byte's range narrows for some leads
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_low = 0xA0;   // no overlong forms
    if (lead == 0xED) second_high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_low = 0x90;   // no overlong forms
    if (lead == 0xF4) second_high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 1;  // a continuation byte, C0, C1 or F5..FF: starts nothing
  }
  size_t taken = 1;
  for (; taken < length && i + taken < bytes.size(); ++taken) {
    const unsigned char next = at(i + taken);
    const unsigned char low = taken == 1 ? second_low : 0x80, high = taken == 1 ? second_high : 0xBF;
    if (next < low || next > high) return taken;
  }
  complete = taken == length;
  return taken;
}

}  // namespace

std::string replace_invalid_utf8(const std::string& bytes) {
  std::string text;
  text.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool complete = false;
    const size_t length = well_formed_prefix(bytes, i, complete);
    if (complete) {
      text.append(bytes, i, length);
    } else {
      text += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
    }
    i += length;
  }
  return text;
}

}  // namespace fsdp::data
