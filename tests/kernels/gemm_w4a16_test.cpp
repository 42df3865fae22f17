// W4A16 GEMM reference (kernels/gemm_w4a16.hpp) on the CPU: against a naive double-precision GEMM
// over weights dequantized from the LOAD format (so it shares no index map with the serving-layout
// path), the batched form against single problems, the lane-level fragment map the CUDA kernel
// relies on (which 8 codes, scales and zero points a lane's 16-byte loads hold) against the
// serving-layout reference, and the argument checks.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include "kernels/gemm_w4a16.hpp"
#include "kernels/int4_quant.hpp"
#include "kernels/serving_layout.hpp"
#include "tests/kernels/int4_test_util.hpp"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;

namespace {

// ‖ref − naive‖ / ‖naive‖ over C: both use the same dequantized bf16 weights and FP32/FP64 sums;
// the difference is the bf16 rounding of C (relative 2^-9 per element at most, ~1e-3 RMS).
constexpr double k_ref_vs_naive_max_rel_error = 3e-3;
// Per element: |ref − naive| <= k_elem_rel * |naive| + k_elem_abs * (sum_k |a w|), i.e. one bf16
// half-ulp of the result plus FP32 summation error relative to the magnitude of the terms.
constexpr double k_elem_rel = 1.0 / 256;
constexpr double k_elem_abs = 1e-5;

struct quantized {
  int4_shape shape;
  bool asym = false;
  std::vector<uint16_t> w;          // bf16 [batch, n, k] before quantization
  std::vector<int32_t> packed;      // load format
  std::vector<uint16_t> scale;
  std::vector<int32_t> zp;          // standard layout
  std::vector<int32_t> s_weight;    // serving
  std::vector<uint16_t> s_scale;
  std::vector<int32_t> s_zp;
};

quantized make_weights(const int4_shape& s, bool asym, uint64_t seed) {
  quantized q;
  q.shape = s;
  q.asym = asym;
  q.w = t4::gaussian_weights(static_cast<std::size_t>(s.batch * s.n * s.k), seed, 0.05);
  q.packed.resize(static_cast<std::size_t>(ct_weight_packed_words(s)));
  q.scale.resize(static_cast<std::size_t>(ct_scale_count(s)));
  q.zp.resize(asym ? static_cast<std::size_t>(ct_zero_point_words(s)) : 0);
  int4_quant_args qa;
  qa.shape = s;
  qa.recipe = asym ? int4_recipe::asym : int4_recipe::sym;
  qa.zp_layout = zero_point_layout::standard;
  qa.w = q.w.data();
  qa.weight_packed = q.packed.data();
  qa.weight_scale = q.scale.data();
  qa.weight_zero_point = asym ? q.zp.data() : nullptr;
  uint64_t nonfinite = 0;
  qa.nonfinite = &nonfinite;
  BOOST_REQUIRE(int4_quantize_ref(qa) == kernel_status::ok);
  BOOST_REQUIRE(nonfinite == k_int4_all_finite);
  q.s_weight.resize(static_cast<std::size_t>(serving_weight_words(s)));
  q.s_scale.resize(static_cast<std::size_t>(serving_scale_count(s)));
  q.s_zp.resize(asym ? static_cast<std::size_t>(serving_zero_point_words(s)) : 0);
  serving_repack_args r{s, asym, zero_point_layout::standard, q.packed.data(), q.scale.data(),
                        asym ? q.zp.data() : nullptr, q.s_weight.data(), q.s_scale.data(),
                        asym ? q.s_zp.data() : nullptr};
  BOOST_REQUIRE(serving_repack_ref(r) == kernel_status::ok);
  return q;
}

// Dequantized weight (b, n, k) read from the LOAD format: bf16_rn((q - z) * s).
double load_dequant(const quantized& q, int64_t b, int64_t n, int64_t k) {
  const auto& s = q.shape;
  const int64_t groups = int4_groups(s), g = k / int4_group_len(s);
  const uint32_t word = static_cast<uint32_t>(q.packed[static_cast<std::size_t>((b * s.n + n) * (s.k / 8) + k / 8)]);
  const int32_t code = static_cast<int32_t>((word >> (4 * (k % 8))) & 0xf);
  const float scale = bf16_to_float(q.scale[static_cast<std::size_t>((b * s.n + n) * groups + g)]);
  int32_t z = 8;
  if (q.asym) {
    const uint32_t zw = static_cast<uint32_t>(q.zp[static_cast<std::size_t>(b * (s.n / 8) * groups + (n / 8) * groups + g)]);
    z = static_cast<int32_t>((zw >> (4 * (n % 8))) & 0xf);
  }
  return bf16_to_float(float_to_bf16(static_cast<float>(code - z) * scale));
}

std::vector<uint16_t> activations(int64_t count, uint64_t seed) { return t4::gaussian_weights(static_cast<std::size_t>(count), seed, 1.0); }

gemm_w4a16_args args_for(const quantized& q, int64_t m, const std::vector<uint16_t>& a, std::vector<uint16_t>& c) {
  gemm_w4a16_args g;
  g.m = m;
  g.n = q.shape.n;
  g.k = q.shape.k;
  g.group_size = q.shape.group_size;
  g.has_zero_point = q.asym;
  g.batch = q.shape.batch;
  g.a = a.data();
  g.b = q.s_weight.data();
  g.scale = q.s_scale.data();
  g.zero_point = q.asym ? q.s_zp.data() : nullptr;
  g.c = c.data();
  return g;
}

void check_against_naive(const int4_shape& s, bool asym, int64_t m, uint64_t seed) {
  const quantized q = make_weights(s, asym, seed);
  const auto a = activations(s.batch * m * s.k, seed + 7);
  std::vector<uint16_t> c(static_cast<std::size_t>(s.batch * m * s.n));
  t4::poison(c);
  BOOST_REQUIRE(gemm_w4a16_ref(args_for(q, m, a, c)) == kernel_status::ok);
  double num = 0, den = 0, anorm = 0;
  int bad = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < s.k; ++k) {
          const double x = bf16_to_float(a[static_cast<std::size_t>((b * m + i) * s.k + k)]);
          const double t = x * load_dequant(q, b, j, k);
          ref += t;
          mag += std::fabs(t);
          anorm += x * x;
        }
        const double got = bf16_to_float(c[static_cast<std::size_t>((b * m + i) * s.n + j)]);
        num += (got - ref) * (got - ref);
        den += ref * ref;
        if (!(std::fabs(got - ref) <= k_elem_rel * std::fabs(ref) + k_elem_abs * mag))
          ++bad;
      }
  BOOST_TEST_INFO(t4::shape_tag(s) << (asym ? " asym" : " sym") << " m=" << m);
  BOOST_TEST(anorm > 0);
  BOOST_TEST(den > 0);
  BOOST_TEST(std::sqrt(num / den) < k_ref_vs_naive_max_rel_error);
  BOOST_TEST(bad == 0);
}

} // namespace

BOOST_AUTO_TEST_SUITE(gemm_w4a16_test)

BOOST_AUTO_TEST_CASE(reference_matches_naive_gemm_on_load_format_weights) {
  int cases = 0;
  for (int32_t g : {32, 64, 128, k_int4_channel})
    for (int asym = 0; asym < 2; ++asym) {
      check_against_naive({1, 128, 256, g}, asym, 3, 10 + cases);
      check_against_naive({2, 64, g == k_int4_channel ? 80 : 128, g}, asym, 2, 50 + cases); // batched
      ++cases;
    }
  check_against_naive({1, 192, 384, 128}, true, 17, 99);
}

BOOST_AUTO_TEST_CASE(batched_reference_equals_single_problems) {
  const quantized q = make_weights({3, 64, 96, 32}, true, 5);
  const int64_t m = 5;
  const auto a = activations(3 * m * 96, 6);
  std::vector<uint16_t> all(3 * m * 64);
  BOOST_REQUIRE(gemm_w4a16_ref(args_for(q, m, a, all)) == kernel_status::ok);
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<uint16_t> one(m * 64);
    gemm_w4a16_args g = args_for(q, m, a, one);
    g.batch = 1;
    g.a = a.data() + b * m * 96;
    g.b = q.s_weight.data() + b * (96 * 64 / 8);
    g.scale = q.s_scale.data() + b * 3 * 64;
    g.zero_point = q.s_zp.data() + b * 3 * 8;
    BOOST_REQUIRE(gemm_w4a16_ref(g) == kernel_status::ok);
    BOOST_TEST(std::equal(one.begin(), one.end(), all.begin() + b * m * 64));
  }
  // FP32 outputs round to the bf16 ones.
  std::vector<float> f(3 * m * 64);
  BOOST_REQUIRE(gemm_w4a16_ref_f32(args_for(q, m, a, all), f.data()) == kernel_status::ok);
  for (std::size_t i = 0; i < f.size(); ++i)
    BOOST_TEST(float_to_bf16(f[i]) == all[i]);
}

// What one lane of the CUDA kernel reads, decoded with the kernel's own shifts and masks, must be
// its mma.m16n8k16 B fragments (k rows 2q, 2q+1 | 2q+8, 2q+9 of column g of each n8 tile), and
// its scale / zero-point loads the parameters of its columns g + 8t.
BOOST_AUTO_TEST_CASE(lane_fragment_map_matches_serving_layout) {
  for (int asym = 0; asym < 2; ++asym)
    for (int32_t gs : {32, 128}) {
      const int4_shape s{1, 128, 256, gs};
      const quantized q = make_weights(s, asym, 77 + gs + asym);
      std::vector<uint16_t> deq(static_cast<std::size_t>(s.n * s.k));
      serving_dequant_args d{s, static_cast<bool>(asym), int4_scale_type::bf16, q.s_weight.data(),
                             q.s_scale.data(), asym ? q.s_zp.data() : nullptr, deq.data()};
      BOOST_REQUIRE(serving_dequant_ref(d) == kernel_status::ok);
      int checked = 0, wrong = 0;
      for (int64_t kt = 0; kt < s.k / 16; ++kt)
        for (int64_t nt = 0; nt < s.n / 64; ++nt)
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, qd = lane % 4;
            const int64_t grp = kt * 16 / gs;
            // The lane's 16-byte scale load: positions 8g .. 8g+7 of the 64-block (grouped).
            const uint16_t* srow = q.s_scale.data() + grp * s.n + nt * 64 + 8 * g;
            const uint32_t zw = asym ? static_cast<uint32_t>(q.s_zp[static_cast<std::size_t>(grp * (s.n / 8) + nt * 8 + g)]) : 0;
            for (int j = 0; j < 4; ++j) {
              const uint32_t w = static_cast<uint32_t>(q.s_weight[static_cast<std::size_t>((kt * (s.n / 64) + nt) * 128 + 4 * lane + j)]);
              for (int half = 0; half < 4; ++half) { // the four bf16x2 registers of dequant_word
                const uint32_t pair = (w >> (4 * half)) & 0x000f000fu;
                const int tile = 2 * j + half / 2;                   // n8 tile in the 64 block
                const int64_t n = nt * 64 + 8 * tile + g;
                const int64_t k0 = kt * 16 + 2 * qd + 8 * (half % 2); // b0: rows 2q.. ; b1: 2q+8..
                const float sc = bf16_to_float(srow[tile]);
                const uint32_t z = asym ? (zw >> (4 * int4_interleave_slot(tile))) & 0xfu : 8u;
                // The kernel decodes zero points like weights: (zw >> 4i) & 0x000f000f | 0xc300c300
                // holds -(128 + z) of tiles 2i (low half) and 2i + 1 (high half).
                const uint32_t pz = ((zw >> (4 * (tile / 2))) & 0x000f000fu) | 0xc300c300u;
                const uint16_t nz = static_cast<uint16_t>(tile % 2 ? pz >> 16 : pz & 0xffffu);
                if (asym)
                  wrong += bf16_to_float(nz) != -128.0f - static_cast<float>(z);
                for (int e = 0; e < 2; ++e) {
                  const int32_t code = static_cast<int32_t>((pair >> (16 * e)) & 0xf);
                  const uint16_t got = float_to_bf16(static_cast<float>(code - static_cast<int32_t>(z)) * sc);
                  wrong += got != deq[static_cast<std::size_t>(n * s.k + k0 + e)];
                  ++checked;
                }
              }
            }
          }
      BOOST_TEST(checked == s.n * s.k);
      BOOST_TEST(wrong == 0);
    }
  // The magic exponent: bf16 0x4300 | q reads as 128 + q for every nibble.
  for (uint32_t qv = 0; qv < 16; ++qv)
    BOOST_TEST(bf16_to_float(static_cast<uint16_t>(0x4300u | qv)) == 128.0f + static_cast<float>(qv));
  BOOST_TEST(bf16_to_float(0xc308) == -136.0f);
}

BOOST_AUTO_TEST_CASE(can_implement_rejects_bad_arguments) {
  alignas(16) static uint16_t a[4096], c[4096], sc[4096];
  alignas(16) static int32_t b[4096], z[4096];
  gemm_w4a16_args g;
  g.m = 2, g.n = 64, g.k = 128, g.group_size = 32, g.has_zero_point = true;
  g.a = a, g.b = b, g.scale = sc, g.zero_point = z, g.c = c;
  BOOST_TEST((gemm_w4a16_can_implement(g) == kernel_status::ok));
  auto with = [&](auto edit) {
    gemm_w4a16_args x = g;
    edit(x);
    return gemm_w4a16_can_implement(x);
  };
  BOOST_TEST((with([](auto& x) { x.n = 96; }) == kernel_status::invalid_problem));
  BOOST_TEST((with([](auto& x) { x.k = 40; }) == kernel_status::invalid_problem));
  BOOST_TEST((with([](auto& x) { x.k = 48; }) == kernel_status::invalid_problem)); // k % G
  BOOST_TEST((with([](auto& x) { x.group_size = 48; }) == kernel_status::invalid_problem));
  BOOST_TEST((with([](auto& x) { x.zero_point = nullptr; }) == kernel_status::invalid_problem));
  BOOST_TEST((with([](auto& x) { x.batch = 0; }) == kernel_status::invalid_problem));
  BOOST_TEST((with([](auto& x) { x.lda = 100; }) == kernel_status::invalid_problem)); // < k
  BOOST_TEST((with([](auto& x) { x.lda = 132; }) == kernel_status::misaligned_operand));
  BOOST_TEST((with([](auto& x) { x.ldc = 68; }) == kernel_status::misaligned_operand));
  BOOST_TEST((with([&](auto& x) { x.a = a + 1; }) == kernel_status::misaligned_operand));
  BOOST_TEST((with([&](auto& x) { x.c = c + 4; }) == kernel_status::misaligned_operand));
  BOOST_TEST((with([](auto& x) { x.block_rows = 24; }) == kernel_status::invalid_problem));
  BOOST_TEST((with([](auto& x) { x.batch_invariant = true; }) == kernel_status::ok));
  BOOST_TEST((with([](auto& x) { x.batch_invariant = true, x.block_rows = 8; }) == kernel_status::ok));
  BOOST_TEST((with([](auto& x) { x.batch_invariant = true, x.block_rows = 16; }) == kernel_status::invalid_problem));
  BOOST_TEST((with([](auto& x) { x.m = 0, x.a = nullptr, x.c = nullptr; }) == kernel_status::ok));
  BOOST_TEST((with([](auto& x) { x.has_zero_point = false, x.zero_point = nullptr; }) == kernel_status::ok));
  BOOST_TEST((with([](auto& x) { x.group_size = k_int4_channel, x.k = 80; }) == kernel_status::ok));
}

BOOST_AUTO_TEST_SUITE_END()
