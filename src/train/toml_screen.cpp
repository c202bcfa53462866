#include "toml_screen.h"

namespace fsdp::train {

std::string non_ascii_outside_strings(const std::string& text) {
  enum class State { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  State state = State::kCode;
  size_t line = 1, line_start = 0;
  // The last character of code on this line other than a space or tab ('\n' at a line's start). A
  // quote starts a string only where TOML allows one: a key (at a line's start, after '.', or after
  // '[', '{' or ',') or a value (after '=', '[' or ','). Elsewhere (`x =+a"...`) it starts none for
  // toml++ either, which may then meet the text after it where it looks for whitespace.
  char before = '\n';
  auto may_start_string = [&]() {
    return before == '\n' || before == '=' || before == '[' || before == ',' || before == '{' || before == '.';
  };
  auto starts = [&](size_t i, const char* three) { return text.compare(i, 3, three) == 0; };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      // A newline ends a comment, and a single-line string (unterminated: the parser says so).
      if (state == State::kComment || state == State::kBasic || state == State::kLiteral) state = State::kCode;
      if (state == State::kCode) before = '\n';
      continue;
    }
    switch (state) {
      case State::kCode:
        if (c == '#') {
          state = State::kComment;
        } else if (c == '"' && may_start_string()) {
          state = starts(i, "\"\"\"") ? State::kMultiBasic : State::kBasic;
          if (state == State::kMultiBasic) i += 2;
        } else if (c == '\'' && may_start_string()) {
          state = starts(i, "'''") ? State::kMultiLiteral : State::kLiteral;
          if (state == State::kMultiLiteral) i += 2;
        } else if (static_cast<unsigned char>(c) >= 0x80) {
          return std::to_string(line) + ":" + std::to_string(i - line_start + 1) +
                 ": a non-ASCII character outside a string or comment (TOML allows them only there; "
                 "keys with other characters go in quotes)";
        }
        if (c != ' ' && c != '\t') before = c;  // a string's opening quote included: what follows a string is code
        break;
      case State::kComment: break;
      case State::kBasic:
        if (c == '\\') ++i;  // an escaped character, a quote included
        else if (c == '"') state = State::kCode;
        break;
      case State::kLiteral:
        if (c == '\'') state = State::kCode;
        break;
      case State::kMultiBasic:
        if (c == '\\') {
          if (i + 1 < text.size() && text[i + 1] != '\n') ++i;  // a line-ending backslash keeps its newline
        } else if (starts(i, "\"\"\"")) {
          i += 2;
          while (i + 1 < text.size() && text[i + 1] == '"') ++i;  // up to two quotes of content before the end
          state = State::kCode;
        }
        break;
      case State::kMultiLiteral:
        if (starts(i, "'''")) {
          i += 2;
          while (i + 1 < text.size() && text[i + 1] == '\'') ++i;
          state = State::kCode;
        }
        break;
    }
  }
  return "";
}

}  // namespace fsdp::train
