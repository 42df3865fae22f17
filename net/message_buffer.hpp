// The buffer a websocket session reads each message into: an Asio (v1) DynamicBuffer whose
// storage is handed to the actors as shared_bytes when the message is complete, so a tensor
// payload of update_weights_from_tensor is aliased by the HostTensors, never copied.
//
//   ws.async_read(buf, ...);            // Beast appends the payload (prepare/commit)
//   shared_bytes frame = buf.take();    // the message; buf is empty again
//
// After take() the storage is shared with whoever holds the frame. A new message reuses a
// storage nobody holds any more; the buffer keeps the previous one for that, because the engine may
// still hold the previous frame for a moment after its reply went out (the client then sends the
// next frame at once). A client sending large frames of one size thus costs no allocation, no
// page faults and no growth copies per frame.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include <boost/asio/buffer.hpp>

#include "net/protocol.hpp"

namespace rlserve::net {

class message_buffer {
public:
  using const_buffers_type = boost::asio::const_buffer;
  using mutable_buffers_type = boost::asio::mutable_buffer;

  explicit message_buffer(std::size_t max_size) : max_(max_size) {}

  std::size_t size() const { return size_; }
  std::size_t max_size() const { return max_; }
  std::size_t capacity() const { return capacity_; }
  const_buffers_type data() const { return {storage_.get(), size_}; }

  mutable_buffers_type prepare(std::size_t n) {
    if (n > max_ - size_)
      throw std::length_error("websocket message larger than the server's limit");
    if (size_ == 0 && storage_ && storage_.use_count() > 1)
      swap_for_free_storage();
    // use_count() is a relaxed read; the acquire fence orders our writes after the reader's
    // (it released the bytes with shared_ptr's acq_rel decrement).
    std::atomic_thread_fence(std::memory_order_acquire);
    if (size_ + n > capacity_)
      grow(size_ + n);
    return {storage_.get() + size_, n};
  }

  void commit(std::size_t n) { size_ += std::min(n, capacity_ - size_); }

  void consume(std::size_t n) {
    n = std::min(n, size_);
    if (n < size_)
      std::memmove(storage_.get(), storage_.get() + n, size_ - n);
    size_ -= n;
  }

  // The message read so far (the whole message after a completed read); the buffer is empty
  // afterwards.
  shared_bytes take() {
    shared_bytes out{std::shared_ptr<const std::byte>(storage_, storage_.get()), size_};
    size_ = 0;
    return out;
  }

private:
  static constexpr std::size_t k_kept = 1; // storages kept for reuse besides the current one

  // The current storage is still held by an actor: keep it aside and continue in one nobody
  // holds, or in a fresh one.
  void swap_for_free_storage() {
    kept_.push_back({std::move(storage_), capacity_});
    storage_.reset();
    capacity_ = 0;
    for (auto it = kept_.begin(); it != kept_.end(); ++it)
      if (it->data.use_count() == 1) {
        storage_ = std::move(it->data);
        capacity_ = it->capacity;
        kept_.erase(it);
        break;
      }
    if (kept_.size() > k_kept)
      kept_.erase(kept_.begin());
  }

  void grow(std::size_t needed) {
    // Doubling keeps the copies of a message that arrives in many reads linear in its size.
    std::size_t cap = std::max<std::size_t>({needed, capacity_ * 2, 4096});
    cap = std::min(cap, max_);
    std::shared_ptr<std::byte[]> bigger(new std::byte[cap]);
    if (size_)
      std::memcpy(bigger.get(), storage_.get(), size_);
    storage_ = std::move(bigger);
    capacity_ = cap;
  }

  struct kept_storage {
    std::shared_ptr<std::byte[]> data;
    std::size_t capacity = 0;
  };
  std::size_t max_;
  std::vector<kept_storage> kept_;
  std::shared_ptr<std::byte[]> storage_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

} // namespace rlserve::net
