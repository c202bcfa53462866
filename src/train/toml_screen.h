// Private to train/: a screen in front of toml++. Debian's toml++ 3.3.0 reaches TOML_UNREACHABLE
// (undefined behaviour: __builtin_unreachable in a release build) when it asks whether a non-ASCII
// code point is whitespace, for most of them (its table of non-ASCII whitespace is incomplete):
//   - outside strings and comments, e.g. U+FE7F, or U+00E9 at a line's start (found by
//     tests/fuzz/fuzz_config). TOML allows non-ASCII characters only inside strings and comments:
//     such text is refused here, before toml++ sees it.
//   - in a multi-line basic string, right after a backslash, or after a backslash and spaces
//     (found 2026-12-06): not TOML either (no escape, nor a line-ending backslash, is that): refused.
//   - in a multi-line basic string, first after a line-ending backslash and the whitespace and line
//     breaks it trims: valid TOML. toml++ is given the character as its \u (or \U) escape instead,
//     which is the same string to TOML and is never tested as whitespace.
// Nothing valid is refused, and what toml++ is given reads as the same TOML.
#pragma once

#include <string>

namespace fsdp::train {

struct ScreenedToml {
  std::string text;     // what toml++ may parse: the input, with the escapes above where needed
  std::string refusal;  // "" or "LINE:COLUMN: ..." (1-based, in bytes) for the first character refused
};

// Unterminated strings are left for the parser to report.
ScreenedToml screen_toml(const std::string& text);

}  // namespace fsdp::train
