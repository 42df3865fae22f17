// Byte-level BPE from tokenizer.json: encoding, decoding and the building blocks; see
// bpe_tokenizer.hpp for the pipeline, bpe_tokenizer_load.cpp for reading tokenizer.json and
// bpe_nfc.cpp for the NFC normalizer. The reference for every behaviour here is the Rust
// `tokenizers` crate (the Python package's engine); where this file does something on purpose that
// looks odd, the comment names the `tokenizers` behaviour it reproduces.
#include "model/bpe_tokenizer.hpp"

#include <algorithm>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "model/bpe_tokenizer_state.hpp"
#include "model/unicode_data.hpp"

namespace rlserve::model {

using namespace bpe_internal;

// ---- encoding with the loaded state -----------------------------------------------------------

// A normalized piece of text: cut out the normalized added tokens, pre-tokenize the rest.
void bpe_tokenizer::state::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  normalized_matcher.split(
    piece, [&](std::string_view gap) { pre_tokenize(gap, 0, ids); },
    [&](int32_t id) { ids.push_back(id); });
}

// Split step `step` on one piece (NormalizedString::split with a regex Pattern), recursing into
// the next step for every piece it keeps; empty pieces are dropped, as PreTokenizedString::split
// does.
void bpe_tokenizer::state::pre_tokenize(std::string_view piece, std::size_t step,
                                        std::vector<int32_t>& ids) const {
  if (piece.empty())
    return;
  if (step == splits.size()) {
    byte_level(piece, ids);
    return;
  }
  const split_step& sp = splits[step];
  // (begin, end, is_match) covering the whole piece.
  struct part {
    std::size_t b, e;
    bool match;
  };
  std::vector<part> parts;
  std::size_t prev = 0;
  for (auto [b, e] : sp.re.find_all(piece)) {
    if (prev != b)
      parts.push_back({prev, b, sp.invert});
    parts.push_back({b, e, !sp.invert});
    prev = e;
  }
  if (prev != piece.size())
    parts.push_back({prev, piece.size(), sp.invert});

  auto emit = [&](std::size_t b, std::size_t e) { pre_tokenize(piece.substr(b, e - b), step + 1, ids); };
  switch (sp.behavior) {
  case split_behavior::isolated:
    for (const auto& p : parts)
      emit(p.b, p.e);
    break;
  case split_behavior::removed:
    for (const auto& p : parts)
      if (!p.match)
        emit(p.b, p.e);
    break;
  case split_behavior::contiguous:
  case split_behavior::merged_with_previous: {
    // Contiguous glues runs of equal kind; MergedWithPrevious glues a match to what precedes it.
    std::vector<part> out;
    bool previous_match = false;
    for (const auto& p : parts) {
      bool glue = sp.behavior == split_behavior::contiguous ? p.match == previous_match
                                                             : p.match && !previous_match;
      if (glue && !out.empty())
        out.back().e = p.e;
      else
        out.push_back(p);
      previous_match = p.match;
    }
    for (const auto& p : out)
      emit(p.b, p.e);
    break;
  }
  case split_behavior::merged_with_next: {
    std::vector<part> out;
    bool previous_match = false;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      if (it->match && !previous_match && !out.empty())
        out.back().b = it->b;
      else
        out.push_back(*it);
      previous_match = it->match;
    }
    for (auto it = out.rbegin(); it != out.rend(); ++it)
      emit(it->b, it->e);
    break;
  }
  }
}

// The ByteLevel pre-tokenizer: prefix space, GPT-2 regex (Isolated), then BPE on the bytes.
void bpe_tokenizer::state::byte_level(std::string_view piece, std::vector<int32_t>& ids) const {
  std::string prefixed;
  if (add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!byte_level_regex) {
    bpe(piece, ids);
    return;
  }
  std::size_t prev = 0;
  for (auto [b, e] : byte_level_regex->find_all(piece)) {
    if (prev != b)
      bpe(piece.substr(prev, b - prev), ids);
    if (b != e)
      bpe(piece.substr(b, e - b), ids);
    prev = e;
  }
  if (prev != piece.size())
    bpe(piece.substr(prev), ids);
}

void bpe_tokenizer::state::bpe(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty())
    return;
  if (ignore_merges) {
    // Llama-3 style: a pre-token that is itself a vocab entry is taken whole.
    if (auto it = vocab.find(bpe_detail::bytes_to_symbols(word)); it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1 && byte_id[static_cast<unsigned char>(word[0])] >= 0) {
    ids.push_back(byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  const bool cacheable = word.size() < k_cache_max_word;
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(word); it != cache.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = ids.size();
  merge_word(word, ids);
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (cache.size() >= k_cache_capacity)
      cache.clear();
    cache.emplace(std::string(word), std::vector<int32_t>(ids.begin() + first, ids.end()));
  }
}

// BPE::merge_word + Word::merge_all of `tokenizers`, step for step: the initial symbols are the
// word's byte-level characters (unknown ones through byte_fallback, then unk), and merges are
// applied from a min-heap on (rank, position), skipping entries made stale by earlier merges.
// Applying merges in exactly this order matters: the textbook "merge all occurrences of the best
// pair" loop gives the same result for well-formed vocabularies but not for every file.
void bpe_tokenizer::state::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  struct symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<symbol> syms;
  syms.reserve(word.size());
  auto add = [&](int32_t id) {
    int32_t n = int32_t(syms.size());
    if (n > 0)
      syms.back().next = n;
    syms.push_back({id, n - 1, -1, true});
  };
  std::optional<int32_t> pending_unk;
  for (unsigned char b : word) {
    if (int32_t id = byte_id[b]; id >= 0) {
      if (pending_unk) {
        add(*pending_unk);
        pending_unk.reset();
      }
      add(id);
      continue;
    }
    const std::string& sym = tables().symbol[b];
    if (byte_fallback) {
      // `tokenizers` looks up "<0xXX>" for each UTF-8 byte of the byte-level *symbol*, and does
      // not flush a pending unk first; both reproduced as is.
      std::vector<int32_t> fb;
      for (unsigned char sb : sym) {
        auto it = vocab.find(fmt::format("<0x{:02X}>", sb));
        if (it == vocab.end()) {
          fb.clear();
          break;
        }
        fb.push_back(it->second);
      }
      if (!fb.empty()) {
        for (int32_t id : fb)
          add(id);
        continue;
      }
    }
    if (unk_id) {
      if (pending_unk && !fuse_unk)
        add(*pending_unk);
      pending_unk = *unk_id;
    }
    // No unk token: the byte is dropped, as `tokenizers` does.
  }
  if (pending_unk)
    add(*pending_unk);
  if (syms.empty())
    return;

  struct entry {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  // std heap is a max-heap: "greater" entries sink, so order by (rank, pos) reversed.
  auto later = [](const entry& a, const entry& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<entry> heap;
  heap.reserve(syms.size());
  for (int32_t i = 0; i + 1 < int32_t(syms.size()); ++i)
    if (auto it = merges.find(pair_key(syms[i].id, syms[i + 1].id)); it != merges.end())
      heap.push_back({it->second.rank, i, it->second.new_id});
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    entry top = heap.back();
    heap.pop_back();
    symbol& cur = syms[top.pos];
    if (!cur.alive || cur.next < 0)
      continue;
    symbol& right = syms[cur.next];
    auto it = merges.find(pair_key(cur.id, right.id));
    if (it == merges.end() || it->second.new_id != top.new_id)
      continue; // stale: one side was merged since this entry was pushed
    cur.id = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0)
      syms[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (auto m = merges.find(pair_key(syms[cur.prev].id, cur.id)); m != merges.end()) {
        heap.push_back({m->second.rank, cur.prev, m->second.new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    if (cur.next >= 0)
      if (auto m = merges.find(pair_key(cur.id, syms[cur.next].id)); m != merges.end()) {
        heap.push_back({m->second.rank, top.pos, m->second.new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
  }
  for (const auto& s : syms)
    if (s.alive)
      ids.push_back(s.id);
}

// ---- bpe_tokenizer --------------------------------------------------------------------------

std::vector<int32_t> bpe_tokenizer::encode(std::string_view text) const {
  const state& st = *state_;
  std::string repaired;
  if (!utf8_is_valid(text)) {
    repaired = bpe_detail::utf8_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  st.raw_matcher.split(
    text,
    [&](std::string_view gap) {
      if (st.nfc) {
        const std::string normalized = bpe_detail::nfc(gap);
        st.encode_piece(normalized, ids);
      } else {
        st.encode_piece(gap, ids);
      }
    },
    [&](int32_t id) { ids.push_back(id); });
  return ids;
}

std::string bpe_tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const state& st = *state_;
  std::string bytes;
  for (int32_t id : ids) {
    if (!st.present(id))
      continue;
    if (skip_special_tokens && (st.flags[id] & state::k_special))
      continue;
    bytes += st.bytes_of(id);
  }
  return bpe_detail::utf8_lossy(bytes);
}

int32_t bpe_tokenizer::vocab_size() const { return state_->vocab_size; }

std::optional<int32_t> bpe_tokenizer::token_id(std::string_view token) const {
  if (auto it = state_->added_by_content.find(token); it != state_->added_by_content.end())
    return it->second;
  if (auto it = state_->vocab.find(token); it != state_->vocab.end())
    return it->second;
  return std::nullopt;
}

std::optional<std::string> bpe_tokenizer::token_text(int32_t id) const {
  if (!state_->present(id))
    return std::nullopt;
  return std::string(state_->text_of(id));
}

std::optional<std::string> bpe_tokenizer::token_bytes(int32_t id) const {
  if (!state_->present(id))
    return std::nullopt;
  return std::string(state_->bytes_of(id));
}

bool bpe_tokenizer::is_special(int32_t id) const {
  return state_->present(id) && (state_->flags[id] & state::k_special);
}

std::vector<int32_t> bpe_tokenizer::special_token_ids() const {
  std::vector<int32_t> out;
  for (const auto& t : state_->added)
    if (t.special)
      out.push_back(t.id);
  std::sort(out.begin(), out.end());
  return out;
}

// ---- incremental_decoder --------------------------------------------------------------------

incremental_decoder::incremental_decoder(const bpe_tokenizer& tok, bool skip_special_tokens)
  : tok_(tok), skip_special_(skip_special_tokens) {}

// Emits every complete character of pending_ + the token's bytes and keeps a trailing valid but
// incomplete prefix. Ill-formed subparts become U+FFFD right away: whether bytes are ill-formed
// never depends on bytes that come later, so the pieces add up to exactly utf8_lossy(all bytes).
std::string incremental_decoder::push(int32_t id) {
  auto bytes = tok_.token_bytes(id);
  if (!bytes || (skip_special_ && tok_.is_special(id)))
    return {};
  pending_ += *bytes;
  std::string out;
  auto p = reinterpret_cast<const unsigned char*>(pending_.data());
  std::size_t i = 0;
  while (i < pending_.size()) {
    auto st = utf8_next(p + i, pending_.size() - i);
    if (st.kind == utf8_kind::incomplete)
      break;
    if (st.kind == utf8_kind::valid)
      out.append(pending_, i, st.len);
    else
      out += k_replacement;
    i += st.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string incremental_decoder::finish() {
  // What is left is one valid but cut-off prefix: from_utf8_lossy makes it a single U+FFFD.
  std::string out = pending_.empty() ? std::string() : std::string(k_replacement);
  pending_.clear();
  return out;
}

// ---- building blocks ------------------------------------------------------------------------

namespace bpe_detail {

const std::array<char32_t, 256>& byte_to_unicode() { return tables().to_unicode; }

std::string bytes_to_symbols(std::string_view bytes) {
  const auto& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes)
    out += t.symbol[b];
  return out;
}

std::optional<std::string> symbols_to_bytes(std::string_view symbols) {
  const auto& t = tables();
  if (!utf8_is_valid(symbols))
    return std::nullopt;
  std::string out;
  out.reserve(symbols.size());
  std::size_t i = 0;
  while (i < symbols.size()) {
    char32_t c = utf8_decode(symbols, i);
    if (c >= t.to_byte.size() || t.to_byte[c] < 0)
      return std::nullopt;
    out += char(t.to_byte[c]);
  }
  return out;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  auto p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t i = 0;
  while (i < bytes.size()) {
    auto st = utf8_next(p + i, bytes.size() - i);
    if (st.kind == utf8_kind::valid)
      out.append(bytes.data() + i, st.len);
    else
      out += k_replacement;
    i += st.len;
  }
  return out;
}

} // namespace bpe_detail

namespace bpe_internal {

bool is_word_char_at(std::string_view text, std::size_t i) {
  // Rust's regex \w: Alphabetic, marks, decimal digits, connector punctuation and the joiners.
  using g = unicode::general_category;
  static constexpr unicode::property_mask word =
    unicode::category_bit(g::Lu) | unicode::category_bit(g::Ll) | unicode::category_bit(g::Lt) |
    unicode::category_bit(g::Lm) | unicode::category_bit(g::Lo) | unicode::category_bit(g::Nl) |
    unicode::category_bit(g::Mn) | unicode::category_bit(g::Mc) | unicode::category_bit(g::Me) |
    unicode::category_bit(g::Nd) | unicode::category_bit(g::Pc) | unicode::k_alphabetic_extra_bit;
  if (i >= text.size())
    return false;
  std::size_t j = i;
  const char32_t c = utf8_decode(text, j);
  return c == 0x200C || c == 0x200D || (unicode::atoms(c) & word) != 0;
}

} // namespace bpe_internal

} // namespace rlserve::model
