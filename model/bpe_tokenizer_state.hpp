// The loaded state of a bpe_tokenizer and the pieces it is made of, shared by the three files
// of the tokenizer: bpe_tokenizer.cpp (encoding, decoding, the building blocks),
// bpe_tokenizer_load.cpp (reading tokenizer.json) and bpe_nfc.cpp (the NFC normalizer).
// Internal: include it from those files only.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/bpe_tokenizer.hpp"

namespace rlserve::model::bpe_internal {

// ---- UTF-8 ----------------------------------------------------------------------------------

inline constexpr std::string_view k_replacement = "\xEF\xBF\xBD"; // U+FFFD

enum class utf8_kind { valid, invalid, incomplete };
struct utf8_step {
  utf8_kind kind;
  std::size_t len; // bytes of the character, or of the maximal ill-formed subpart
};

// One step of a UTF-8 scan following Unicode Table 3-7 (well-formed byte sequences). An
// ill-formed sequence is reported as its maximal subpart (the longest prefix that could still have
// been valid), which is what Rust's from_utf8_lossy and Python's errors="replace" turn into one
// U+FFFD each; a valid prefix cut off by the end of the input is `incomplete`.
inline utf8_step utf8_next(const unsigned char* p, std::size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80)
    return {utf8_kind::valid, 1};
  std::size_t need;
  unsigned char lo = 0x80, hi = 0xBF; // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0)
      lo = 0xA0; // no overlong 3-byte forms
    else if (b0 == 0xED)
      hi = 0x9F; // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0)
      lo = 0x90; // no overlong 4-byte forms
    else if (b0 == 0xF4)
      hi = 0x8F; // nothing above U+10FFFF
  } else {
    return {utf8_kind::invalid, 1}; // 80..C1, F5..FF never start a character
  }
  for (std::size_t i = 1; i <= need; ++i) {
    if (i >= n)
      return {utf8_kind::incomplete, i};
    const unsigned char b = p[i];
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h)
      return {utf8_kind::invalid, i};
  }
  return {utf8_kind::valid, need + 1};
}

inline bool utf8_is_valid(std::string_view s) {
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    auto st = utf8_next(p + i, s.size() - i);
    if (st.kind != utf8_kind::valid)
      return false;
    i += st.len;
  }
  return true;
}

// Decodes the (valid) character at p; returns its code point and advances i.
inline char32_t utf8_decode(std::string_view s, std::size_t& i) {
  auto p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    ++i;
    return p[0];
  }
  if (p[0] < 0xE0) {
    i += 2;
    return char32_t(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    i += 3;
    return char32_t(p[0] & 0x0F) << 12 | char32_t(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
  }
  i += 4;
  return char32_t(p[0] & 0x07) << 18 | char32_t(p[1] & 0x3F) << 12 | char32_t(p[2] & 0x3F) << 6 |
         (p[3] & 0x3F);
}

inline void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

inline std::size_t utf8_char_len(std::string_view s, std::size_t i) {
  auto b = static_cast<unsigned char>(s[i]);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// Rust's `\s` (the Unicode White_Space property), used by the lstrip/rstrip of added tokens.
inline bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// ---- GPT-2 byte <-> symbol table ------------------------------------------------------------

struct byte_tables {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 0x144> to_byte{}; // code point (< U+0144) -> byte, -1 if none
  std::array<std::string, 256> symbol;  // UTF-8 of to_unicode[b]

  byte_tables() {
    // The printable bytes keep their own code point; the 68 others (controls, space, 0x7F-0xA0,
    // soft hyphen 0xAD) are moved to U+0100.. in byte order, as GPT-2's encoder.py does.
    std::array<bool, 256> keeps{};
    for (int b = '!'; b <= '~'; ++b)
      keeps[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b)
      keeps[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b)
      keeps[b] = true;
    char32_t next = 0x100;
    to_byte.fill(-1);
    for (int b = 0; b < 256; ++b) {
      to_unicode[b] = keeps[b] ? char32_t(b) : next++;
      to_byte[to_unicode[b]] = int16_t(b);
      utf8_append(symbol[b], to_unicode[b]);
    }
  }
};

inline const byte_tables& tables() {
  static const byte_tables t;
  return t;
}

// ---- added tokens -----------------------------------------------------------------------------

struct added_token {
  int32_t id = 0;
  std::string content;
  std::string pattern; // what is matched in the text: content, or NFC(content) if normalized
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// `\w` of Rust's regex crate (Alphabetic, marks, decimal digits, connector punctuation, joiners),
// which `tokenizers` uses for single_word tokens.
bool is_word_char_at(std::string_view text, std::size_t i);

// Leftmost-longest search for added tokens, like the Aho-Corasick automaton of `tokenizers`.
// Candidates are bucketed by first byte and sorted longest first, so a match is found with a few
// memcmp at the few positions whose byte starts some token; real vocabularies have at most a few
// hundred added tokens, almost all starting with '<'.
class added_matcher {
public:
  void build(const std::vector<added_token>& tokens, bool normalized) {
    tokens_ = &tokens;
    for (uint32_t i = 0; i < tokens.size(); ++i)
      if (tokens[i].normalized == normalized && !tokens[i].pattern.empty())
        by_first_[static_cast<unsigned char>(tokens[i].pattern[0])].push_back(i);
    for (auto& bucket : by_first_) {
      std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
        return tokens[a].pattern.size() > tokens[b].pattern.size();
      });
      if (!bucket.empty())
        empty_ = false;
    }
  }

  // Cuts `text` into pieces: on_gap(string_view) for text, on_token(id) for each token, in order.
  // The lstrip/rstrip/single_word rules are those of AddedVocabulary::find_matches.
  template <class OnGap, class OnToken>
  void split(std::string_view text, OnGap&& on_gap, OnToken&& on_token) const {
    if (empty_) {
      if (!text.empty())
        on_gap(text);
      return;
    }
    std::size_t start_offset = 0; // end of the last emitted piece
    std::size_t pos = 0;          // where the next search starts
    while (pos < text.size()) {
      std::size_t start = text.size();
      const added_token* tok = nullptr;
      for (std::size_t i = pos; i < text.size() && !tok; ++i) {
        for (uint32_t idx : by_first_[static_cast<unsigned char>(text[i])]) {
          const auto& p = (*tokens_)[idx].pattern;
          if (text.compare(i, p.size(), p) == 0) {
            tok = &(*tokens_)[idx];
            start = i;
            break;
          }
        }
      }
      if (!tok)
        break;
      std::size_t stop = start + tok->pattern.size();
      pos = stop;
      if (tok->single_word) {
        bool start_ok = start == 0 || !ends_with_word(text.substr(0, start));
        bool stop_ok = stop == text.size() || !is_word_char_at(text, stop);
        if (!start_ok || !stop_ok)
          continue; // `tokenizers` drops the match and searches on after it
      }
      if (tok->lstrip) {
        std::size_t s = start;
        while (s > start_offset) {
          std::size_t prev = s - 1;
          while (prev > 0 && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80)
            --prev;
          std::size_t j = prev;
          if (!is_white_space(utf8_decode(text, j)))
            break;
          s = prev;
        }
        start = s;
      }
      if (tok->rstrip) {
        while (stop < text.size()) {
          std::size_t j = stop;
          if (!is_white_space(utf8_decode(text, j)))
            break;
          stop = j;
        }
        // Searching on from the stripped end (not the match end, as `tokenizers` does) keeps
        // the pieces disjoint; the two differ only for added tokens that start with whitespace.
        pos = stop;
      }
      if (start_offset < start)
        on_gap(text.substr(start_offset, start - start_offset));
      on_token(tok->id);
      start_offset = stop;
    }
    if (start_offset < text.size())
      on_gap(text.substr(start_offset));
  }

private:
  static bool ends_with_word(std::string_view before) {
    std::size_t prev = before.size() - 1;
    while (prev > 0 && (static_cast<unsigned char>(before[prev]) & 0xC0) == 0x80)
      --prev;
    return is_word_char_at(before, prev);
  }

  const std::vector<added_token>* tokens_ = nullptr;
  std::array<std::vector<uint32_t>, 256> by_first_;
  bool empty_ = true;
};

// ---- pre-tokenizer ----------------------------------------------------------------------------

enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct split_step {
  bpe_detail::regex re;
  split_behavior behavior = split_behavior::isolated;
  bool invert = false;
};

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};
template <class V>
using string_map = std::unordered_map<std::string, V, string_hash, std::equal_to<>>;

struct merge_value {
  uint32_t rank;
  int32_t new_id;
};

constexpr uint64_t pair_key(int32_t a, int32_t b) {
  return uint64_t(uint32_t(a)) << 32 | uint32_t(b);
}

// Largest id we accept; ids index dense tables, and real vocabularies stay below 2^18.
inline constexpr int64_t k_max_id = (1 << 24) - 1;
// The BPE cache keeps pre-tokens shorter than this many bytes (as `tokenizers` does) and is
// emptied when it reaches k_cache_capacity entries, so a long-running server's cache follows
// the words it currently sees and stays bounded.
inline constexpr std::size_t k_cache_max_word = 256;
inline constexpr std::size_t k_cache_capacity = 10'000;

} // namespace rlserve::model::bpe_internal

namespace rlserve::model {

// ---- the loaded tokenizer --------------------------------------------------------------------

struct bpe_tokenizer::state {
  // Model.
  bpe_internal::string_map<int32_t> vocab; // byte-level symbols -> id
  std::unordered_map<uint64_t, bpe_internal::merge_value> merges;
  std::array<int32_t, 256> byte_id{}; // id of each byte's one-symbol token, -1 if absent
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;

  // Ids: dense tables over [0, vocab_size).
  int32_t vocab_size = 0;
  std::vector<uint8_t> flags; // k_present | k_special | k_added
  std::string text_blob;      // token_text of each id
  std::vector<uint32_t> text_off;
  std::string bytes_blob; // token_bytes of each id
  std::vector<uint32_t> bytes_off;
  static constexpr uint8_t k_present = 1, k_special = 2, k_added = 4;

  // Added tokens.
  std::vector<bpe_internal::added_token> added;
  bpe_internal::string_map<int32_t> added_by_content;
  bpe_internal::added_matcher raw_matcher;        // normalized == false, matched on the raw text
  bpe_internal::added_matcher normalized_matcher; // normalized == true, matched after normalization

  // Normalizer and pre-tokenizer.
  bool nfc = false;
  std::vector<bpe_internal::split_step> splits; // run in order, then the ByteLevel step
  bool add_prefix_space = false;
  std::optional<bpe_detail::regex> byte_level_regex; // GPT-2 regex if use_regex

  mutable std::mutex cache_mutex;
  mutable bpe_internal::string_map<std::vector<int32_t>> cache;

  std::string_view text_of(int32_t id) const {
    return std::string_view(text_blob).substr(text_off[id], text_off[id + 1] - text_off[id]);
  }
  std::string_view bytes_of(int32_t id) const {
    return std::string_view(bytes_blob).substr(bytes_off[id], bytes_off[id + 1] - bytes_off[id]);
  }
  bool present(int32_t id) const { return id >= 0 && id < vocab_size && (flags[id] & k_present); }

  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  void pre_tokenize(std::string_view piece, std::size_t step, std::vector<int32_t>& ids) const;
  void byte_level(std::string_view piece, std::vector<int32_t>& ids) const;
  void bpe(std::string_view word, std::vector<int32_t>& ids) const;
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;
};

} // namespace rlserve::model
