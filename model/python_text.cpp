#include "model/python_text.hpp"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

namespace rlserve::model {

namespace {

struct range {
  char32_t first, last;
};

// The assigned code points Python's repr escapes (Unicode 15): controls (Cc), format characters
// (Cf), separators (Zs but U+0020, Zl, Zp), private use (Co); sorted, for a binary search.
constexpr range not_printable[] = {
  {0x0000, 0x001F},   {0x007F, 0x00A0},   {0x00AD, 0x00AD},   {0x0600, 0x0605},   {0x061C, 0x061C},
  {0x06DD, 0x06DD},   {0x070F, 0x070F},   {0x0890, 0x0891},   {0x08E2, 0x08E2},   {0x1680, 0x1680},
  {0x180E, 0x180E},   {0x2000, 0x200F},   {0x2028, 0x202F},   {0x205F, 0x2064},   {0x2066, 0x206F},
  {0x3000, 0x3000},   {0xD800, 0xF8FF},   {0xFDD0, 0xFDEF},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},
  {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A},
  {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD},
};

} // namespace

bool python_printable(char32_t c) {
  if ((c & 0xFFFE) == 0xFFFE) // U+xFFFE and U+xFFFF of every plane are noncharacters
    return false;
  const auto* it = std::upper_bound(std::begin(not_printable), std::end(not_printable), c,
                                    [](char32_t v, const range& r) { return v < r.first; });
  return it == std::begin(not_printable) || c > std::prev(it)->last;
}

void append_python_escape(std::string& out, char32_t c) {
  if (c < 0x100)
    out += fmt::format("\\x{:02x}", uint32_t(c));
  else if (c < 0x10000)
    out += fmt::format("\\u{:04x}", uint32_t(c));
  else
    out += fmt::format("\\U{:08x}", uint32_t(c));
}

} // namespace rlserve::model
