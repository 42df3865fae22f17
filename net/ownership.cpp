#include "net/ownership.hpp"

#include <algorithm>

namespace rlserve::net {

void ownership::begin_succeeded(uint64_t owner) {
  std::lock_guard<std::mutex> guard{mtx_};
  session_owner_ = owner;
  session_start_ = clock::now();
  last_session_activity_ = session_start_;
  session_bytes_ = 0;
  ++session_epoch_;
}

bool ownership::end_sent(uint64_t requester) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (session_owner_ && *session_owner_ != 0 && *session_owner_ != requester)
    return false;
  ++ends_in_flight_;
  return true;
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
  ++session_epoch_;
  return length;
}

void ownership::end_refused() {
  std::lock_guard<std::mutex> guard{mtx_};
  if (ends_in_flight_ > 0)
    --ends_in_flight_;
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

bool ownership::add_tensor_bytes(uint64_t bytes, uint64_t limit, uint64_t* epoch_out) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (epoch_out)
    *epoch_out = session_epoch_;
  if (bytes > limit)
    return false;
  if (!session_owner_)
    return true;
  if (session_bytes_ > limit - bytes)
    return false;
  session_bytes_ += bytes;
  return true;
}

void ownership::refund_tensor_bytes(uint64_t bytes, uint64_t epoch) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (!session_owner_ || epoch != session_epoch_)
    return;
  session_bytes_ -= std::min(bytes, session_bytes_);
}

void ownership::session_request_sent() {
  std::lock_guard<std::mutex> guard{mtx_};
  ++session_requests_in_flight_;
}

void ownership::session_request_answered() {
  std::lock_guard<std::mutex> guard{mtx_};
  if (session_requests_in_flight_ > 0)
    --session_requests_in_flight_;
  last_session_activity_ = clock::now();
}

bool ownership::take_idle_http_session(std::chrono::milliseconds limit, clock::time_point now) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (limit.count() <= 0 || !session_owner_ || *session_owner_ != 0 || ends_in_flight_ > 0 ||
      session_requests_in_flight_ > 0 || now - last_session_activity_ < limit)
    return false;
  ++ends_in_flight_;
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
