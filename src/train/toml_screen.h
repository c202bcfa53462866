// Private to train/: a screen in front of toml++. Debian's toml++ 3.3.0 reaches TOML_UNREACHABLE
// (undefined behaviour: __builtin_unreachable in a release build) when it meets some non-ASCII
// code points where it expects whitespace, e.g. U+FE7F, or U+00E9 at a line's start (found by
// tests/fuzz/fuzz_config). TOML allows non-ASCII characters only inside strings and comments, so
// text with one anywhere else is refused here, before toml++ sees it; nothing valid is refused.
#pragma once

#include <string>

namespace fsdp::train {

// "" when every non-ASCII byte of `text` is inside a string (basic, literal, multi-line) or a
// comment; otherwise "LINE:COLUMN: a non-ASCII character outside a string or comment ..." for the
// first one (1-based, in bytes). Unterminated strings are left for the parser to report.
std::string non_ascii_outside_strings(const std::string& text);

}  // namespace fsdp::train
