#include "toml_screen.h"

#include <cstdint>
#include <cstdio>
#include <utility>

namespace fsdp::train {

namespace {

bool is_non_ascii(char c) { return static_cast<unsigned char>(c) >= 0x80; }

// The code point of the UTF-8 sequence at text[i] and its length in bytes; length 0 where the
// bytes are not one (overlong, a surrogate, past U+10FFFF: toml++'s reader refuses those itself).
std::pair<uint32_t, size_t> code_point_at(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  const size_t length = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 && lead <= 0xDF ? 2 : 0;
  if (length == 0 || lead > 0xF4 || i + length > text.size()) return {0, 0};
  uint32_t value = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {0, 0};
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  const bool overlong = (length == 3 && value < 0x800) || (length == 4 && value < 0x10000);
  if (overlong || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return {0, 0};
  return {value, length};
}

// Appends text[copied, at) and the \u (or \U) escape of the character at `at` to `out`, and moves
// `copied` past it; returns its length in bytes (0, and nothing appended, where it is not UTF-8).
size_t escape_into(std::string& out, const std::string& text, size_t at, size_t& copied) {
  const auto [code_point, length] = code_point_at(text, at);
  if (length == 0) return 0;
  char escape[16];
  std::snprintf(escape, sizeof(escape), code_point > 0xFFFF ? "\\U%08X" : "\\u%04X", static_cast<unsigned>(code_point));
  out.append(text, copied, at - copied).append(escape);
  copied = at + length;
  return length;
}

// From text[j], past the spaces, tabs and line breaks that a line-ending backslash trims: the index
// of the first other character; `line` and `line_start` (its first byte) follow the line breaks.
size_t past_trimmed_whitespace(const std::string& text, size_t j, size_t& line, size_t& line_start) {
  for (; j < text.size() && (text[j] == ' ' || text[j] == '\t' || text[j] == '\n' || text[j] == '\r'); ++j) {
    if (text[j] == '\n') {
      ++line;
      line_start = j + 1;
    }
  }
  return j;
}

// Whether a key may come at this point of the code: at a line's start outside arrays, in a table
// header, after '{' or after an inline table's ','; '=' ends it. (There a '.' separates keys, and
// a quote after it starts one.)
struct KeyPosition {
  bool in_key = true;
  std::string open;  // the '[' and '{' not yet closed, innermost last

  void at_line_start() { in_key = open.empty() || open.back() == '{'; }
  // After code character c, which followed `before` (the line's last one other than a space or tab).
  void after(char c, char before) {
    if (c == '=') {
      in_key = false;
    } else if (c == '{') {
      open += c;
      in_key = true;
    } else if (c == '[') {
      in_key = (before == '\n' && open.empty()) || (before == '[' && in_key);  // a table header: [a] or [[a]]
      open += c;
    } else if (c == ']' || c == '}') {
      if (!open.empty()) open.pop_back();
      in_key = false;
    } else if (c == ',') {
      in_key = !open.empty() && open.back() == '{';
    }
  }
};

}  // namespace

ScreenedToml screen_toml(const std::string& text) {
  enum class State { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  ScreenedToml out;
  size_t copied = 0;  // text[0, copied) is in out.text
  State state = State::kCode;
  size_t line = 1, line_start = 0;
  auto refuse = [&](size_t at, const char* what) {
    out.refusal = std::to_string(line) + ":" + std::to_string(at - line_start + 1) + ": " + what;
    out.text.clear();
    return out;
  };
  // The last character of code on this line other than a space or tab ('\n' at a line's start). A
  // quote starts a string only where TOML allows one: a key (at a line's start, after '.', or after
  // '[', '{' or ',') or a value (after '=', '[' or ','). Elsewhere (`x =+a"...`, or a value's
  // `200x."...`, whose '.' separates no keys) it starts none for toml++ either, which may then meet
  // the text after it where it looks for whitespace or a value's end.
  char before = '\n';
  KeyPosition key;
  auto may_start_string = [&]() {
    return before == '\n' || before == '=' || before == '[' || before == ',' || before == '{' ||
           (before == '.' && key.in_key);
  };
  auto starts = [&](size_t i, const char* three) { return text.compare(i, 3, three) == 0; };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      // A newline ends a comment, and a single-line string (unterminated: the parser says so).
      if (state == State::kComment || state == State::kBasic || state == State::kLiteral) state = State::kCode;
      if (state == State::kCode) {
        before = '\n';
        key.at_line_start();
      }
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
        } else if (is_non_ascii(c)) {
          return refuse(i,
                        "a non-ASCII character outside a string or comment (TOML allows them only there; "
                        "keys with other characters go in quotes)");
        }
        key.after(c, before);
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
          size_t j = i + 1;  // past the spaces and tabs after the backslash
          while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
          if (j < text.size() && is_non_ascii(text[j])) {
            return refuse(j,
                          "a non-ASCII character after a backslash in a string (neither an escape nor a "
                          "line-ending backslash)");
          }
          if (j < text.size() && (text[j] == '\n' || text[j] == '\r')) {
            // A line-ending backslash: the line breaks, spaces and tabs after it are trimmed, and the
            // first other character is tested as whitespace: a non-ASCII one goes to toml++ escaped.
            j = past_trimmed_whitespace(text, j, line, line_start);
            if (j < text.size() && is_non_ascii(text[j])) j += escape_into(out.text, text, j, copied);
            i = j - 1;  // the loop goes on at text[j]
          } else if (j == i + 1) {
            ++i;  // an escaped character, a quote included
          }
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
  out.text.append(text, copied, std::string::npos);
  return out;
}

}  // namespace fsdp::train
