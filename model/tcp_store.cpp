#include "model/tcp_store.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <utility>
#include <cstring>
#include <thread>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

namespace rlserve::model {

namespace tcp_store_wire {

namespace {

template <class T>
void put(std::vector<uint8_t>& out, T value) {
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T)); // host order, as PyTorch's SendBuffer writes
}

void put_bytes(std::vector<uint8_t>& out, std::span<const uint8_t> bytes) {
  put<uint64_t>(out, bytes.size());
  out.insert(out.end(), bytes.begin(), bytes.end());
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put_bytes(out, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

} // namespace

std::vector<uint8_t> request(query q, std::span<const std::string_view> keys, std::span<const uint8_t> value) {
  std::vector<uint8_t> out{static_cast<uint8_t>(q)};
  if (q == query::check || q == query::wait || q == query::multi_get)
    put<uint64_t>(out, keys.size()); // the key count first
  for (auto k : keys)
    put_string(out, k);
  if (q == query::set || q == query::append)
    put_bytes(out, value);
  return out;
}

std::vector<uint8_t> add_request(std::string_view key, int64_t delta) {
  std::vector<uint8_t> out{static_cast<uint8_t>(query::add)};
  put_string(out, key);
  put<int64_t>(out, delta);
  return out;
}

std::vector<uint8_t> u32_request(query q, uint32_t value) {
  std::vector<uint8_t> out{static_cast<uint8_t>(q)};
  put<uint32_t>(out, value);
  return out;
}

} // namespace tcp_store_wire

std::string nccl_unique_id_key(std::string_view group_name) {
  // TCPStore's "/", PrefixStore(G) -> "G/", PrefixStore("G/") -> "G//", PrefixStore("cuda/")
  // -> "cuda//", then ProcessGroupNCCL's communicator counter "0".
  return fmt::format("/{0}/{0}//cuda//0", group_name);
}

namespace {

using clock = tcp_store_client::clock;

// Milliseconds poll() may wait before `deadline` (0 once it has passed).
int poll_ms(clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1000 * 60 * 60));
}

bool is_set(const std::atomic<bool>* flag) { return flag && flag->load(std::memory_order_relaxed); }

// Milliseconds one poll() may wait: up to the deadline, and no more than one look at the cancel
// flag's interval when there is one.
int slice_ms(clock::time_point deadline, const std::atomic<bool>* cancel) {
  const int ms = poll_ms(deadline);
  return cancel ? std::min<int>(ms, static_cast<int>(k_cancel_check.count())) : ms;
}

// poll() on `p` one slice at a time until an event or an error, the deadline, or the cancel:
// the last poll()'s result (0 when nothing came).
int poll_sliced(pollfd& p, clock::time_point deadline, const std::atomic<bool>* cancel) {
  int r = 0;
  while ((r = ::poll(&p, 1, slice_ms(deadline, cancel))) == 0 && clock::now() < deadline && !is_set(cancel)) {
  }
  return r;
}

std::string cancelled_message(std::string_view where, std::string_view what) {
  return fmt::format("{}: gave up waiting for {}: the wait was cancelled", where, what);
}

// One non-blocking connect to `ai`, finished within `deadline` (or the cancel): the socket, -1
// with errno ECONNREFUSED (nobody listens yet: retry), or a failure.
expected<int> connect_once(const addrinfo* ai, clock::time_point deadline, const std::atomic<bool>* cancel,
                           int& refused) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0)
    return fail(std::string("socket(): ") + std::strerror(errno));
  refused = 0;
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      refused = errno;
      ::close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    const int r = poll_sliced(p, deadline, cancel);
    int err = 0;
    socklen_t len = sizeof(err);
    if (r <= 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      refused = r <= 0 ? ETIMEDOUT : err;
      ::close(fd);
      return -1;
    }
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

} // namespace

expected<tcp_store_client> tcp_store_client::connect(const std::string& host, int port,
                                                     clock::time_point deadline,
                                                     const std::atomic<bool>* cancel) {
  const auto where = fmt::format("the trainer's TCPStore at {}:{}", host, port);
  if (host.empty() || port <= 0 || port > 65535)
    return fail(fmt::format("{}: master_address must be a host name and master_port 1..65535", where));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0)
    return fail(fmt::format("{}: cannot resolve {}: {}", where, host, gai_strerror(e)));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  // Retry with backoff while nobody listens: the trainer creates its store after the engine
  // was asked to join (slime sends init_weights_update_group first).
  auto backoff = std::chrono::milliseconds(10);
  int last_error = 0;
  while (true) {
    for (const addrinfo* ai = addresses.get(); ai; ai = ai->ai_next) {
      auto fd = connect_once(ai, deadline, cancel, last_error);
      if (!fd)
        return fail(fmt::format("{}: {}", where, fd.error()));
      if (is_set(cancel)) {
        if (*fd >= 0)
          ::close(*fd);
        return fail(cancelled_message(where, "a connection"));
      }
      if (*fd < 0)
        continue;
      tcp_store_client c(*fd, where, cancel);
      auto validate = tcp_store_wire::u32_request(tcp_store_wire::query::validate,
                                                  tcp_store_wire::validation_magic);
      if (auto s = c.send_all(validate, deadline, "VALIDATE"); !s)
        return std::move(s).take_failure();
      const auto nonce = static_cast<uint32_t>(::getpid());
      if (auto s = c.send_all(tcp_store_wire::u32_request(tcp_store_wire::query::ping, nonce), deadline, "PING"); !s)
        return std::move(s).take_failure();
      auto pong = c.recv_value<uint32_t>(deadline, "the reply to PING");
      if (!pong)
        return std::move(pong).take_failure();
      if (*pong != nonce)
        return fail(fmt::format("{} answered PING {} with {}: not a TCPStore of a PyTorch version "
                                "rlserve speaks", where, nonce, *pong));
      return c;
    }
    if (clock::now() + backoff >= deadline)
      return fail(fmt::format("{}: nobody accepted a connection before the deadline (last error: {}); "
                              "is the trainer's rank 0 up and master_address/master_port right?",
                              where, std::strerror(last_error ? last_error : ETIMEDOUT)));
    for (auto until = clock::now() + backoff; clock::now() < until && !is_set(cancel);)
      std::this_thread::sleep_for(std::min<clock::duration>(until - clock::now(), k_cancel_check));
    if (is_set(cancel))
      return fail(cancelled_message(where, "a connection"));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

tcp_store_client::tcp_store_client(tcp_store_client&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), where_(std::move(other.where_)), cancel_(other.cancel_) {}

tcp_store_client& tcp_store_client::operator=(tcp_store_client&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    where_ = std::move(other.where_);
    cancel_ = other.cancel_;
  }
  return *this;
}

bool tcp_store_client::cancelled() const { return is_set(cancel_); }

bool tcp_store_client::ready(short events, clock::time_point deadline) const {
  while (true) {
    pollfd p{fd_, events, 0};
    const int r = poll_sliced(p, deadline, cancel_);
    if (r > 0 || (r < 0 && errno != EINTR))
      return true; // the next send or recv says what happened
    if (cancelled() || clock::now() >= deadline)
      return false;
  }
}

tcp_store_client::~tcp_store_client() { close(); }

void tcp_store_client::close() {
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = -1;
}

status tcp_store_client::fail_and_close(std::string message) {
  close();
  return fail(std::move(message));
}

status tcp_store_client::send_all(std::span<const uint8_t> bytes, clock::time_point deadline,
                                  std::string_view what) {
  if (fd_ < 0)
    return fail(fmt::format("{}: the connection was closed after an earlier error; join again", where_));
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    auto n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
      return fail_and_close(fmt::format("{} closed the connection before rlserve could send {} "
                                        "(a store of another protocol version, or the trainer exited)",
                                        where_, what));
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return fail_and_close(fmt::format("{}: sending {} failed: {}", where_, what, std::strerror(errno)));
    if (!ready(POLLOUT, deadline))
      return fail_and_close(cancelled() ? cancelled_message(where_, "room to send " + std::string(what))
                                        : fmt::format("{}: could not send {} before the deadline", where_, what));
  }
  return {};
}

status tcp_store_client::recv_all(std::span<uint8_t> bytes, clock::time_point deadline, std::string_view what) {
  if (fd_ < 0)
    return fail(fmt::format("{}: the connection was closed after an earlier error; join again", where_));
  std::size_t got = 0;
  while (got < bytes.size()) {
    auto n = ::recv(fd_, bytes.data() + got, bytes.size() - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      return fail_and_close(fmt::format("{} closed the connection while rlserve waited for {} "
                                        "(a store of another protocol version, or the trainer exited)",
                                        where_, what));
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return fail_and_close(fmt::format("{}: reading {} failed: {}", where_, what, std::strerror(errno)));
    if (!ready(POLLIN, deadline))
      return fail_and_close(cancelled() ? cancelled_message(where_, what)
                                        : fmt::format("{} did not send {} before the deadline", where_, what));
  }
  return {};
}

template <class T>
expected<T> tcp_store_client::recv_value(clock::time_point deadline, std::string_view what) {
  T value{};
  if (auto s = recv_all(std::span<uint8_t>(reinterpret_cast<uint8_t*>(&value), sizeof(T)), deadline, what); !s)
    return std::move(s).take_failure();
  return value;
}

namespace {

status check_key(std::string_view key) {
  if (key.size() > tcp_store_wire::max_key_bytes)
    return fail(fmt::format("a TCPStore key of {} bytes is longer than the store accepts ({})", key.size(),
                            tcp_store_wire::max_key_bytes));
  return {};
}

} // namespace

expected<int64_t> tcp_store_client::add(std::string_view key, int64_t delta, clock::time_point deadline) {
  if (auto s = check_key(key); !s)
    return std::move(s).take_failure();
  if (auto s = send_all(tcp_store_wire::add_request(key, delta), deadline, "ADD " + std::string(key)); !s)
    return std::move(s).take_failure();
  return recv_value<int64_t>(deadline, "the reply to ADD " + std::string(key));
}

status tcp_store_client::set(std::string_view key, std::span<const uint8_t> value, clock::time_point deadline) {
  if (auto s = check_key(key); !s)
    return s;
  if (value.size() > tcp_store_wire::max_value_bytes)
    return fail(fmt::format("a TCPStore value of {} bytes is larger than the store accepts ({})",
                            value.size(), tcp_store_wire::max_value_bytes));
  std::array<std::string_view, 1> keys{key};
  return send_all(tcp_store_wire::request(tcp_store_wire::query::set, keys, value), deadline,
                  "SET " + std::string(key));
}

expected<bool> tcp_store_client::check(std::span<const std::string_view> keys, clock::time_point deadline) {
  for (auto k : keys)
    if (auto s = check_key(k); !s)
      return std::move(s).take_failure();
  if (auto s = send_all(tcp_store_wire::request(tcp_store_wire::query::check, keys), deadline, "CHECK"); !s)
    return std::move(s).take_failure();
  auto r = recv_value<uint8_t>(deadline, "the reply to CHECK");
  if (!r)
    return std::move(r).take_failure();
  if (*r != tcp_store_wire::ready && *r != tcp_store_wire::not_ready)
    return fail_and_close(fmt::format("{} answered CHECK with {}, neither READY (0) nor NOT_READY (1)", where_, *r))
      .take_failure();
  return *r == tcp_store_wire::ready;
}

status tcp_store_client::wait(std::span<const std::string_view> keys, clock::time_point deadline) {
  std::string names;
  for (auto k : keys) {
    if (auto s = check_key(k); !s)
      return s;
    names += (names.empty() ? "" : ", ") + std::string(k);
  }
  if (auto s = send_all(tcp_store_wire::request(tcp_store_wire::query::wait, keys), deadline, "WAIT " + names); !s)
    return s;
  // Poll for the one-byte answer ourselves: at the deadline the wait is cancelled, not abandoned
  // (a reply arriving later would be read as the answer to the next query).
  pollfd p{fd_, POLLIN, 0};
  poll_sliced(p, deadline, cancel_);
  const bool answered = (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  if (!answered && cancelled()) // the connection is given up: no CANCEL_WAIT to keep it in step
    return fail_and_close(cancelled_message(where_, names));
  if (answered) {
    auto r = recv_value<uint8_t>(deadline + std::chrono::seconds(1), "the reply to WAIT " + names);
    if (!r)
      return std::move(r).take_failure();
    if (*r != tcp_store_wire::stop_waiting)
      return fail_and_close(fmt::format("{} answered WAIT with {}, not STOP_WAITING (0)", where_, *r));
    return {};
  }
  const auto grace = clock::now() + std::chrono::seconds(5);
  const std::vector<uint8_t> cancel{static_cast<uint8_t>(tcp_store_wire::query::cancel_wait)};
  if (auto s = send_all(cancel, grace, "CANCEL_WAIT"); !s)
    return s;
  auto r = recv_value<uint8_t>(grace, "the reply to CANCEL_WAIT");
  if (!r)
    return std::move(r).take_failure();
  if (*r == tcp_store_wire::stop_waiting) { // the keys appeared just before the cancel
    auto c = recv_value<uint8_t>(grace, "the reply to CANCEL_WAIT");
    if (!c)
      return std::move(c).take_failure();
    return {};
  }
  if (*r != tcp_store_wire::wait_canceled)
    return fail_and_close(fmt::format("{} answered CANCEL_WAIT with {}, not WAIT_CANCELED (1)", where_, *r));
  return fail(fmt::format("{}: {} did not appear before the deadline; the trainer has not created "
                          "it (has it called init_process_group, and its first collective on the group?)",
                          where_, names));
}

expected<std::vector<uint8_t>> tcp_store_client::get(std::string_view key, clock::time_point deadline) {
  std::array<std::string_view, 1> keys{key};
  if (auto s = wait(keys, deadline); !s)
    return std::move(s).take_failure();
  if (auto s = send_all(tcp_store_wire::request(tcp_store_wire::query::get, keys), deadline, "GET " + std::string(key)); !s)
    return std::move(s).take_failure();
  auto size = recv_value<uint64_t>(deadline, "the reply to GET " + std::string(key));
  if (!size)
    return std::move(size).take_failure();
  if (*size > tcp_store_wire::max_value_bytes)
    return fail_and_close(fmt::format("{} answered GET {} with a value of {} bytes, more than a store holds",
                                      where_, key, *size))
      .take_failure();
  std::vector<uint8_t> value(static_cast<std::size_t>(*size));
  if (auto s = recv_all(value, deadline, "the value of " + std::string(key)); !s)
    return std::move(s).take_failure();
  return value;
}

expected<counted_in_trainer_store> count_in_trainer_store(const std::string& host, int port,
                                                          tcp_store_client::clock::time_point deadline,
                                                          const std::atomic<bool>* cancel) {
  auto client = tcp_store_client::connect(host, port, deadline, cancel);
  if (!client)
    return std::move(client).take_failure();
  auto joined = client->add(tcp_store_join_key, 1, deadline);
  if (!joined)
    return std::move(joined).take_failure();
  return counted_in_trainer_store{std::move(*client), *joined};
}

expected<joined_trainer_store> join_trainer_store(const std::string& host, int port, std::string_view group_name,
                                                  tcp_store_client::clock::time_point deadline) {
  if (group_name.empty())
    return fail("group_name: empty; name the trainer's weight-update group");
  auto counted = count_in_trainer_store(host, port, deadline);
  if (!counted)
    return std::move(counted).take_failure();
  auto client = std::move(counted->client);
  const auto key = nccl_unique_id_key(group_name);
  auto id = client.get(key, deadline);
  if (!id)
    return std::move(id).take_failure();
  if (id->size() != nccl_unique_id_bytes)
    return fail(fmt::format("{}: {} holds {} bytes, not an NCCL unique id ({} bytes)", client.where(), key,
                            id->size(), nccl_unique_id_bytes));
  return joined_trainer_store{std::move(client), std::move(*id), counted->joined};
}

} // namespace rlserve::model
