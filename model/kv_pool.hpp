// kv_pool: the paged KV storage of one runner — the one abstraction of KV memory in rlserve (the
// CPU runner uses it now; the GPU runner's device pool has the same shape). Memory is cut into
// blocks of `block_size` token slots; a sequence owns a list of blocks (its block table) and
// fills them in order. Which blocks a sequence gets is decided by the scheduler (its prefix cache,
// actors/policy/prefix_cache.hpp) and travels in each forward batch; the pool only stores.
//
// Layout per layer, for keys and values alike: [num_blocks, block_size, kv_heads, head_dim]
// fp32. Keys are stored after q/k-norm and RoPE (what attention reads), values as projected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/config.hpp"

namespace rlserve::model {

class kv_pool {
public:
  kv_pool(const model_config& config, int64_t block_size, int64_t num_blocks);

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t layers() const { return layers_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  // Bytes of one token's keys and values over all layers.
  std::size_t bytes_per_token() const;
  std::size_t bytes() const { return bytes_per_token() * static_cast<std::size_t>(num_blocks_ * block_size_); }

  // The slot of token `slot` (0 .. block_size - 1) of `block` in `layer`: [kv_heads, head_dim].
  float* key_slot(int64_t layer, int32_t block, int64_t slot) { return k_[layer].data() + offset(block, slot); }
  float* value_slot(int64_t layer, int32_t block, int64_t slot) { return v_[layer].data() + offset(block, slot); }
  const float* key_slot(int64_t layer, int32_t block, int64_t slot) const { return k_[layer].data() + offset(block, slot); }
  const float* value_slot(int64_t layer, int32_t block, int64_t slot) const { return v_[layer].data() + offset(block, slot); }

  // Copies the first `slots` token slots of block `from` into block `to`, every layer (a prefix
  // cache's copy-on-write of a partly shared block). The caller checks ids and counts.
  void copy_slots(int32_t from, int32_t to, int64_t slots);

  // Appends `n` blocks (ids num_blocks() .. num_blocks() + n - 1). For pools that grow with one
  // sequence (kv_cache); a shared runner pool is sized once.
  void add_blocks(int64_t n);

private:
  std::size_t offset(int32_t block, int64_t slot) const {
    return (static_cast<std::size_t>(block) * block_size_ + slot) * kv_heads_ * head_dim_;
  }

  int64_t layers_, kv_heads_, head_dim_, block_size_, num_blocks_ = 0;
  std::vector<std::vector<float>> k_, v_; // per layer
};

// One sequence's KV in a pool: its blocks in order and how many positions hold keys/values.
// Position p lives in blocks[p / block_size] at slot p % block_size.
struct kv_sequence {
  std::vector<int32_t> blocks;
  int64_t length = 0;
};

} // namespace rlserve::model
