// shared_state's registries of sessions and actors (see shared_state.hpp).
#include "net/shared_state.hpp"

#include "caf/send.hpp"

namespace rlserve::net::detail {

void shared_state::session_opened() {
  std::lock_guard<std::mutex> guard{sessions_mtx_};
  ++sessions_;
}

void shared_state::session_closed() {
  {
    std::lock_guard<std::mutex> guard{sessions_mtx_};
    --sessions_;
  }
  sessions_cv_.notify_all();
}

uint64_t shared_state::add_dropper(std::function<void()> drop) {
  std::lock_guard<std::mutex> guard{sessions_mtx_};
  auto id = next_dropper_++;
  droppers_.emplace(id, std::move(drop));
  return id;
}

void shared_state::remove_dropper(uint64_t id) {
  std::lock_guard<std::mutex> guard{sessions_mtx_};
  droppers_.erase(id);
}

std::size_t shared_state::drop_sessions(std::chrono::milliseconds timeout) {
  std::unordered_map<uint64_t, std::function<void()>> all;
  {
    std::lock_guard<std::mutex> guard{sessions_mtx_};
    all = droppers_;
  }
  for (auto& [id, drop] : all)
    drop();
  std::unique_lock<std::mutex> lock{sessions_mtx_};
  sessions_cv_.wait_for(lock, timeout, [this] { return sessions_ == 0; });
  return sessions_;
}

uint64_t shared_state::reserve_actor() {
  std::lock_guard<std::mutex> guard{actors_mtx_};
  auto id = next_actor_++;
  actors_.emplace(id, caf::actor{});
  return id;
}

void shared_state::set_actor(uint64_t id, caf::actor handle) {
  std::lock_guard<std::mutex> guard{actors_mtx_};
  if (auto it = actors_.find(id); it != actors_.end())
    it->second = std::move(handle);
}

void shared_state::remove_actor(uint64_t id) {
  caf::actor dropped;
  {
    std::lock_guard<std::mutex> guard{actors_mtx_};
    if (auto it = actors_.find(id); it != actors_.end()) {
      dropped = std::move(it->second);
      actors_.erase(it);
    }
  }
  actors_cv_.notify_all();
}

std::size_t shared_state::wait_for_actors(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock{actors_mtx_};
  actors_cv_.wait_for(lock, timeout, [this] { return actors_.empty(); });
  return actors_.size();
}

std::size_t shared_state::kill_actors(caf::exit_reason reason) {
  std::unordered_map<uint64_t, caf::actor> left;
  {
    std::lock_guard<std::mutex> guard{actors_mtx_};
    left.swap(actors_);
  }
  for (auto& [id, a] : left)
    if (a)
      caf::anon_send_exit(a, reason);
  return left.size();
}

} // namespace rlserve::net::detail
