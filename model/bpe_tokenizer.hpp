// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2 and Qwen2/Qwen3 style;
// Llama-3 style too, except that a post-processor adding <|begin_of_text|> is refused), producing
// the same ids as the `tokenizers` library for every input, and a streaming decoder for the
// tokenizer actor.
//
// The pipeline is the one `tokenizers` runs for a single sequence, in the same order:
//   1. added tokens with normalized=false are cut out of the raw text (leftmost-longest),
//   2. each remaining piece is normalized (nothing, or NFC) and tokens with normalized=true are
//      cut out of it,
//   3. each remaining piece goes through the pre-tokenizer: Split steps (regex or literal) and a
//      final ByteLevel step (optional prefix space, optional GPT-2 regex, bytes -> printable
//      symbols),
//   4. each pre-token is merged by BPE, lowest merge rank first (cached per pre-token).
// Decoding maps every token back to its bytes and replaces broken UTF-8 with U+FFFD, as the
// ByteLevel decoder does. Everything `tokenizers` could do differently from this (other models,
// normalizers, post-processors that add BOS/EOS, BPE dropout, ...) is refused at load with the JSON
// path that holds it, rather than tokenized in a way the model was not trained on.
//
// A bpe_tokenizer is immutable after load, cheap to copy (shared state) and safe to use from
// several threads at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "messages/expected.hpp"

namespace rlserve::model {

class bpe_tokenizer {
public:
  // Reads and validates DIR/tokenizer.json-style files; fails naming the file and the JSON path.
  static expected<bpe_tokenizer> from_file(const std::filesystem::path& tokenizer_json);
  static expected<bpe_tokenizer> from_json(const nlohmann::json& tokenizer_json);

  // Text -> ids. Added/special tokens written in the text are matched as whole tokens (HF default
  // behaviour, `split_special_tokens=False`). Invalid UTF-8 is read as U+FFFD, as Python does
  // with errors="replace", so every byte string has a tokenization.
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids -> text; ids that name no token are skipped (as `tokenizers` does). Broken UTF-8 in the
  // concatenated token bytes becomes U+FFFD (one per maximal ill-formed subpart).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  int32_t vocab_size() const; // model vocab + added tokens (max id + 1)
  std::optional<int32_t> token_id(std::string_view token) const;
  std::optional<std::string> token_text(int32_t id) const; // the vocab string (byte-level alphabet)
  bool is_special(int32_t id) const;

  // The raw bytes `id` contributes to decode(): the byte-level symbols mapped back to bytes, or
  // an added token's content. Not necessarily valid UTF-8 on its own (half an emoji).
  std::optional<std::string> token_bytes(int32_t id) const;
  // Ids of the added tokens marked special, ascending (eos, chat markers, ...).
  std::vector<int32_t> special_token_ids() const;

  struct state; // the loaded tables; defined in bpe_tokenizer.cpp

private:
  explicit bpe_tokenizer(std::shared_ptr<const state> s) : state_(std::move(s)) {}
  std::shared_ptr<const state> state_;
};

// Streaming detokenization: push ids one at a time, get the text that became complete. The
// concatenation of every push() and the final finish() equals decode(all ids) exactly.
class incremental_decoder {
public:
  // Copies the (shared) tokenizer state, so the decoder may outlive `tok`.
  explicit incremental_decoder(const bpe_tokenizer& tok, bool skip_special_tokens = true);
  std::string push(int32_t id); // never returns half a UTF-8 character
  std::string finish();         // the rest; incomplete UTF-8 becomes U+FFFD as HF decode does
  // Bytes held back waiting for the rest of a UTF-8 character (0..3).
  std::size_t pending_bytes() const { return pending_.size(); }

private:
  bpe_tokenizer tok_;
  bool skip_special_;
  std::string pending_; // a valid but incomplete UTF-8 prefix
};

// Building blocks, public for the tests and for the tiny tokenizer's trainer.
namespace bpe_detail {

// The pre-tokenizer regexes of GPT-2 (ByteLevel use_regex=true) and of Qwen2/Qwen3.
inline constexpr std::string_view gpt2_pattern =
  R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view qwen2_pattern =
  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode(): byte b -> a printable code point, so every byte string becomes a
// printable string (' ' -> U+0120 'Ġ', '\n' -> U+010A 'Ċ'). Printable Latin-1 bytes map to
// themselves; the other 68 bytes map to U+0100.. in byte order.
const std::array<char32_t, 256>& byte_to_unicode();
// Bytes -> byte-level symbols (UTF-8) and back; nullopt when a code point is not in the table.
std::string bytes_to_symbols(std::string_view bytes);
std::optional<std::string> symbols_to_bytes(std::string_view symbols);

// Canonical composition (NFC) with the Unicode data of `tokenizers`' normalizer.
std::string nfc(std::string_view utf8);
// Python's bytes.decode("utf-8", errors="replace") / Rust's from_utf8_lossy.
std::string utf8_lossy(std::string_view bytes);

// A compiled Split pattern, matched as `tokenizers`' Oniguruma matches it (bpe_regex.cpp), with
// the Unicode 16.0 classes of the project's own table (unicode_data.hpp): the same pieces on any
// host. The subset of Oniguruma's syntax it reads (anything else is refused at compile, naming it):
//   literals, escapes \t \n \r \f \v \a \e \xHH \x{H..} \uHHHH and escaped punctuation;
//   . (not \n); classes [...] with ranges, ^ negation and the escapes below inside;
//   \s \S (White_Space), \d \D (Nd), \w \W (Oniguruma's word), \h (hex digit),
//   \p{..} \P{..} \p{^..} with general categories by short or long name, and White_Space;
//   groups (...) (?:...), lookahead (?=...) (?!...), the i flag as (?i:...) (?i) (?-i:...)
//   for ASCII letters; quantifiers ? * + {n} {n,} {n,m} {,m}, lazy with a trailing ?;
//   alternation |; anchors ^ $ (lines) \A \z \Z.
// Not supported: backreferences, lookbehind, possessive quantifiers, nested classes and &&,
// scripts and binary properties other than White_Space, \b, \G, flags other than i.
class regex {
public:
  static expected<regex> compile(std::string_view pattern, bool literal = false);
  // Every non-overlapping match in `text` (which must be valid UTF-8), as byte ranges, in order.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;
  struct code;

private:
  std::shared_ptr<const code> code_;
};

} // namespace bpe_detail

} // namespace rlserve::model
