// The batch-invariant BF16 linear on the device: a row's output bits do not depend on how many rows
// share the launch, on where the row sits, or on the other rows' values; and the op stays within
// the CPU twin's tolerance (the op table checks more shapes against the twin:
// tests/kernels/op_cases.hpp). cuBLAS does not have the first property (its kernel and split-K
// follow the shape), which is why the batch-invariant forward runs its linears here.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/gemm_bf16_invariant.hpp"
#include "tests/support/device_buffer.cuh"

using namespace rlserve::kernels;
using rlserve::test::device_buffer;

namespace {

constexpr double k_f32_rel_tolerance = 5e-5; // fp32 tensor-core sums vs double, relative L2

std::vector<uint16_t> random_bf16(std::size_t count, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint16_t> out(count);
  for (auto& v : out)
    v = float_to_bf16(normal(rng));
  return out;
}

// y = x w^T on the device, fp32 out, rows x n.
std::vector<float> run(const std::vector<uint16_t>& x, const device_buffer<uint16_t>& w, int64_t rows, int64_t n,
                       int64_t k) {
  device_buffer<uint16_t> dx(x);
  device_buffer<float> dy(static_cast<std::size_t>(rows * n));
  gemm_bf16_invariant_args a{dx.get(), w.get(), dy.get(), rows, n, k, n, true};
  BOOST_REQUIRE(gemm_bf16_invariant_launch(a, nullptr) == kernel_status::ok);
  BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  return dy.download();
}

bool same_row(const std::vector<float>& a, int64_t ra, const std::vector<float>& b, int64_t rb, int64_t n) {
  return std::memcmp(a.data() + ra * n, b.data() + rb * n, static_cast<std::size_t>(n) * sizeof(float)) == 0;
}

} // namespace

BOOST_AUTO_TEST_SUITE(gemm_bf16_invariant_gpu_test)

// Row 0 of a Qwen3-30B-A3B q/k/v projection (k 2048, n 5120) and of the 128-expert router, alone
// and as row j of batches of 2 to 300 random rows (both kernels: the cp.async ring with 1, 2 and
// 4 row blocks up to 64 rows, the 64-row CTAs above, last row block partial): the same bits every
// time. The batch is also checked against the twin.
BOOST_AUTO_TEST_CASE(a_rows_bits_do_not_depend_on_its_batch) {
  rlserve::test::require_device();
  // n 60: a router of 60 experts (the last 16-column group partial).
  for (auto [n, k] : {std::pair<int64_t, int64_t>{5120, 2048}, {128, 2048}, {48, 80}, {60, 256}}) {
    const device_buffer<uint16_t> w(random_bf16(static_cast<std::size_t>(n * k), 0.03f, 11 + n));
    const auto row = random_bf16(static_cast<std::size_t>(k), 1.0f, 12 + n);
    const auto alone = run(row, w, 1, n, k);
    int differs = 0, cases = 0;
    for (int64_t rows : {2, 7, 16, 17, 32, 33, 64, 65, 300}) {
      auto x = random_bf16(static_cast<std::size_t>(rows * k), 1.0f, 100 + rows);
      const int64_t at = (rows * 5) / 7; // somewhere inside, in a different row block each time
      std::copy(row.begin(), row.end(), x.begin() + at * k);
      const auto y = run(x, w, rows, n, k);
      differs += !same_row(alone, 0, y, at, n);
      ++cases;
      if (rows == 300) { // the batch against the CPU twin
        std::vector<float> want(y.size());
        const auto wh = w.download();
        gemm_bf16_invariant_args a{x.data(), wh.data(), want.data(), rows, n, k, n, true};
        BOOST_REQUIRE(gemm_bf16_invariant_ref(a) == kernel_status::ok);
        double num = 0, den = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
          num += (double(y[i]) - want[i]) * (double(y[i]) - want[i]);
          den += double(want[i]) * want[i];
        }
        BOOST_TEST_INFO("n " << n << " k " << k);
        BOOST_TEST(std::sqrt(num / den) < k_f32_rel_tolerance);
      }
    }
    BOOST_TEST_MESSAGE("gemm_bf16_invariant n " << n << " k " << k << ": " << differs << " of " << cases
                       << " batches changed the row's bits");
    BOOST_TEST(differs == 0);
  }
}

// Misaligned operands and shapes the kernel cannot tile are refused, not run.
BOOST_AUTO_TEST_CASE(refuses_what_it_cannot_run) {
  rlserve::test::require_device();
  device_buffer<uint16_t> x(64 * 64), w(64 * 64 + 16);
  device_buffer<float> y(64 * 64);
  gemm_bf16_invariant_args a{x.get(), w.get(), y.get(), 4, 64, 64, 64, true};
  BOOST_TEST((gemm_bf16_invariant_launch(a, nullptr) == kernel_status::ok));
  a.w = w.get() + 8; // 16-byte but not 32-byte aligned
  BOOST_TEST((gemm_bf16_invariant_launch(a, nullptr) == kernel_status::misaligned_operand));
  a.w = w.get(), a.n = 0;
  BOOST_TEST((gemm_bf16_invariant_launch(a, nullptr) == kernel_status::invalid_problem));
  a.n = 64, a.k = 72; // k % 16
  BOOST_TEST((gemm_bf16_invariant_launch(a, nullptr) == kernel_status::invalid_problem));
  a.k = 64, a.ldy = 32; // ldy < n
  BOOST_TEST((gemm_bf16_invariant_launch(a, nullptr) == kernel_status::invalid_problem));
  BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

BOOST_AUTO_TEST_SUITE_END()
