// block_manager: which KV blocks of the target runner's pool are free. The scheduler owns it and
// sends each sequence's new blocks with its work; the runner only stores into them. Lowest ids
// first, so runs are reproducible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace rlserve::policy {

class block_manager {
public:
  block_manager(int64_t num_blocks, int64_t block_size)
      : block_size_(std::max<int64_t>(block_size, 1)), total_(std::max<int64_t>(num_blocks, 0)) {
    free_.reserve(static_cast<std::size_t>(total_));
    for (int64_t b = total_ - 1; b >= 0; --b)
      free_.push_back(static_cast<int32_t>(b)); // back() is the lowest id
  }

  int64_t block_size() const { return block_size_; }
  int64_t total_blocks() const { return total_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t capacity_tokens() const { return total_ * block_size_; }
  int64_t blocks_for(int64_t tokens) const { return (std::max<int64_t>(tokens, 0) + block_size_ - 1) / block_size_; }

  // `n` blocks, or nullopt (and nothing taken) when fewer are free.
  [[nodiscard]] std::optional<std::vector<int32_t>> allocate(int64_t n) {
    if (n < 0 || n > free_blocks())
      return std::nullopt;
    std::vector<int32_t> out(static_cast<std::size_t>(n));
    for (auto& b : out) {
      b = free_.back();
      free_.pop_back();
    }
    return out;
  }

  void release(std::span<const int32_t> blocks) {
    // Keep lowest ids at the back so allocation order does not depend on release order: sort
    // the few released ids and merge them in (linear in the free list, not n log n).
    auto mid = static_cast<std::ptrdiff_t>(free_.size());
    free_.insert(free_.end(), blocks.begin(), blocks.end());
    std::sort(free_.begin() + mid, free_.end(), std::greater<int32_t>());
    std::inplace_merge(free_.begin(), free_.begin() + mid, free_.end(), std::greater<int32_t>());
  }

private:
  int64_t block_size_;
  int64_t total_;
  std::vector<int32_t> free_; // descending; back() is the next to hand out
};

} // namespace rlserve::policy
