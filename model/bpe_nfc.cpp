// Canonical composition (NFC) with the Unicode data of the `tokenizers` normalizer
// (model/nfc_data.hpp): the algorithm (bpe_detail::nfc).
#include <algorithm>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/bpe_tokenizer_state.hpp"
#include "model/nfc_data.hpp"

namespace rlserve::model {

using namespace bpe_internal;

// ---- NFC -------------------------------------------------------------------------------------
//
// Canonical decomposition, canonical ordering and canonical composition (UAX #15), over the
// tables of model/nfc_data.hpp (generated: scripts/unicode/generate_nfc_tables.py says from
// what, and why that is the data of `tokenizers`' normalizer rather than a newer Unicode).

namespace {

using nfc_decomposition = nfc_data::decomposition;
using nfc_ccc_range = nfc_data::ccc_range;
// Functions, not globals: the tables' sizes live in another translation unit.
std::span<const nfc_decomposition> decompositions() {
  return {nfc_data::k_decompositions, nfc_data::k_decomposition_count};
}
std::span<const nfc_ccc_range> ccc_ranges() {
  return {nfc_data::k_ccc_ranges, nfc_data::k_ccc_range_count};
}

constexpr char32_t k_hangul_s = 0xAC00, k_hangul_l = 0x1100, k_hangul_v = 0x1161, k_hangul_t = 0x11A7;
constexpr char32_t k_hangul_l_count = 19, k_hangul_v_count = 21, k_hangul_t_count = 28;
constexpr char32_t k_hangul_n_count = k_hangul_v_count * k_hangul_t_count; // 588
constexpr char32_t k_hangul_s_count = k_hangul_l_count * k_hangul_n_count; // 11172

uint8_t ccc_of(char32_t c) {
  if (c < 0x300)
    return 0;
  auto it = std::upper_bound(ccc_ranges().begin(), ccc_ranges().end(), c,
                             [](char32_t v, const nfc_ccc_range& r) { return v < r.first; });
  if (it == ccc_ranges().begin())
    return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

const nfc_decomposition* decomposition_of(char32_t c) {
  if (c < 0xC0)
    return nullptr;
  auto it = std::lower_bound(decompositions().begin(), decompositions().end(), c,
                             [](const nfc_decomposition& d, char32_t v) { return d.cp < v; });
  return it != decompositions().end() && it->cp == c ? &*it : nullptr;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= k_hangul_s && c < k_hangul_s + k_hangul_s_count) {
    const char32_t s = c - k_hangul_s;
    out.push_back(k_hangul_l + s / k_hangul_n_count);
    out.push_back(k_hangul_v + (s % k_hangul_n_count) / k_hangul_t_count);
    if (s % k_hangul_t_count != 0)
      out.push_back(k_hangul_t + s % k_hangul_t_count);
    return;
  }
  const nfc_decomposition* d = decomposition_of(c);
  if (d == nullptr) {
    out.push_back(c);
    return;
  }
  decompose(d->first, out);
  if (d->second != 0)
    decompose(d->second, out);
}

char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= k_hangul_l && a < k_hangul_l + k_hangul_l_count && b >= k_hangul_v &&
      b < k_hangul_v + k_hangul_v_count)
    return k_hangul_s + ((a - k_hangul_l) * k_hangul_v_count + (b - k_hangul_v)) * k_hangul_t_count;
  if (a >= k_hangul_s && a < k_hangul_s + k_hangul_s_count && (a - k_hangul_s) % k_hangul_t_count == 0 &&
      b > k_hangul_t && b < k_hangul_t + k_hangul_t_count)
    return a + (b - k_hangul_t);
  static const std::unordered_map<uint64_t, char32_t> pairs = [] {
    std::unordered_map<uint64_t, char32_t> m;
    for (const auto& d : decompositions())
      if (d.composes)
        m.emplace(uint64_t(d.first) << 32 | d.second, d.cp);
    return m;
  }();
  auto it = pairs.find(uint64_t(a) << 32 | b);
  return it == pairs.end() ? 0 : it->second;
}

// Code points NFC may change or combine (Unicode's NFC_Quick_Check No and Maybe, derived from the
// tables): decompositions that do not compose back (singletons, exclusions), non-zero combining
// classes, and second halves of compositions (marks, Hangul vowels and trailing consonants, some
// Indic vowel signs). Text without any of them is already NFC: a precomposed letter (é) or a
// Hangul syllable only changes when one of those follows it. All lie below U+30000.
class nfc_quick_check {
public:
  nfc_quick_check() : flagged_(k_limit, false) {
    for (const auto& d : decompositions()) {
      if (d.composes)
        flagged_[d.second] = true; // a primary composite itself (é) is NFC-stable
      else
        flagged_[d.cp] = true; // singletons and exclusions never survive NFC
    }
    for (const auto& r : ccc_ranges())
      for (char32_t c = r.first; c <= r.last; ++c)
        flagged_[c] = true;
    for (char32_t c = k_hangul_v; c < k_hangul_v + k_hangul_v_count; ++c)
      flagged_[c] = true;
    for (char32_t c = k_hangul_t + 1; c < k_hangul_t + k_hangul_t_count; ++c)
      flagged_[c] = true;
  }
  bool maybe_changes(std::string_view utf8) const {
    for (std::size_t i = 0; i < utf8.size();) {
      if (static_cast<unsigned char>(utf8[i]) < 0xCC) { // below U+0300: never flagged
        ++i;
        continue;
      }
      const char32_t c = utf8_decode(utf8, i);
      if (c < k_limit && flagged_[c])
        return true;
    }
    return false;
  }

private:
  static constexpr char32_t k_limit = 0x30000;
  std::vector<bool> flagged_;
};

} // namespace

namespace bpe_detail {

std::string nfc(std::string_view utf8) {
  static const nfc_quick_check quick;
  if (!quick.maybe_changes(utf8))
    return std::string(utf8);
  std::vector<char32_t> cps;
  cps.reserve(utf8.size());
  for (std::size_t i = 0; i < utf8.size();)
    decompose(utf8_decode(utf8, i), cps);
  // Canonical ordering: a stable sort of every run of non-starters by combining class.
  std::vector<uint8_t> cls(cps.size());
  for (std::size_t i = 0; i < cps.size(); ++i)
    cls[i] = ccc_of(cps[i]);
  for (std::size_t i = 1; i < cps.size(); ++i)
    for (std::size_t j = i; j > 0 && cls[j] != 0 && cls[j - 1] > cls[j]; --j) {
      std::swap(cps[j], cps[j - 1]);
      std::swap(cls[j], cls[j - 1]);
    }
  // Canonical composition (the UAX #15 sample algorithm): a character composes with the last
  // starter unless a character between them has a class >= its own (it is "blocked").
  std::string out;
  out.reserve(utf8.size());
  if (!cps.empty()) {
    std::size_t starter = 0, write = 1;
    int last_class = cls[0] == 0 ? 0 : 256; // a leading non-starter composes with nothing
    for (std::size_t i = 1; i < cps.size(); ++i) {
      const char32_t c = cps[i];
      const int c_class = cls[i];
      const char32_t composite = compose_pair(cps[starter], c);
      if (composite != 0 && (last_class < c_class || last_class == 0)) {
        cps[starter] = composite;
        continue;
      }
      if (c_class == 0)
        starter = write;
      last_class = c_class;
      cps[write] = c;
      cls[write] = cls[i];
      ++write;
    }
    cps.resize(write);
  }
  for (char32_t c : cps)
    utf8_append(out, c);
  return out;
}

} // namespace bpe_detail

} // namespace rlserve::model
