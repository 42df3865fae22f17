// CUDA W4A16 GEMM vs the CPU reference (gemm_w4a16_ref) on random serving-layout bits (any bits
// are valid weights) over awkward m (1, 2, 3, 17, 118, 152, 256), k on and off the 128-k stage
// boundary, n on and off the 256-column CTA tile, every group size, sym and asym, batches and
// padded leading dimensions; every scheduling branch (one CTA, few CTAs with split tiles, many
// CTAs, every m-block variant); determinism and workspace reuse. Outputs are poisoned with 0xD5
// before each launch; every valid element must be written, padding must not be. Needs a GPU.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/gemm_w4a16.hpp"
#include "tests/kernels/int4_test_util.hpp"
#include "tests/support/device_buffer.cuh"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;
using rlserve::test::device_buffer;

namespace {

// ‖gpu − ref‖ / ‖ref‖ over C. Both dequantize to identical bf16 weights and sum in FP32; only the
// order of the sums differs, so the bf16 outputs differ in a rounding now and then. Observed on
// an H200: see docs/performance.md; the brief's bound for bf16 outputs is 1e-2.
constexpr double k_gpu_vs_ref_max_rel_error = 1e-2;
constexpr uint16_t k_poison = 0xd5d5; // bf16 -2.9e13: no output of these tests comes near it

struct problem_data {
  gemm_w4a16_args args;               // host pointers
  std::vector<uint16_t> a, c;
  std::vector<int32_t> b, zp;
  std::vector<uint16_t> scale;
};

problem_data make_problem(int64_t m, int64_t n, int64_t k, int32_t gs, bool asym, int64_t batch, uint64_t seed,
                          int64_t lda_pad = 0, int64_t ldc_pad = 0) {
  problem_data d;
  const int4_shape s{batch, n, k, gs};
  t4::rng r(seed);
  const int64_t lda = k + lda_pad, ldc = n + ldc_pad;
  d.a.resize(static_cast<std::size_t>(batch * m * lda));
  for (auto& v : d.a)
    v = t4::bf16(r.gaussian());
  d.b.resize(static_cast<std::size_t>(serving_weight_words(s)));
  for (auto& v : d.b)
    v = static_cast<int32_t>(r.next());
  d.scale.resize(static_cast<std::size_t>(serving_scale_count(s)));
  for (auto& v : d.scale)
    v = t4::bf16(0.002 + 0.01 * r.uniform());
  d.zp.resize(asym ? static_cast<std::size_t>(serving_zero_point_words(s)) : 0);
  for (auto& v : d.zp)
    v = static_cast<int32_t>(r.next());
  d.c.assign(static_cast<std::size_t>(batch * m * ldc), k_poison);
  auto& g = d.args;
  g.m = m, g.n = n, g.k = k, g.group_size = gs, g.has_zero_point = asym, g.batch = batch;
  g.lda = lda, g.ldc = ldc;
  g.a = d.a.data(), g.b = d.b.data(), g.scale = d.scale.data(), g.zero_point = asym ? d.zp.data() : nullptr;
  g.c = d.c.data();
  return d;
}

std::string tag(const gemm_w4a16_args& g) {
  return std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) + "_g" +
         std::to_string(g.group_size) + (g.has_zero_point ? "_asym" : "_sym") + "_b" + std::to_string(g.batch) +
         "_ctas" + std::to_string(g.max_ctas) + "_rows" + std::to_string(g.block_rows);
}

struct device_problem {
  device_buffer<uint16_t> a, scale, c;
  device_buffer<int32_t> b, zp;
  device_buffer<unsigned char> ws;
  gemm_w4a16_args args;
  explicit device_problem(const problem_data& d)
      : a(d.a), scale(d.scale), c(d.c.size()), b(d.b), zp(d.zp), ws(std::max<std::size_t>(1, gemm_w4a16_workspace_bytes(d.args))) {
    args = d.args;
    args.a = a.get(), args.b = b.get(), args.scale = scale.get(), args.zero_point = d.args.has_zero_point ? zp.get() : nullptr;
    args.c = c.get();
    BOOST_REQUIRE(gemm_w4a16_workspace_init(args, ws.get(), nullptr) == kernel_status::ok);
  }
  std::vector<uint16_t> run(const gemm_w4a16_args& with) {
    c.poison();
    BOOST_REQUIRE(gemm_w4a16_launch(with, ws.get(), nullptr) == kernel_status::ok);
    BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return c.download();
  }
};

// Compares GPU output with the reference; checks poison and norms; dumps on failure. Returns the
// relative error.
double compare(const gemm_w4a16_args& g, const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  const int64_t ldc = g.ldc ? g.ldc : g.n;
  double num = 0, den = 0;
  int64_t unwritten = 0, overwritten = 0, first_bad = -1;
  for (int64_t r = 0; r < g.batch * g.m; ++r)
    for (int64_t j = 0; j < ldc; ++j) {
      const std::size_t i = static_cast<std::size_t>(r * ldc + j);
      if (j >= g.n) {
        overwritten += got[i] != k_poison;
        continue;
      }
      unwritten += got[i] == k_poison;
      const double x = bf16_to_float(got[i]), y = bf16_to_float(want[i]);
      num += (x - y) * (x - y);
      den += y * y;
      if (first_bad < 0 && std::fabs(x - y) > 0.05 * std::fabs(y) + 1e-3)
        first_bad = static_cast<int64_t>(i);
    }
  const double rel = den > 0 ? std::sqrt(num / den) : 1.0;
  BOOST_TEST_INFO(tag(g));
  BOOST_TEST(den > 0);
  BOOST_TEST(unwritten == 0);
  BOOST_TEST(overwritten == 0);
  BOOST_TEST(rel < k_gpu_vs_ref_max_rel_error);
  if (rel >= k_gpu_vs_ref_max_rel_error || unwritten || overwritten) {
    std::ofstream f("failure_gemm_w4a16_" + tag(g) + ".txt");
    f << tag(g) << ": rel " << rel << " unwritten " << unwritten << " overwritten " << overwritten
      << " first bad " << first_bad << "\n";
    for (int64_t i = std::max<int64_t>(0, first_bad); i < std::min<int64_t>(static_cast<int64_t>(got.size()), std::max<int64_t>(0, first_bad) + 64); ++i)
      f << i << " (row " << i / ldc << ", col " << i % ldc << "): got " << bf16_to_float(got[static_cast<std::size_t>(i)])
        << " want " << bf16_to_float(want[static_cast<std::size_t>(i)]) << "\n";
  }
  return rel;
}

double check(int64_t m, int64_t n, int64_t k, int32_t gs, bool asym, uint64_t seed, int64_t batch = 1,
             int64_t lda_pad = 0, int64_t ldc_pad = 0) {
  problem_data d = make_problem(m, n, k, gs, asym, batch, seed, lda_pad, ldc_pad);
  std::vector<uint16_t> want = d.c;
  gemm_w4a16_args ref = d.args;
  ref.c = want.data();
  BOOST_REQUIRE(gemm_w4a16_ref(ref) == kernel_status::ok);
  device_problem dp(d);
  return compare(d.args, dp.run(dp.args), want);
}

} // namespace

BOOST_AUTO_TEST_SUITE(gemm_w4a16_gpu_test)

BOOST_AUTO_TEST_CASE(matches_cpu_reference_over_the_sweep) {
  rlserve::test::require_device();
  const int64_t ms[] = {1, 2, 3, 17, 118, 152, 256};
  double worst = 0;
  int cases = 0;
  t4::rng pick(7);
  for (int32_t gs : {32, 64, 128, k_int4_channel}) {
    // k: below one 128-k stage, exactly on stage boundaries, and past them.
    std::vector<int64_t> ks;
    if (gs == k_int4_channel)
      ks = {16, 112, 128, 144, 400};
    else
      ks = {gs, 128, 256, 384, 128 + gs, 1024};
    for (int asym = 0; asym < 2; ++asym)
      for (int64_t m : ms) {
        const int64_t k = ks[static_cast<std::size_t>(pick.below(static_cast<int64_t>(ks.size())))];
        const int64_t n = 64 * (1 + pick.below(5)); // 64 .. 320: half tiles and whole tiles
        worst = std::max(worst, check(m, n, k, gs, asym, 1000 + cases));
        ++cases;
      }
  }
  BOOST_TEST(cases == 4 * 2 * 7);
  BOOST_TEST_MESSAGE("gemm_w4a16 sweep: " << cases << " cases, worst relative error " << worst);
}

BOOST_AUTO_TEST_CASE(batches_padded_strides_and_large_shapes) {
  rlserve::test::require_device();
  double worst = 0;
  worst = std::max(worst, check(5, 128, 256, 32, true, 1, 3, 8, 64));     // batched, lda/ldc padded
  worst = std::max(worst, check(70, 192, 384, 128, false, 2, 2, 0, 8));   // batched, 2 m blocks each
  worst = std::max(worst, check(3, 14336, 4096, 128, true, 3));           // the benchmark's decode shape
  worst = std::max(worst, check(33, 1024, 2048, 64, true, 4));
  BOOST_TEST_MESSAGE("gemm_w4a16 batches / large: worst relative error " << worst);
}

BOOST_AUTO_TEST_CASE(every_scheduling_branch_and_variant_is_correct_and_deterministic) {
  rlserve::test::require_device();
  problem_data d = make_problem(37, 384, 1024, 64, true, 1, 42);
  std::vector<uint16_t> want = d.c;
  gemm_w4a16_args ref = d.args;
  ref.c = want.data();
  BOOST_REQUIRE(gemm_w4a16_ref(ref) == kernel_status::ok);
  device_problem dp(d);
  double worst = 0;
  // 2 n tiles (the second half full) x 8 k stages x (1..3 m blocks) units: 1 CTA runs everything
  // serially; 2, 5, 13 split tiles at odd points; 64 and 1000 split every tile many ways; every
  // variant (8 / 16 rows: swap-AB, 32 / 48 / 64: Marlin orientation).
  for (int rows : {8, 16, 32, 48, 64})
    for (int ctas : {1, 2, 5, 13, 64, 1000, 0}) {
      gemm_w4a16_args g = dp.args;
      g.block_rows = rows;
      g.max_ctas = ctas;
      const auto first = dp.run(g);
      gemm_w4a16_args shown = g;
      worst = std::max(worst, compare(shown, first, want));
      const auto second = dp.run(g);
      BOOST_TEST_INFO(tag(g));
      BOOST_TEST(first == second); // bitwise: fixed reduction order, counters left clean
    }
  // The workspace sized for m = 37 also serves smaller m, and a large m afterwards still finds
  // clean counters.
  gemm_w4a16_args small = dp.args;
  small.m = 1;
  dp.run(small);
  worst = std::max(worst, compare(dp.args, dp.run(dp.args), want));
  BOOST_TEST_MESSAGE("gemm_w4a16 scheduling branches: worst relative error " << worst);
}

// batch_invariant: a row's bits do not depend on m or on where the row sits (one 8-row variant,
// whole tiles), and the mode is as close to the reference as the default.
BOOST_AUTO_TEST_CASE(batch_invariant_rows_do_not_depend_on_m) {
  rlserve::test::require_device();
  problem_data d = make_problem(300, 384, 1024, 64, true, 1, 43);
  std::vector<uint16_t> want = d.c;
  gemm_w4a16_args ref = d.args;
  ref.c = want.data();
  BOOST_REQUIRE(gemm_w4a16_ref(ref) == kernel_status::ok);
  device_problem dp(d);
  gemm_w4a16_args g = dp.args;
  g.batch_invariant = true;
  const auto full = dp.run(g);
  compare(g, full, want);
  const int64_t ldc = g.ldc, lda = g.lda;
  int differs = 0, cases = 0;
  for (int64_t first : {0, 8, 37})
    for (int64_t m : {1, 5, 16, 37, 100}) {
      gemm_w4a16_args part = g;
      part.m = m;
      part.a = g.a + first * lda;
      const auto got = dp.run(part);
      ++cases;
      differs += !std::equal(got.begin(), got.begin() + m * ldc, full.begin() + first * ldc);
    }
  BOOST_TEST_MESSAGE("gemm_w4a16 batch_invariant: " << differs << " of " << cases
                     << " launches changed some row's bits");
  BOOST_TEST(differs == 0);
}

// Small shapes that cover every path quickly; scripts/gpu runs this case under compute-sanitizer
// (memcheck and racecheck).
BOOST_AUTO_TEST_CASE(small_problems_for_sanitizer) {
  rlserve::test::require_device();
  check(1, 64, 128, 32, true, 1);
  check(17, 192, 384, 128, false, 2);
  check(65, 128, 112, k_int4_channel, true, 3);
  check(4, 128, 256, 64, true, 4, 2, 8, 8);
  problem_data d = make_problem(20, 256, 512, 32, true, 1, 5);
  std::vector<uint16_t> want = d.c;
  gemm_w4a16_args ref = d.args;
  ref.c = want.data();
  BOOST_REQUIRE(gemm_w4a16_ref(ref) == kernel_status::ok);
  device_problem dp(d);
  for (int ctas : {1, 3, 40}) {
    gemm_w4a16_args g = dp.args;
    g.max_ctas = ctas;
    compare(g, dp.run(g), want);
  }
}

BOOST_AUTO_TEST_CASE(launch_statuses) {
  rlserve::test::require_device();
  problem_data d = make_problem(2, 64, 128, 32, true, 1, 9);
  device_problem dp(d);
  BOOST_TEST((gemm_w4a16_launch(dp.args, nullptr, nullptr) == kernel_status::workspace_null));
  gemm_w4a16_args bad = dp.args;
  bad.n = 100;
  BOOST_TEST((gemm_w4a16_launch(bad, dp.ws.get(), nullptr) == kernel_status::invalid_problem));
  bad = dp.args;
  bad.lda = 120; // < k
  BOOST_TEST((gemm_w4a16_launch(bad, dp.ws.get(), nullptr) == kernel_status::invalid_problem));
  bad.lda = 132;
  BOOST_TEST((gemm_w4a16_launch(bad, dp.ws.get(), nullptr) == kernel_status::misaligned_operand));
  gemm_w4a16_args none = dp.args;
  none.m = 0;
  BOOST_TEST((gemm_w4a16_launch(none, nullptr, nullptr) == kernel_status::ok));
  BOOST_TEST(gemm_w4a16_workspace_bytes(dp.args) > 0);
}

BOOST_AUTO_TEST_SUITE_END()
