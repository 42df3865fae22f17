// RMSNorm: the CUDA kernel against its CPU twin (fp32; the sums run in a different order, so
// the comparison allows a few ulps).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/rms_norm.hpp"
#include "tests/support/device_buffer.cuh"

using namespace rlserve::kernels;
using rlserve::test::device_buffer;

namespace {

constexpr float k_rms_norm_max_rel_err = 1e-6f; // fp32, sum of squares in double on both sides

} // namespace

BOOST_AUTO_TEST_SUITE(rms_norm_gpu_test)

BOOST_AUTO_TEST_CASE(cuda_matches_cpu_reference) {
  rlserve::test::require_device();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 64}, {3, 100}, {17, 4096}, {128, 2048},
                            {5, 1}, {2, 12345}}) {
    std::vector<float> x(rows * cols), w(cols);
    for (auto& v : x)
      v = normal(rng);
    for (auto& v : w)
      v = 1.0f + 0.1f * normal(rng);
    std::vector<float> expected(x.size());
    BOOST_REQUIRE(rms_norm_ref({x.data(), w.data(), expected.data(), rows, cols, 1e-6f}) ==
                  kernel_status::ok);
    device_buffer<float> dx(x), dw(w), dy(x.size());
    BOOST_REQUIRE(rms_norm_launch({dx.get(), dw.get(), dy.get(), rows, cols, 1e-6f}, nullptr) ==
                  kernel_status::ok);
    auto got = dy.download();
    double norm = 0;
    float worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      norm += std::abs(expected[i]);
      worst = std::max(worst, std::abs(got[i] - expected[i]) / std::max(1e-6f, std::abs(expected[i])));
    }
    BOOST_TEST(norm > 0.0); // the oracle is not all zeros
    BOOST_TEST_MESSAGE("rms_norm " << rows << "x" << cols << ": max relative error " << worst);
    BOOST_TEST(worst <= k_rms_norm_max_rel_err);
  }
}

BOOST_AUTO_TEST_CASE(bad_problems_are_refused) {
  BOOST_TEST((rms_norm_launch({nullptr, nullptr, nullptr, 1, 0, 1e-6f}, nullptr) ==
              kernel_status::invalid_problem));
  BOOST_TEST((rms_norm_launch({nullptr, nullptr, nullptr, 4, 8, 1e-6f}, nullptr) ==
              kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_SUITE_END()
