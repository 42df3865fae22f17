// The Unicode properties the tokenizer's pre-tokenizer patterns use (general categories,
// White_Space, the word characters of Oniguruma and of Rust's regex), as the `tokenizers` package
// sees them: Unicode 16.0.0, from the project's own generated table (unicode_data.cpp, written by
// scripts/unicode/generate_tables.py), never from the host's PCRE2 or ICU, whose Unicode version
// differs from host to host. docs/formats.md says why.
#pragma once

#include <cstdint>

namespace rlserve::model::unicode {

// Unicode's general categories; Cn (unassigned) is 0. The generator writes this order.
enum class general_category : uint8_t {
  Cn, Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe, Pi, Pf, Po, Sm, Sc, Sk, So, Zs,
  Zl, Zp, Cc, Cf, Cs, Co
};
inline constexpr int k_category_count = 30;

namespace detail {
extern const uint16_t k_block_index[0x110000 / 128];
extern const uint8_t k_blocks[][128];
inline constexpr uint8_t k_category_mask = 0x1F;
inline constexpr uint8_t k_white_space = 0x20;     // PropList White_Space (Oniguruma's \s)
inline constexpr uint8_t k_onig_word_extra = 0x40; // in Oniguruma's \w beyond L M Nd Nl Pc
inline constexpr uint8_t k_alphabetic_extra = 0x80; // Alphabetic beyond L Nl M (Rust's \w)
} // namespace detail

// The table's byte for `c` (c < 0x110000).
inline uint8_t properties(char32_t c) {
  return detail::k_blocks[detail::k_block_index[c >> 7]][c & 127];
}

inline general_category category(char32_t c) {
  return static_cast<general_category>(properties(c) & detail::k_category_mask);
}
inline bool is_white_space(char32_t c) { return properties(c) & detail::k_white_space; }

// A set of code points as a mask over "atoms": one bit per general category (bits 0-29) and one
// per extra property (bits 30-32). A code point is in the set when its atoms meet the mask.
using property_mask = uint64_t;
inline constexpr property_mask category_bit(general_category g) {
  return property_mask(1) << static_cast<int>(g);
}
inline constexpr property_mask k_white_space_bit = property_mask(1) << 30;
inline constexpr property_mask k_onig_word_extra_bit = property_mask(1) << 31;
inline constexpr property_mask k_alphabetic_extra_bit = property_mask(1) << 32;

// The atoms of `c`: its category's bit and its extra properties' bits.
inline property_mask atoms(char32_t c) {
  const uint8_t p = properties(c);
  property_mask m = property_mask(1) << (p & detail::k_category_mask);
  if (p & detail::k_white_space)
    m |= k_white_space_bit;
  if (p & detail::k_onig_word_extra)
    m |= k_onig_word_extra_bit;
  if (p & detail::k_alphabetic_extra)
    m |= k_alphabetic_extra_bit;
  return m;
}

} // namespace rlserve::model::unicode
