// kv_cache: the keys and values one request has computed so far, per layer, contiguous, growing
// as tokens are appended (amortized doubling). The scheduler issue replaces it with a paged pool
// shared by all requests; until then each request owns one of these.
//
// Keys are stored after q/k-norm and RoPE (what attention reads), values as projected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/config.hpp"

namespace rlserve::model {

class kv_cache {
public:
  explicit kv_cache(const model_config& config);

  // Tokens whose keys and values are held; the next token the model runs sits at this position.
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  // The token ids held, in order (what a prefix match compares against).
  std::span<const int32_t> tokens() const { return tokens_; }
  // Forgets everything; keeps the memory for the next request.
  void clear();
  // Keeps the first `tokens` positions (clamped to [0, size()]): rolls back a rejected draft or a
  // prompt suffix to recompute.
  void truncate(int64_t tokens);
  // Allocates room for `tokens` positions up front (a request knows prompt + max_new_tokens).
  void reserve(int64_t tokens);
  // Bytes of K/V storage allocated (capacity, not size).
  std::size_t bytes() const;

  int64_t layers() const { return layers_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

  // For the model's forward: appends `ids` and makes room for their keys/values (left for the
  // caller to fill), then hands out each layer's storage.
  void append(std::span<const int32_t> ids);
  float* keys(int64_t layer) { return k_[layer].data(); }   // [size(), kv_heads, head_dim]
  float* values(int64_t layer) { return v_[layer].data(); } // [size(), kv_heads, head_dim]
  const float* keys(int64_t layer) const { return k_[layer].data(); }
  const float* values(int64_t layer) const { return v_[layer].data(); }

private:
  int64_t layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<std::vector<float>> k_, v_; // [layers][size * kv_heads * head_dim]
};

} // namespace rlserve::model
