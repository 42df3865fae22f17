// tcp_store: the client side of PyTorch's TCPStore wire protocol, with a deadline on every call —
// how an engine rank joins the store a torch.distributed trainer's rank 0 hosts at
// init_method "tcp://master_address:master_port" and fetches the NCCL unique id of the trainer's
// weight-update group, as ProcessGroupNCCL does (docs/protocol.md, "Joining a trainer's NCCL
// group"). Tested against a store written from the protocol (tests/python/test_tcp_store.py);
// tests/gpu/test_tcp_store.py holds it to PyTorch's own store on the GPU machine.
//
// The protocol (torch/csrc/distributed/c10d TCPStore.cpp and TCPStoreBackend.hpp): one byte of
// query type, then arguments — strings and byte values as u64 length + bytes, numbers as raw
// host-order (little-endian) integers. A client first sends VALIDATE with a magic number (no
// reply), then PING with its pid (the same u32 comes back). WAIT answers one byte when every key
// exists; a client that gives up sends CANCEL_WAIT and reads WAIT_CANCELED (after a late
// STOP_WAITING, if the key appeared meanwhile). Keys travel as the client names them; PyTorch's
// own client prefixes user keys with "/" (the functions below return wire keys).
//
// Blocking calls: run them on a thread that may block (the runner's), never on a cooperative
// actor's. Every call gives up at its deadline with a message naming the store and what it
// waited for, and the client is then closed (a half-read reply leaves the stream unusable).
// A client made with a cancel flag also gives up, the same way, within k_cancel_check of the
// flag turning true: a trainer may choose a deadline of a day, and a destroy or a stopping
// engine must not wait for it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "messages/expected.hpp"

namespace rlserve::model {

namespace tcp_store_wire {
// TCPStoreBackend.hpp: QueryType and the validation magic.
enum class query : uint8_t {
  validate = 0,
  set = 1,
  compare_set = 2,
  get = 3,
  add = 4,
  check = 5,
  wait = 6,
  get_num_keys = 7,
  delete_key = 8,
  append = 9,
  multi_get = 10,
  multi_set = 11,
  cancel_wait = 12,
  ping = 13,
};
inline constexpr uint32_t validation_magic = 0x3C85F7CE;
inline constexpr uint8_t stop_waiting = 0, wait_canceled = 1;
inline constexpr uint8_t ready = 0, not_ready = 1;
// The libuv server drops a connection sending more (TCPStoreLibUvBackend.cpp).
inline constexpr std::size_t max_key_bytes = 8 * 1024;
inline constexpr std::size_t max_value_bytes = 8 * 1024 * 1024;

// A request's bytes.
std::vector<uint8_t> request(query q, std::span<const std::string_view> keys,
                             std::span<const uint8_t> value = {});
std::vector<uint8_t> add_request(std::string_view key, int64_t delta);
std::vector<uint8_t> u32_request(query q, uint32_t value); // validate, ping
} // namespace tcp_store_wire

// Wire keys a torch.distributed trainer uses.
//  - "init/": the join counter. The trainer's rank 0 adds its own 1 and waits (in
//    init_process_group) until the counter reaches world_size: every other rank adds 1 to it.
//    PyTorch's client sends it without the "/" prefix.
//  - the NCCL unique id of the first communicator of a process group made as SGLang's
//    init_custom_process_group and slime's init_process_group make it (PrefixStore(group_name)
//    around the store, then PyTorch's own "{group_name}/" and "cuda/" prefixes, then the
//    communicator counter "0"): "/G/G//cuda//0" for group G. 128 bytes, set by rank 0 when the
//    communicator is created (at the group's first collective, or at init with a device_id).
inline constexpr std::string_view tcp_store_join_key = "init/";
std::string nccl_unique_id_key(std::string_view group_name);
inline constexpr std::size_t nccl_unique_id_bytes = 128;

// How often a wait looks at its cancel flag.
inline constexpr std::chrono::milliseconds k_cancel_check{20};

class tcp_store_client {
public:
  using clock = std::chrono::steady_clock;

  // Connects to host:port — retrying refused connections until `deadline`, since the trainer may
  // start its store after asking the engine to join — then validates and pings. `cancel` (may
  // be null; it must outlive the client) cuts this and every later wait of the client short.
  static expected<tcp_store_client> connect(const std::string& host, int port, clock::time_point deadline,
                                            const std::atomic<bool>* cancel = nullptr);

  tcp_store_client(tcp_store_client&& other) noexcept;
  tcp_store_client& operator=(tcp_store_client&& other) noexcept;
  tcp_store_client(const tcp_store_client&) = delete;
  tcp_store_client& operator=(const tcp_store_client&) = delete;
  ~tcp_store_client();

  // ADD: the key's new value.
  expected<int64_t> add(std::string_view key, int64_t delta, clock::time_point deadline);
  status set(std::string_view key, std::span<const uint8_t> value, clock::time_point deadline);
  // Waits until the key exists (CANCEL_WAIT at the deadline), then GET.
  expected<std::vector<uint8_t>> get(std::string_view key, clock::time_point deadline);
  // CHECK: whether every key exists now.
  expected<bool> check(std::span<const std::string_view> keys, clock::time_point deadline);
  // WAIT until every key exists, or the deadline.
  status wait(std::span<const std::string_view> keys, clock::time_point deadline);

  const std::string& where() const { return where_; }

private:
  tcp_store_client(int fd, std::string where, const std::atomic<bool>* cancel)
      : fd_(fd), where_(std::move(where)), cancel_(cancel) {}
  bool cancelled() const;
  // poll() on the socket for `events` until `deadline`, in slices that look at the cancel flag:
  // whether the socket became ready (false: the deadline passed, or the wait was cancelled).
  bool ready(short events, clock::time_point deadline) const;
  status send_all(std::span<const uint8_t> bytes, clock::time_point deadline, std::string_view what);
  status recv_all(std::span<uint8_t> bytes, clock::time_point deadline, std::string_view what);
  template <class T>
  expected<T> recv_value(clock::time_point deadline, std::string_view what);
  status fail_and_close(std::string message);
  void close();

  int fd_ = -1;
  std::string where_; // "the trainer's TCPStore at host:port"
  const std::atomic<bool>* cancel_ = nullptr;
};

// What an engine rank does to join a trainer's weight-update group before NCCL: connect, count
// itself in ("init/" + 1), and read the group's NCCL unique id (waiting for the trainer to create
// it). The client stays open for the life of the group, as PyTorch's ranks keep theirs.
struct joined_trainer_store {
  tcp_store_client client;
  std::vector<uint8_t> nccl_unique_id; // 128 bytes
  int64_t joined = 0;                  // the join counter after this rank's increment
};
// The first half: connect and count in, without waiting for the unique id (which a PyTorch
// trainer publishes only when it creates its communicator, at the group's first collective).
struct counted_in_trainer_store {
  tcp_store_client client;
  int64_t joined = 0;
};
expected<counted_in_trainer_store> count_in_trainer_store(const std::string& host, int port,
                                                          tcp_store_client::clock::time_point deadline,
                                                          const std::atomic<bool>* cancel = nullptr);
expected<joined_trainer_store> join_trainer_store(const std::string& host, int port,
                                                  std::string_view group_name,
                                                  tcp_store_client::clock::time_point deadline);

} // namespace rlserve::model
