// kv_cache: one sequence with a private, growing kv_pool — for single-sequence callers (tests,
// forward_all, `rlserve forward`). Runners share one fixed pool among all their sequences and
// use kv_pool + kv_sequence directly; this is the same storage, not a second implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/config.hpp"
#include "model/kv_pool.hpp"

namespace rlserve::model {

class kv_cache {
public:
  // Blocks of 16 tokens, allocated as the sequence grows.
  explicit kv_cache(const model_config& config, int64_t block_size = 16);

  // Tokens whose keys and values are held; the next token the model runs sits at this position.
  int64_t size() const { return seq_.length; }
  // The token ids held, in order.
  std::span<const int32_t> tokens() const { return tokens_; }
  // Forgets everything; keeps the memory for the next request.
  void clear() { truncate(0); }
  // Keeps the first `tokens` positions (clamped to [0, size()]): rolls back a rejected draft or a
  // prompt suffix to recompute.
  void truncate(int64_t tokens);
  // Makes room for `tokens` positions up front.
  void reserve(int64_t tokens);
  // Bytes of K/V storage allocated (capacity, not size).
  std::size_t bytes() const { return pool_.bytes(); }
  int64_t layers() const { return pool_.layers(); }
  int64_t kv_heads() const { return pool_.kv_heads(); }
  int64_t head_dim() const { return pool_.head_dim(); }

  // For qwen3_model::forward: the pool and the sequence, with room for `extra` more tokens.
  kv_pool& pool() { return pool_; }
  kv_sequence& sequence(int64_t extra);
  // Records ids that forward() appended.
  void append_tokens(std::span<const int32_t> ids) { tokens_.insert(tokens_.end(), ids.begin(), ids.end()); }

private:
  kv_pool pool_;
  kv_sequence seq_;
  std::vector<int32_t> tokens_;
};

} // namespace rlserve::model
