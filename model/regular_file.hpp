// Opening files whose path came from a client (update_weights_from_disk's model_path,
// /start_profile's output_dir) so that no path can stall or crash the engine:
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
#include <string_view>

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

// A file the server writes at a path inside a client-named directory (a profile's trace), opened
// so that what the client left at that path cannot stall the engine or redirect the write:
//   - O_NONBLOCK: opening a FIFO for writing waits for a reader forever otherwise;
//   - O_NOFOLLOW: a symbolic link as the last component is refused instead of followed (it could
//     lead to any file the server may write);
//   - fstat() must say "regular file" with no other hard link (the same redirection) before the
//     file is truncated, so nothing else is changed when it is refused.
// Created when missing (mode 0644 less the umask); closes its descriptor when destroyed.
class output_file {
public:
  static expected<output_file> create(const std::filesystem::path& path);
  output_file(output_file&& other) noexcept;
  output_file& operator=(output_file&& other) noexcept;
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;
  ~output_file();

  const std::string& path() const { return where_; }
  // Appends all of `bytes`; fails, naming the file, when a write fails (a full disk).
  status write_all(std::string_view bytes);

private:
  output_file(int fd, std::string where) : fd_(fd), where_(std::move(where)) {}
  int fd_ = -1;
  std::string where_;
};

} // namespace rlserve::model
