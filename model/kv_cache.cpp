#include "model/kv_cache.hpp"

#include <algorithm>

namespace rlserve::model {

kv_cache::kv_cache(const model_config& config, int64_t block_size) : pool_(config, block_size, 0) {}

void kv_cache::truncate(int64_t tokens) {
  tokens = std::clamp<int64_t>(tokens, 0, size());
  seq_.length = tokens;
  tokens_.resize(static_cast<std::size_t>(tokens));
}

void kv_cache::reserve(int64_t tokens) {
  auto bs = pool_.block_size();
  auto needed = (tokens + bs - 1) / bs;
  while (static_cast<int64_t>(seq_.blocks.size()) < needed) {
    if (pool_.num_blocks() <= static_cast<int64_t>(seq_.blocks.size()))
      pool_.add_blocks(std::max<int64_t>(needed - pool_.num_blocks(), 1));
    seq_.blocks.push_back(static_cast<int32_t>(seq_.blocks.size()));
  }
}

kv_sequence& kv_cache::sequence(int64_t extra) {
  reserve(seq_.length + extra);
  return seq_;
}

} // namespace rlserve::model
