// fsdp/number_order.h: names ordered as `sort -V` orders them, runs of digits compared as numbers
// ("shard-99999.tok" before "shard-100000.tok", "world/split#9" before "world/split#10"), the rest
// as bytes. For names that carry a counter: token shards, the process groups' channels.
#pragma once

#include <cctype>
#include <string>

namespace fsdp {

inline bool in_number_order(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i_end = i, j_end = j;
      while (i_end < a.size() && std::isdigit(static_cast<unsigned char>(a[i_end]))) ++i_end;
      while (j_end < b.size() && std::isdigit(static_cast<unsigned char>(b[j_end]))) ++j_end;
      size_t i_digits = i, j_digits = j;  // leading zeros do not count
      while (i_digits + 1 < i_end && a[i_digits] == '0') ++i_digits;
      while (j_digits + 1 < j_end && b[j_digits] == '0') ++j_digits;
      if (i_end - i_digits != j_end - j_digits) return i_end - i_digits < j_end - j_digits;
      const int order = a.compare(i_digits, i_end - i_digits, b, j_digits, j_end - j_digits);
      if (order != 0) return order < 0;
      if (i_end - i != j_end - j) return i_end - i < j_end - j;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// in_number_order as a comparator type (std::map's).
struct NumberOrder {
  bool operator()(const std::string& a, const std::string& b) const { return in_number_order(a, b); }
};

}  // namespace fsdp
