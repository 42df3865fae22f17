#include "net/ownership.hpp"

namespace rlserve::net {

void ownership::begin_succeeded(uint64_t owner) {
  std::lock_guard<std::mutex> guard{mtx_};
  session_owner_ = owner;
  session_start_ = clock::now();
  session_bytes_ = 0;
}

void ownership::end_sent() {
  std::lock_guard<std::mutex> guard{mtx_};
  ++ends_in_flight_;
}

std::optional<double> ownership::end_finished() {
  std::lock_guard<std::mutex> guard{mtx_};
  if (ends_in_flight_ > 0)
    --ends_in_flight_;
  std::optional<double> length;
  if (session_owner_)
    length = std::chrono::duration<double>(clock::now() - session_start_).count();
  session_owner_.reset();
  session_bytes_ = 0;
  return length;
}

bool ownership::take_session_for_abort(uint64_t owner) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (!session_owner_ || *session_owner_ != owner || ends_in_flight_ > 0)
    return false;
  ++ends_in_flight_;
  return true;
}

bool ownership::session_open() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return session_owner_.has_value();
}

bool ownership::add_tensor_bytes(uint64_t bytes, uint64_t limit) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (bytes > limit)
    return false;
  if (!session_owner_)
    return true;
  if (session_bytes_ > limit - bytes)
    return false;
  session_bytes_ += bytes;
  return true;
}

void ownership::pause_succeeded(uint64_t owner) {
  std::lock_guard<std::mutex> guard{mtx_};
  pause_owner_ = owner;
}

void ownership::continue_sent() {
  std::lock_guard<std::mutex> guard{mtx_};
  pause_owner_.reset();
}

bool ownership::take_pause_for_resume(uint64_t owner) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (!pause_owner_ || *pause_owner_ != owner)
    return false;
  pause_owner_.reset();
  return true;
}

} // namespace rlserve::net
