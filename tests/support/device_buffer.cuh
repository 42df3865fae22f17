// Device buffers for the GPU tests: RAII allocation, upload/download, 0xD5 poisoning.
// Failures of CUDA calls abort the test case through BOOST_REQUIRE (this header is included
// after boost/test/unit_test.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

namespace rlserve::test {

inline void require_device() {
  int count = 0;
  BOOST_REQUIRE_MESSAGE(cudaGetDeviceCount(&count) == cudaSuccess && count > 0,
                        "these tests need a CUDA device (they carry the CTest label gpu)");
}

template <class T>
class device_buffer {
public:
  explicit device_buffer(std::size_t count) : count_(count) {
    if (count_ > 0)
      BOOST_REQUIRE(cudaMalloc(&ptr_, count_ * sizeof(T)) == cudaSuccess);
    poison();
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) { upload(host); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (ptr_)
      cudaFree(ptr_);
  }

  T* get() const { return count_ ? ptr_ : nullptr; }
  std::size_t size() const { return count_; }

  void poison() {
    if (count_)
      BOOST_REQUIRE(cudaMemset(ptr_, 0xD5, count_ * sizeof(T)) == cudaSuccess);
  }
  void upload(const std::vector<T>& host) {
    BOOST_REQUIRE(host.size() == count_);
    if (count_)
      BOOST_REQUIRE(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    if (count_)
      BOOST_REQUIRE(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }

private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

} // namespace rlserve::test
