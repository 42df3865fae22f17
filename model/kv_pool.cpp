#include "model/kv_pool.hpp"

#include <algorithm>

namespace rlserve::model {

kv_pool::kv_pool(const model_config& config, int64_t block_size, int64_t num_blocks)
    : layers_(std::max<int64_t>(config.num_hidden_layers, 0)),
      kv_heads_(config.num_key_value_heads), head_dim_(config.head_dim),
      block_size_(std::max<int64_t>(block_size, 1)),
      k_(static_cast<std::size_t>(layers_)), v_(static_cast<std::size_t>(layers_)) {
  add_blocks(num_blocks);
}

std::size_t kv_pool::bytes_per_token() const {
  return static_cast<std::size_t>(2 * layers_ * kv_heads_ * head_dim_) * sizeof(float);
}

void kv_pool::copy_slots(int32_t from, int32_t to, int64_t slots) {
  const auto n = static_cast<std::ptrdiff_t>(slots * kv_heads_ * head_dim_);
  for (int64_t l = 0; l < layers_; ++l) {
    std::copy_n(key_slot(l, from, 0), n, key_slot(l, to, 0));
    std::copy_n(value_slot(l, from, 0), n, value_slot(l, to, 0));
  }
}

void kv_pool::add_blocks(int64_t n) {
  if (n <= 0)
    return;
  num_blocks_ += n;
  auto floats = static_cast<std::size_t>(num_blocks_ * block_size_ * kv_heads_ * head_dim_);
  for (auto& k : k_)
    k.resize(floats);
  for (auto& v : v_)
    v.resize(floats);
}

} // namespace rlserve::model
