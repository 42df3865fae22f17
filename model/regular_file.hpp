// Opening files whose path came from a client (update_weights_from_disk's model_path) so that no
// path can stall or crash the engine:
//   - open() with O_NONBLOCK: opening a FIFO for reading waits for a writer forever otherwise
//     (and a device node may block too); for a regular file the flag changes nothing;
//   - fstat() must say "regular file" before a byte is read;
//   - the bytes are read into memory the engine owns. A mapping of the file would alias it: a
//     trainer that rewrites the checkpoint in place would change served weights with no
//     committed update, and one that truncates it (what writing a new file to the same path
//     does first) would make the next access die of SIGBUS. MAP_PRIVATE protects from neither.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "messages/expected.hpp"

namespace rlserve::model {

// A file opened for reading, known to be regular; closes its descriptor when destroyed.
class regular_file {
public:
  static expected<regular_file> open(const std::filesystem::path& path);
  regular_file(regular_file&& other) noexcept;
  regular_file& operator=(regular_file&& other) noexcept;
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;
  ~regular_file();

  uint64_t size() const { return size_; } // at open
  // Reads bytes [0, n) into `dst`; fails, naming the file, when it ends before n bytes (it was
  // truncated since open) or a read fails.
  status read_prefix(std::byte* dst, uint64_t n) const;

private:
  regular_file(int fd, uint64_t size, std::string where) : fd_(fd), size_(size), where_(std::move(where)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string where_;
};

// The whole file in one allocation aligned to 64 bytes (every dtype's element size, and the
// cache line), read with one pass of large read() calls.
struct owned_bytes {
  std::shared_ptr<const std::byte> data;
  uint64_t size = 0;
};
expected<owned_bytes> read_whole_file(const regular_file& f);

// A text file (JSON) of at most `max_bytes`, opened as above.
expected<std::string> read_text_file(const std::filesystem::path& path, uint64_t max_bytes);

} // namespace rlserve::model
