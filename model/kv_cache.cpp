#include "model/kv_cache.hpp"

#include <algorithm>

namespace rlserve::model {

kv_cache::kv_cache(const model_config& config)
    : layers_(config.num_hidden_layers), kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim), k_(static_cast<std::size_t>(std::max<int64_t>(layers_, 0))),
      v_(static_cast<std::size_t>(std::max<int64_t>(layers_, 0))) {}

void kv_cache::clear() { truncate(0); }

void kv_cache::truncate(int64_t tokens) {
  tokens = std::clamp<int64_t>(tokens, 0, size());
  tokens_.resize(static_cast<std::size_t>(tokens));
  const auto floats = static_cast<std::size_t>(tokens * kv_heads_ * head_dim_);
  for (auto& k : k_)
    k.resize(floats);
  for (auto& v : v_)
    v.resize(floats);
}

void kv_cache::reserve(int64_t tokens) {
  if (tokens <= 0)
    return;
  tokens_.reserve(static_cast<std::size_t>(tokens));
  const auto floats = static_cast<std::size_t>(tokens * kv_heads_ * head_dim_);
  for (auto& k : k_)
    k.reserve(floats);
  for (auto& v : v_)
    v.reserve(floats);
}

std::size_t kv_cache::bytes() const {
  std::size_t n = 0;
  for (const auto& k : k_)
    n += k.capacity() * sizeof(float);
  for (const auto& v : v_)
    n += v.capacity() * sizeof(float);
  return n;
}

void kv_cache::append(std::span<const int32_t> ids) {
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  const auto floats = tokens_.size() * static_cast<std::size_t>(kv_heads_ * head_dim_);
  for (auto& k : k_)
    k.resize(floats);
  for (auto& v : v_)
    v.resize(floats);
}

} // namespace rlserve::model
