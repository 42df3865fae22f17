// The tokenizer `rlserve make-model` ships with every generated model: a real byte-level BPE,
// trained here at generation time on a built-in few-KB corpus, written as a Hugging Face
// tokenizer.json in the Qwen2/Qwen3 layout (NFC normalizer, Split with the Qwen2 regex +
// ByteLevel pre-tokenizer, ByteLevel decoder), so tiny models exercise the same tokenizer path as
// real Qwen3 checkpoints and the file loads in Python `tokenizers` too.
//
// Ids: 0..255 are the byte-level symbols in byte order (id b is byte b), then the learned tokens
// in merge order, then <|endoftext|> (the eos), <|im_start|>, <|im_end|> as the last three ids.
// The training is deterministic (pair counts over the pre-tokenized corpus, ties broken by the
// byte strings of the pair, lexicographically), so the same vocab_size gives a byte-identical file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "messages/expected.hpp"

namespace rlserve::model {

struct tiny_tokenizer_info {
  int32_t vocab_size;
  int32_t eos_token_id;
  std::vector<std::string> special_tokens; // <|endoftext|>, <|im_start|>, <|im_end|>
};

// Smallest vocab_size accepted: the 256 bytes, the 3 special tokens and one learned token.
inline constexpr int32_t k_tiny_tokenizer_min_vocab = 260;
// Largest: every merge the corpus offers, then padding merges of two single bytes (all 65,536
// byte pairs, in byte order, skipping pairs whose token already exists). The padding tokens are
// real merges (they apply wherever those two bytes meet) but learned from nothing; they exist so
// make-model can build models with realistic embedding sizes.
inline constexpr int32_t k_tiny_tokenizer_max_vocab = 65'536;

// Writes DIR/tokenizer.json and DIR/tokenizer_config.json (creating DIR) with exactly vocab_size
// ids. Fails for vocab_size outside [k_tiny_tokenizer_min_vocab, k_tiny_tokenizer_max_vocab] or
// when DIR cannot be written.
expected<tiny_tokenizer_info> write_tiny_tokenizer(const std::filesystem::path& dir, int32_t vocab_size);

// The tokenizer.json text write_tiny_tokenizer writes (for tests and in-memory use).
expected<std::string> tiny_tokenizer_json(int32_t vocab_size);

// The built-in training text: English prose, dialogue with contractions, code, numbers and a
// little of other scripts and emoji.
std::string_view tiny_tokenizer_corpus();

} // namespace rlserve::model
