// Small helpers shared by the C++ tests.
#pragma once

#include <atomic>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include <unistd.h>

namespace rlserve::test {

// A fresh, empty directory under the system's temp dir, removed with its contents at scope exit.
struct temp_dir {
  std::filesystem::path path;

  explicit temp_dir(std::string_view prefix = "rlserve-test") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           (std::string(prefix) + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

// The failure text of an expected / status for a test message ("" on success).
template <class E>
std::string why(const E& e) {
  return e ? std::string() : e.error();
}

} // namespace rlserve::test
