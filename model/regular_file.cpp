#include "model/regular_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include <fmt/format.h>

namespace rlserve::model {

namespace {

constexpr std::size_t k_alignment = 64;
// One read() or write() moves at most this much: Linux caps either at about 2 GiB anyway.
constexpr uint64_t k_io_chunk = 1ull << 30;
constexpr uint64_t k_huge_page = 2ull << 20;
constexpr uint64_t k_huge_threshold = 4ull << 20; // smaller files: the allocator's memory

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO (named pipe)";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  return "not a regular file";
}

} // namespace

expected<regular_file> regular_file::open(const std::filesystem::path& path) {
  std::string where = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return fail(fmt::format("{}: cannot open: {}", where, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return fail(fmt::format("{}: cannot stat: {}", where, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(fmt::format("{}: is {}; expected a regular file", where, file_kind(st.st_mode)));
  }
  return regular_file(fd, static_cast<uint64_t>(st.st_size), std::move(where));
}

regular_file::regular_file(regular_file&& other) noexcept
  : fd_(std::exchange(other.fd_, -1)), size_(other.size_), where_(std::move(other.where_)) {}

regular_file& regular_file::operator=(regular_file&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    where_ = std::move(other.where_);
  }
  return *this;
}

regular_file::~regular_file() {
  if (fd_ >= 0)
    ::close(fd_);
}

status regular_file::read_prefix(std::byte* dst, uint64_t n) const {
  uint64_t done = 0;
  while (done < n) {
    auto want = static_cast<std::size_t>(std::min(n - done, k_io_chunk));
    ssize_t got = ::pread(fd_, dst + done, want, static_cast<off_t>(done));
    if (got < 0) {
      if (errno == EINTR)
        continue;
      return fail(fmt::format("{}: read failed after {} of {} bytes: {}", where_, done, n,
                              std::strerror(errno)));
    }
    if (got == 0)
      return fail(fmt::format("{}: the file ended after {} of {} bytes (it was truncated or "
                              "rewritten while being read)",
                              where_, done, n));
    done += static_cast<uint64_t>(got);
  }
  return {};
}

// Fresh memory for `n` bytes. Large buffers come straight from mmap with transparent huge pages
// requested: reading a checkpoint into 4 KiB pages costs one page fault per 4 KiB (a 1 GiB
// file: 262144 faults), which made reading several times slower than the copy itself.
static std::shared_ptr<std::byte> allocate(uint64_t n) {
  if (n >= k_huge_threshold) {
    const uint64_t size = (n + k_huge_page - 1) / k_huge_page * k_huge_page;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return nullptr;
    ::madvise(p, size, MADV_HUGEPAGE); // a hint: without THP it is plain memory
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                      [size](std::byte* q) { ::munmap(q, size); });
  }
  // Uninitialized (no zeroing pass): every byte is written by the read.
  auto* raw = static_cast<std::byte*>(
    ::operator new[](std::max<uint64_t>(n, 1), std::align_val_t{k_alignment}, std::nothrow));
  if (raw == nullptr)
    return nullptr;
  return std::shared_ptr<std::byte>(raw, [](std::byte* p) {
    ::operator delete[](p, std::align_val_t{k_alignment});
  });
}

expected<owned_bytes> read_whole_file(const regular_file& f) {
  const uint64_t n = f.size();
  auto data = allocate(n);
  if (!data)
    return fail(fmt::format("cannot allocate {} bytes to read the file into", n));
  auto* raw = data.get();
  if (auto ok = f.read_prefix(raw, n); !ok)
    return std::move(ok).take_failure();
  return owned_bytes{std::move(data), n};
}

expected<std::string> read_text_file(const std::filesystem::path& path, uint64_t max_bytes) {
  auto f = regular_file::open(path);
  if (!f)
    return std::move(f).take_failure();
  if (f->size() > max_bytes)
    return fail(fmt::format("{}: {} bytes, more than the {} this file may have", path.string(),
                            f->size(), max_bytes));
  std::string text(static_cast<std::size_t>(f->size()), '\0');
  if (auto ok = f->read_prefix(reinterpret_cast<std::byte*>(text.data()), f->size()); !ok)
    return std::move(ok).take_failure();
  return text;
}

expected<output_file> output_file::create(const std::filesystem::path& path) {
  std::string where = path.string();
  // No O_TRUNC: a file refused below must not have been emptied first.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY, 0644);
  if (fd < 0) {
    const int err = errno;
    // ELOOP (a symbolic link) and ENXIO (a FIFO nobody reads) say little: name what is there.
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      return fail(fmt::format("{}: is a symbolic link; the server writes only to a regular file "
                              "at the path itself (remove the link or name another directory)",
                              where));
    if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return fail(fmt::format("{}: is {}; expected a regular file or no file", where, file_kind(st.st_mode)));
    return fail(fmt::format("{}: cannot create: {}", where, std::strerror(err)));
  }
  output_file out(fd, std::move(where));
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return fail(fmt::format("{}: cannot stat: {}", out.where_, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    return fail(fmt::format("{}: is {}; expected a regular file or no file", out.where_, file_kind(st.st_mode)));
  if (st.st_nlink > 1)
    return fail(fmt::format("{}: has {} hard links; writing it would change another file too "
                            "(remove it or name another directory)",
                            out.where_, st.st_nlink));
  if (::ftruncate(fd, 0) != 0)
    return fail(fmt::format("{}: cannot truncate: {}", out.where_, std::strerror(errno)));
  return out;
}

output_file::output_file(output_file&& other) noexcept
  : fd_(std::exchange(other.fd_, -1)), where_(std::move(other.where_)) {}

output_file& output_file::operator=(output_file&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    where_ = std::move(other.where_);
  }
  return *this;
}

output_file::~output_file() {
  if (fd_ >= 0)
    ::close(fd_);
}

status output_file::write_all(std::string_view bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    auto want = static_cast<std::size_t>(std::min<uint64_t>(bytes.size() - done, k_io_chunk));
    ssize_t put = ::write(fd_, bytes.data() + done, want);
    if (put < 0) {
      if (errno == EINTR)
        continue;
      return fail(fmt::format("{}: write failed after {} of {} bytes: {}", where_, done,
                              bytes.size(), std::strerror(errno)));
    }
    done += static_cast<std::size_t>(put);
  }
  return {};
}

} // namespace rlserve::model
