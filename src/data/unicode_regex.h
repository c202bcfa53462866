// A compiled Unicode regular expression (PCRE2, UTF-8, Unicode properties: \p{L}, \p{N}, and \s
// and case folding over all of Unicode), for the tokenizers' split patterns.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdp::data {

class UnicodeRegex {
 public:
  // Throws std::invalid_argument naming `where`, the pattern and PCRE2's message and offset.
  UnicodeRegex(const std::string& pattern, const std::string& where);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // Every non-overlapping match, left to right, as [begin, end) byte ranges of `text`, which must
  // be valid UTF-8 (otherwise std::invalid_argument naming the byte offset). Empty matches are
  // skipped, as Hugging Face tokenizers' Split does.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::string where_;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace fsdp::data
