// nccl_group: this process's rank in a trainer's NCCL weight-update group, with a deadline on
// every call. NCCL itself has none: a trainer that never joins, or dies in the middle of a
// broadcast, blocks a blocking communicator forever. So the communicator is created non-blocking
// (ncclConfig_t::blocking = 0), and every wait — its creation, each broadcast — polls
// ncclCommGetAsyncError (and a CUDA event for the broadcast) until done, and calls ncclCommAbort
// at the deadline: the caller gets a failure naming the group and what timed out, and the group
// is then broken (destroy it; a new init_weights_update_group makes a new one).
//
// Blocking calls: run them on a thread that may block, never a cooperative actor's. The unique
// id comes from the trainer's TCPStore (model/tcp_store.hpp) or from a trainer that sends it.
// Without NCCL in the build every function fails with a message saying so.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "messages/dtype.hpp"
#include "messages/expected.hpp"

namespace rlserve::model {

// Device memory a broadcast fills: `count` elements of `type` at `data` (on the group's GPU).
struct nccl_buffer {
  void* data = nullptr;
  int64_t count = 0;
  dtype type = dtype::u8;
};

// Device memory that receives a broadcast: `bytes` on CUDA device `device`, freed with the object
// (a weight-update group's staging; without CUDA in the build, allocate fails saying so).
class device_buffer {
public:
  static expected<device_buffer> allocate(int device, std::size_t bytes);
  device_buffer() = default;
  device_buffer(device_buffer&& other) noexcept;
  device_buffer& operator=(device_buffer&& other) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer();

  std::byte* data() const { return data_; }
  std::size_t size() const { return bytes_; }
  int device() const { return device_; }

private:
  void free();
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

class nccl_group {
public:
  using clock = std::chrono::steady_clock;

  // When a wait gives up: at `deadline`, or as soon as `*cancel` turns true (a destroy that
  // should not wait for a stuck trainer; may be null).
  struct limit {
    clock::time_point deadline;
    const std::atomic<bool>* cancel = nullptr;
    bool cancelled() const { return cancel && cancel->load(std::memory_order_relaxed); }
  };

  // Joins as `rank` of `world_size` on CUDA device `device` with the group's 128-byte unique id;
  // gives up (aborting the half-made communicator) at the limit. `name` appears in messages.
  static expected<std::unique_ptr<nccl_group>> create(std::span<const uint8_t> unique_id, int world_size,
                                                      int rank, int device, std::string name,
                                                      limit until);
  static expected<std::unique_ptr<nccl_group>> create(std::span<const uint8_t> unique_id, int world_size,
                                                      int rank, int device, std::string name,
                                                      clock::time_point deadline) {
    return create(unique_id, world_size, rank, device, std::move(name), limit{deadline});
  }
  // Whether this build can join groups at all (it has NCCL).
  static bool available();
  // A new unique id, as a rank 0 makes one (tests, and trainers that send theirs).
  static expected<std::vector<uint8_t>> new_unique_id();
  // "NCCL 2.28.9", or why there is none.
  static std::string version();

  ~nccl_group(); // finalizes a healthy communicator (bounded), aborts a broken one
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;

  // Receives (or, as `root`, sends) one broadcast per buffer, in order, as one NCCL group call on
  // the group's stream, and waits until all are done or `deadline` (then aborts: broken()).
  status broadcast(std::span<const nccl_buffer> buffers, int root, limit until);
  status broadcast(std::span<const nccl_buffer> buffers, int root, clock::time_point deadline) {
    return broadcast(buffers, root, limit{deadline});
  }

  bool broken() const;
  int rank() const;
  int world_size() const;
  const std::string& name() const;

  struct impl;

private:
  explicit nccl_group(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace rlserve::model
