// The kernel op table (tests/kernels/op_cases.hpp) on the GPU: every case runs on the CPU twin and
// on the CUDA kernel from the same inputs, and every array the op writes is compared within the
// case's tolerance (0: the same bits). Outputs start as 0xD5 poison on the device, so an element
// the kernel forgot shows as a difference.
#include <boost/test/unit_test.hpp>

#include <memory>

#include <cuda_runtime.h>

#include "tests/kernels/op_cases.hpp"
#include "tests/support/device_buffer.cuh"

using namespace rlserve::test::ops;

BOOST_AUTO_TEST_SUITE(op_harness_gpu_test)

BOOST_AUTO_TEST_CASE(every_cuda_kernel_matches_its_cpu_twin) {
  rlserve::test::require_device();
  for (const auto& c : op_cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      auto want = make_arrays(c);
      const auto start = want;
      std::vector<void*> host;
      for (auto& v : want)
        host.push_back(v.empty() ? nullptr : v.data());
      BOOST_REQUIRE(c.call(backend::cpu, host) == rlserve::kernels::kernel_status::ok);

      std::vector<std::unique_ptr<rlserve::test::device_buffer<std::byte>>> device;
      std::vector<void*> dev;
      for (std::size_t i = 0; i < c.arrays.size(); ++i) {
        device.push_back(std::make_unique<rlserve::test::device_buffer<std::byte>>(start[i].size())); // 0xD5
        if (c.arrays[i].use != role::output && !start[i].empty())
          device.back()->upload(start[i]);
        dev.push_back(device.back()->get());
      }
      BOOST_REQUIRE(c.call(backend::cuda, dev) == rlserve::kernels::kernel_status::ok);
      BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      for (std::size_t i = 0; i < c.arrays.size(); ++i) {
        const auto& a = c.arrays[i];
        if (a.use == role::input)
          continue;
        const auto got = device[i]->download();
        const double d = rel_l2(a.type, got, want[i]);
        BOOST_TEST_MESSAGE(c.name << ": " << a.name << " relative L2 " << d << " (allowed " << a.max_rel_l2 << ")");
        if (a.max_rel_l2 == 0.0)
          BOOST_TEST((got == want[i]), a.name << ": not the same bits (relative L2 " << d << ")");
        else
          BOOST_TEST(d <= a.max_rel_l2, a.name << ": relative L2 " << d << " > " << a.max_rel_l2);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
