#include "unicode_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <new>
#include <stdexcept>

namespace fsdp::data {

namespace {
std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}
}  // namespace

// Matching steps (PCRE2's match limit) one piece of text may take. A tokenizer's split pattern
// takes a few per byte of its piece; PCRE2's default (10 M) lets a hostile tokenizer.json's pattern
// stall every rank for seconds on each piece, effectively a hang.
constexpr uint32_t kMatchLimit = 1000000;

struct UnicodeRegex::Compiled {
  pcre2_code* code = nullptr;
  pcre2_match_context* context = nullptr;
  ~Compiled() {
    pcre2_match_context_free(context);
    pcre2_code_free(code);
  }
};

UnicodeRegex::UnicodeRegex(const std::string& pattern, const std::string& where)
    : pattern_(pattern), where_(where), compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                  &error, &offset, nullptr);
  if (compiled_->code == nullptr) {
    throw std::invalid_argument(where + ": the pattern " + pattern + " does not compile at offset " +
                                std::to_string(offset) + ": " + pcre2_message(error));
  }
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);  // faster where the JIT exists; fine without
  compiled_->context = pcre2_match_context_create(nullptr);
  if (compiled_->context == nullptr) throw std::bad_alloc();
  pcre2_set_match_limit(compiled_->context, kMatchLimit);
}

UnicodeRegex::~UnicodeRegex() = default;

std::vector<std::pair<size_t, size_t>> UnicodeRegex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  uint32_t options = 0;  // the first call checks the UTF-8 once; later ones skip it
  while (start <= text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), start, options, data.get(), compiled_->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
        throw std::invalid_argument(where_ + ": the text is not valid UTF-8 at byte " +
                                    std::to_string(pcre2_get_ovector_pointer(data.get())[0]) + " (" +
                                    pcre2_message(rc) + ")");
      }
      if (rc == PCRE2_ERROR_MATCHLIMIT) {
        throw std::runtime_error(where_ + ": the pattern " + pattern_ + " took more than " +
                                 std::to_string(kMatchLimit) + " matching steps on the text at byte " +
                                 std::to_string(start) +
                                 " (a pattern that backtracks this much would stall training; a tokenizer's split "
                                 "pattern takes a few per byte)");
      }
      throw std::runtime_error(where_ + ": matching " + pattern_ + " failed: " + pcre2_message(rc));
    }
    options = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // An empty match: step over one character (not one byte) and look again.
      size_t next = begin + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      start = next;
    }
  }
  return matches;
}

}  // namespace fsdp::data
