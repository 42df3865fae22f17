// A TCPStore server for C++ tests: the queries an engine rank sends (VALIDATE, PING, ADD, SET,
// GET, CHECK, WAIT with CANCEL_WAIT), written from PyTorch's protocol as model/tcp_store.hpp
// describes it, on 127.0.0.1 at a free port. tests/python/test_tcp_store.py holds the client to
// an independent store, tests/gpu/test_tcp_store.py to PyTorch's own; this one lets actor tests
// play a trainer: publish a unique id, close every connection (a trainer that died), or (silent)
// accept connections and never answer (a trainer that hangs).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "messages/weight_update.hpp"
#include "model/tcp_store.hpp"

namespace rlserve::test {

class fake_tcp_store {
public:
  struct silent_t {};
  static constexpr silent_t silent{};

  fake_tcp_store() : fake_tcp_store(false) {}
  // Accepts connections and reads what they send, but answers nothing.
  explicit fake_tcp_store(silent_t) : fake_tcp_store(true) {}
  ~fake_tcp_store() { close_all(); }

  int port() const { return port_; }
  // Connections accepted so far, and how many of them the client closed (a silent store).
  int accepted() const { return accepted_; }
  int hung_up() const { return hung_up_; }

  void set(const std::string& key, std::vector<uint8_t> value) {
    std::lock_guard lock(mu_);
    data_[key] = std::move(value);
  }
  int64_t counter(const std::string& key) {
    std::lock_guard lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end())
      return 0;
    return std::stoll(std::string(it->second.begin(), it->second.end()));
  }
  // Every connection and the listener closed: a trainer that died.
  void close_all() {
    if (stopped_.exchange(true))
      return;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    if (acceptor_.joinable())
      acceptor_.join();
    std::vector<std::thread> workers;
    {
      std::lock_guard lock(mu_);
      for (int fd : clients_)
        ::shutdown(fd, SHUT_RDWR);
      workers.swap(workers_);
    }
    for (auto& t : workers)
      t.join();
  }

private:
  explicit fake_tcp_store(bool silent) : silent_(silent) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_fd_, 16);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  void accept_loop() {
    while (!stopped_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0)
        continue;
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0)
        continue;
      std::lock_guard lock(mu_);
      clients_.push_back(fd);
      ++accepted_;
      workers_.emplace_back([this, fd] {
        if (silent_)
          swallow(fd);
        else
          serve(fd);
        ::close(fd);
      });
    }
  }
  bool read_all(int fd, void* out, std::size_t n) {
    auto* p = static_cast<uint8_t*>(out);
    while (n > 0) {
      auto r = ::recv(fd, p, n, 0);
      if (r <= 0)
        return false;
      p += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  bool write_all(int fd, const void* data, std::size_t n) {
    return ::send(fd, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
  }
  bool read_string(int fd, std::string& s) {
    uint64_t n = 0;
    if (!read_all(fd, &n, sizeof n) || n > (1u << 24))
      return false;
    s.resize(n);
    return read_all(fd, s.data(), n);
  }
  bool has(const std::vector<std::string>& keys) {
    std::lock_guard lock(mu_);
    for (auto& k : keys)
      if (!data_.count(k))
        return false;
    return true;
  }
  // Reads until the client or the test closes the connection; writes nothing.
  void swallow(int fd) {
    while (!stopped_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0)
        continue;
      char buf[256];
      if (::recv(fd, buf, sizeof buf, 0) <= 0) {
        ++hung_up_;
        return;
      }
    }
  }
  void serve(int fd) {
    using model::tcp_store_wire::query;
    while (!stopped_) {
      uint8_t q = 0;
      if (!read_all(fd, &q, 1))
        return;
      switch (static_cast<query>(q)) {
      case query::validate: {
        uint32_t magic = 0;
        if (!read_all(fd, &magic, 4) || magic != model::tcp_store_wire::validation_magic)
          return;
        break;
      }
      case query::ping: {
        uint32_t pid = 0;
        if (!read_all(fd, &pid, 4) || !write_all(fd, &pid, 4))
          return;
        break;
      }
      case query::add: {
        std::string key;
        int64_t delta = 0;
        if (!read_string(fd, key) || !read_all(fd, &delta, 8))
          return;
        int64_t value = counter(key) + delta;
        auto text = std::to_string(value);
        set(key, std::vector<uint8_t>(text.begin(), text.end()));
        if (!write_all(fd, &value, 8))
          return;
        break;
      }
      case query::set: {
        std::string key, value;
        if (!read_string(fd, key) || !read_string(fd, value))
          return;
        set(key, std::vector<uint8_t>(value.begin(), value.end()));
        break;
      }
      case query::get: {
        std::string key;
        if (!read_string(fd, key))
          return;
        std::vector<uint8_t> value;
        {
          std::lock_guard lock(mu_);
          value = data_[key];
        }
        uint64_t n = value.size();
        if (!write_all(fd, &n, 8) || !write_all(fd, value.data(), value.size()))
          return;
        break;
      }
      case query::check:
      case query::wait: {
        uint64_t count = 0;
        if (!read_all(fd, &count, 8) || count > 64)
          return;
        std::vector<std::string> keys(count);
        for (auto& k : keys)
          if (!read_string(fd, k))
            return;
        if (static_cast<query>(q) == query::check) {
          uint8_t r = has(keys) ? model::tcp_store_wire::ready : model::tcp_store_wire::not_ready;
          if (!write_all(fd, &r, 1))
            return;
          break;
        }
        // WAIT: answer when the keys exist, or WAIT_CANCELED after the client's CANCEL_WAIT.
        while (!has(keys)) {
          pollfd p{fd, POLLIN, 0};
          if (stopped_)
            return;
          if (::poll(&p, 1, 5) > 0) {
            uint8_t c = 0;
            if (!read_all(fd, &c, 1) || c != static_cast<uint8_t>(query::cancel_wait))
              return;
            uint8_t r = model::tcp_store_wire::wait_canceled;
            if (!write_all(fd, &r, 1))
              return;
            goto next;
          }
        }
        {
          uint8_t r = model::tcp_store_wire::stop_waiting;
          if (!write_all(fd, &r, 1))
            return;
        }
      next:
        break;
      }
      default:
        return; // not spoken here: drop the connection
      }
    }
  }

  bool silent_ = false;
  std::atomic<int> accepted_{0};
  std::atomic<int> hung_up_{0};
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopped_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::map<std::string, std::vector<uint8_t>> data_;
  std::vector<int> clients_;
  std::vector<std::thread> workers_;
};

// An init_weights_update_group request as a trainer of world size 2 sends it through the store
// at `port` on this host (group "G", the engine at rank 1), with the trainer's deadline.
inline InitWeightsUpdateGroupReqInput join_request(int port, double timeout_s) {
  InitWeightsUpdateGroupReqInput r;
  r.master_address = "127.0.0.1";
  r.master_port = port;
  r.rank_offset = 1;
  r.world_size = 2;
  r.group_name = "G";
  r.timeout_s = timeout_s;
  return r;
}

} // namespace rlserve::test
