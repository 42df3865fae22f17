// The quantization recipes of kernels/int4_quant.hpp: hand-computed groups (ties, clamps, the
// scale floor, constant and all-zero groups), an independent double-precision oracle over random
// shapes and adversarial data for every recipe x group size x zero-point layout, the half-step
// error bound, and every bad input (NaN/Inf, group size 0 or 48, k % G, k % 8, n % 8, nulls)
// coming back as a sentence that names the tensor.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/compressed_tensors.hpp"
#include "kernels/int4_quant.hpp"
#include "kernels/serving_layout.hpp"
#include "tests/kernels/int4_test_util.hpp"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;

namespace {

constexpr int32_t k_group_sizes[] = {32, 64, 128, k_int4_channel};
constexpr int4_recipe k_recipes[] = {int4_recipe::sym_qat, int4_recipe::sym, int4_recipe::asym};

// The load-format outputs of one call, unpacked to codes for checking.
struct ct_result {
  std::vector<int32_t> packed;
  std::vector<uint16_t> scale;
  std::vector<int32_t> zp;
  std::vector<uint8_t> codes;    // [batch*n, k]
  std::vector<uint8_t> zp_codes; // [batch, n, groups]
  uint64_t nonfinite = 0;
};

ct_result quantize(const int4_shape& s, int4_recipe r, zero_point_layout layout,
                   const std::vector<uint16_t>& w) {
  ct_result out;
  const bool asym = r == int4_recipe::asym;
  out.packed.resize(static_cast<std::size_t>(ct_weight_packed_words(s)));
  out.scale.resize(static_cast<std::size_t>(ct_scale_count(s)));
  out.zp.resize(asym ? static_cast<std::size_t>(ct_zero_point_words(s)) : 0);
  t4::poison(out.packed);
  t4::poison(out.scale);
  t4::poison(out.zp);
  out.nonfinite = 0xD5D5D5D5D5D5D5D5ull;
  int4_quant_args a;
  a.shape = s;
  a.recipe = r;
  a.zp_layout = layout;
  a.w = w.data();
  a.weight_packed = out.packed.data();
  a.weight_scale = out.scale.data();
  a.weight_zero_point = asym ? out.zp.data() : nullptr;
  a.nonfinite = &out.nonfinite;
  BOOST_REQUIRE(int4_quantize_ref(a) == kernel_status::ok);
  out.codes.resize(static_cast<std::size_t>(s.batch * s.n * s.k));
  BOOST_REQUIRE(ct_unpack_weight_ref(out.packed.data(), out.codes.data(), s.batch * s.n, s.k) ==
                kernel_status::ok);
  if (asym) {
    out.zp_codes.resize(static_cast<std::size_t>(s.batch * s.n * int4_groups(s)));
    BOOST_REQUIRE(ct_unpack_zero_point_ref(out.zp.data(), out.zp_codes.data(), s, layout) ==
                  kernel_status::ok);
  }
  return out;
}

std::vector<uint16_t> bf16_row(std::initializer_list<double> values, std::size_t len) {
  std::vector<uint16_t> w(len, t4::bf16(0.0));
  std::size_t i = 0;
  for (double v : values)
    w[i++] = t4::bf16(v);
  return w;
}

} // namespace

BOOST_AUTO_TEST_SUITE(int4_quant_test)

BOOST_AUTO_TEST_CASE(qat_symmetric_by_hand) {
  // amax = 7 -> scale = 7/7 = 1 exactly; ties round to even; codes stored with +8.
  auto w = bf16_row({7, -7, 3.5, 2.5, -0.5, 0.5, 1.5, -2.5, 6.5, -6.5}, 32);
  auto r = quantize({1, 1, 32, 32}, int4_recipe::sym_qat, zero_point_layout::standard, w);
  const uint8_t want[10] = {15, 1, 12, 10, 8, 8, 10, 6, 14, 2};
  for (int i = 0; i < 10; ++i)
    BOOST_TEST(r.codes[i] == want[i]);
  for (int i = 10; i < 32; ++i)
    BOOST_TEST(r.codes[i] == 8);
  BOOST_TEST(r.scale[0] == 0x3F80); // bf16(1.0)
  BOOST_TEST(r.nonfinite == k_int4_all_finite);
  // Word 0 = codes 0..7, lowest nibble first: 15, 1, 12, 10, 8, 8, 10, 6.
  BOOST_TEST(static_cast<uint32_t>(r.packed[0]) == 0x6A88AC1Fu);
}

BOOST_AUTO_TEST_CASE(gptq_symmetric_uses_amax_over_7_5) {
  // amax = 7.5 -> scale 1: +7.5 rounds to 8 and clamps to 7 (code 15), -7.5 -> -8 (code 0).
  auto w = bf16_row({7.5, -7.5, 7, -7, 0.5, -1.5}, 32);
  auto r = quantize({1, 1, 32, 32}, int4_recipe::sym, zero_point_layout::standard, w);
  const uint8_t want[6] = {15, 0, 15, 1, 8, 6};
  for (int i = 0; i < 6; ++i)
    BOOST_TEST(r.codes[i] == want[i]);
  BOOST_TEST(r.scale[0] == 0x3F80);
  // QAT on the same group: scale = 7.5/7, +7.5 -> 7 exactly, never -8.
  auto q = quantize({1, 1, 32, 32}, int4_recipe::sym_qat, zero_point_layout::standard, w);
  BOOST_TEST(q.codes[0] == 15);
  BOOST_TEST(q.codes[1] == 1);
}

BOOST_AUTO_TEST_CASE(asymmetric_by_hand) {
  // lo = -7.5, hi = 7.5: scale = 15/15 = 1, zero = rint(7.5) = 8 (ties to even),
  // 7.5 -> rint 8 + 8 = 16 -> clamp 15, -7.5 -> -8 + 8 = 0, 2.5 -> 2 + 8 = 10.
  auto w = bf16_row({7.5, -7.5, 2.5, -3, 0.5, 1.5}, 64);
  auto r = quantize({1, 8, 64, 64}, int4_recipe::asym, zero_point_layout::standard,
                    [&] { std::vector<uint16_t> all; for (int i = 0; i < 8; ++i) all.insert(all.end(), w.begin(), w.end()); return all; }());
  const uint8_t want[6] = {15, 0, 10, 5, 8, 10};
  for (int i = 0; i < 6; ++i)
    BOOST_TEST(r.codes[i] == want[i]);
  BOOST_TEST(r.scale[0] == 0x3F80);
  BOOST_TEST(r.zp_codes[0] == 8);
  BOOST_TEST(static_cast<uint32_t>(r.zp[0]) == 0x88888888u); // 8 rows x zero point 8, one word
}

BOOST_AUTO_TEST_CASE(all_zero_and_constant_groups) {
  const int4_shape s{1, 8, 32, 32};
  std::vector<uint16_t> zero(8 * 32, 0), pos(8 * 32, t4::bf16(0.5)), neg(8 * 32, t4::bf16(-0.5));
  std::vector<uint16_t> signed_zero(8 * 32, 0x8000);
  for (auto r : k_recipes) {
    auto z = quantize(s, r, zero_point_layout::standard, zero);
    BOOST_TEST(z.scale[0] == 0x3728); // bf16(1e-5): the floor
    BOOST_TEST(z.codes[5] == (int4_symmetric(r) ? 8 : 0));
    auto sz = quantize(s, r, zero_point_layout::standard, signed_zero);
    BOOST_TEST(sz.packed == z.packed); // -0.0 and +0.0 are the same weight
    BOOST_TEST(sz.scale == z.scale);
    BOOST_TEST(sz.zp == z.zp);
  }
  auto p = quantize(s, int4_recipe::asym, zero_point_layout::standard, pos);
  BOOST_TEST(p.zp_codes[0] == 0); // range [0, 0.5]
  BOOST_TEST(p.codes[0] == 15);
  auto n = quantize(s, int4_recipe::asym, zero_point_layout::standard, neg);
  BOOST_TEST(n.zp_codes[0] == 15); // range [-0.5, 0]
  BOOST_TEST(n.codes[0] == 0);
  // Both dequantize back to +-0.5 within one bf16 rounding of the scale.
  const float sp = bf16_to_float(p.scale[0]);
  BOOST_TEST(std::fabs(15 * sp - 0.5f) < 0.5f * 0x1p-8f);
  auto sy = quantize(s, int4_recipe::sym_qat, zero_point_layout::standard, pos);
  BOOST_TEST(sy.codes[0] == 15); // 0.5 / (0.5/7) = 7
}

BOOST_AUTO_TEST_CASE(scale_floor_and_denormals) {
  // max |w| = 3e-5 < 7e-5: the QAT scale clamps to 1e-5, codes rint(w / 1e-5).
  auto w = bf16_row({3e-5, -2e-5, 1e-5, 0}, 32);
  auto r = quantize({1, 1, 32, 32}, int4_recipe::sym_qat, zero_point_layout::standard, w);
  BOOST_TEST(r.scale[0] == 0x3728);
  BOOST_TEST(r.codes[0] == 8 + static_cast<int>(std::nearbyint(bf16_to_float(w[0]) / 1e-5f)));
  std::vector<uint16_t> denormal(8 * 32);
  for (int i = 0; i < 8 * 32; ++i)
    denormal[i] = static_cast<uint16_t>(i % 2 ? 0x0001 + i % 64 : 0x807f - i % 64);
  for (auto rc : k_recipes) {
    auto d = quantize({1, 8, 32, 32}, rc, zero_point_layout::standard, denormal);
    for (int row = 0; row < 8; ++row)
      BOOST_TEST(d.scale[row] == 0x3728);
    for (int i = 0; i < 8 * 32; ++i)
      BOOST_TEST(d.codes[i] == (int4_symmetric(rc) ? 8 : 0));
  }
}

BOOST_AUTO_TEST_CASE(oracle_sweep_every_recipe_group_and_layout) {
  t4::rng pick(7);
  int cases = 0;
  for (auto r : k_recipes)
    for (int32_t g : k_group_sizes)
      for (auto layout : {zero_point_layout::standard, zero_point_layout::miles}) {
        if (int4_symmetric(r) && layout == zero_point_layout::miles)
          continue;
        for (int rep = 0; rep < 3; ++rep) {
          const int64_t glen = g == k_int4_channel ? 0 : g;
          int4_shape s;
          s.batch = 1 + pick.below(3);
          s.n = 8 * (1 + pick.below(9));
          s.k = g == k_int4_channel ? 8 * (1 + pick.below(40)) : glen * (1 + pick.below(4));
          s.group_size = g;
          auto w = t4::adversarial_weights(s, 1000 + cases);
          auto got = quantize(s, r, layout, w);
          BOOST_TEST(got.nonfinite == k_int4_all_finite);
          const int64_t gl = int4_group_len(s), groups = int4_groups(s);
          bool ok = true;
          for (int64_t row = 0; row < s.batch * s.n && ok; ++row)
            for (int64_t gi = 0; gi < groups && ok; ++gi) {
              auto want = t4::oracle_quantize_group(r, w.data() + row * s.k + gi * gl, gl);
              ok &= got.scale[row * groups + gi] == float_to_bf16(want.scale);
              if (r == int4_recipe::asym)
                ok &= got.zp_codes[row * groups + gi] == want.zero;
              for (int64_t i = 0; i < gl; ++i) {
                ok &= got.codes[row * s.k + gi * gl + i] == want.codes[i];
                // The half-step bound, against the FP32 scale the codes were made with.
                const double x = bf16_to_float(w[row * s.k + gi * gl + i]);
                const double v = (static_cast<double>(want.codes[i]) - want.zero) * want.scale;
                ok &= std::fabs(x - v) <= t4::k_max_error_steps * want.scale * (1 + t4::k_fp32_slack);
              }
              if (!ok)
                BOOST_ERROR("recipe " << to_string(r) << " shape " << t4::shape_tag(s) << " row " << row
                                      << " group " << gi << " differs from the oracle");
            }
          ++cases;
        }
      }
  BOOST_TEST(cases == 3 * 4 * 4);
}

BOOST_AUTO_TEST_CASE(gaussian_roundtrip_error_is_bounded_and_nonzero) {
  for (auto r : k_recipes)
    for (int32_t g : k_group_sizes) {
      const int4_shape s{2, 64, 256, g};
      auto w = t4::gaussian_weights(static_cast<std::size_t>(s.batch * s.n * s.k), 42);
      auto q = quantize(s, r, zero_point_layout::standard, w);
      std::vector<uint16_t> deq(w.size());
      t4::poison(deq);
      ct_dequant_args d;
      d.shape = s;
      d.has_zero_point = r == int4_recipe::asym;
      d.weight_packed = q.packed.data();
      d.weight_scale = q.scale.data();
      d.weight_zero_point = d.has_zero_point ? q.zp.data() : nullptr;
      d.out = deq.data();
      BOOST_REQUIRE(ct_dequant_ref(d) == kernel_status::ok);
      double err = 0, ref = 0, out = 0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double x = bf16_to_float(w[i]), y = bf16_to_float(deq[i]);
        err += (x - y) * (x - y);
        ref += x * x;
        out += y * y;
      }
      BOOST_TEST(ref > 0);
      BOOST_TEST(out > 0);
      BOOST_TEST(err > 0); // 4 bits cannot be lossless on Gaussian data
      BOOST_CHECK_MESSAGE(std::sqrt(err / ref) < t4::k_int4_roundtrip_max_rel_rmse,
                          to_string(r) << " g" << g << " rel rmse " << std::sqrt(err / ref));
    }
}

BOOST_AUTO_TEST_CASE(nonfinite_weights_are_errors_naming_tensor_and_element) {
  const int4_shape s{2, 8, 64, 32};
  auto w = t4::gaussian_weights(2 * 8 * 64, 3);
  struct bad {
    uint16_t bits;
    const char* word;
  };
  for (auto b : {bad{0x7fc0, "NaN"}, bad{0xffc1, "NaN"}, bad{0x7f80, "+Inf"}, bad{0xff80, "-Inf"}}) {
    auto x = w;
    x[(1 * 8 + 3) * 64 + 17] = b.bits;
    x[(1 * 8 + 5) * 64 + 2] = 0x7fc0; // a later one: the first is reported
    for (auto r : k_recipes) {
      std::vector<int32_t> packed(ct_weight_packed_words(s)), zp(ct_zero_point_words(s));
      std::vector<uint16_t> scale(ct_scale_count(s));
      int4_quant_args a;
      a.shape = s;
      a.recipe = r;
      a.w = x.data();
      a.weight_packed = packed.data();
      a.weight_scale = scale.data();
      a.weight_zero_point = zp.data();
      auto st = int4_quantize(a, "model.layers.0.mlp.experts.3.up_proj.weight");
      BOOST_REQUIRE(!st);
      BOOST_TEST(st.error() == std::string("model.layers.0.mlp.experts.3.up_proj.weight: element [1, 3, 17] is ") +
                                 b.word + "; INT4 quantization needs finite weights");
      uint64_t flag = 0;
      a.nonfinite = &flag;
      BOOST_TEST((int4_quantize_ref(a) == kernel_status::ok)); // data errors come back in the flag
      BOOST_TEST(flag == static_cast<uint64_t>((1 * 8 + 3) * 64 + 17));
    }
  }
  // The fused serving path reports the same way; a single matrix has no batch index.
  const int4_shape s1{1, 64, 64, 64};
  auto x = t4::gaussian_weights(64 * 64, 4);
  x[63 * 64 + 63] = 0xff80;
  std::vector<int32_t> sw(serving_weight_words(s1)), sz(serving_zero_point_words(s1));
  std::vector<uint16_t> ss(serving_scale_count(s1));
  int4_quant_serving_args a;
  a.shape = s1;
  a.w = x.data();
  a.serving_weight = sw.data();
  a.serving_scale = ss.data();
  a.serving_zero_point = sz.data();
  auto st = int4_quantize_serving(a, "w2");
  BOOST_REQUIRE(!st);
  BOOST_TEST(st.error() == "w2: element [63, 63] is -Inf; INT4 quantization needs finite weights");
}

BOOST_AUTO_TEST_CASE(bad_shapes_and_arguments_are_sentences) {
  std::vector<uint16_t> w(64 * 256, t4::bf16(0.25));
  std::vector<int32_t> packed(64 * 256), zp(64 * 256);
  std::vector<uint16_t> scale(64 * 256);
  auto call = [&](int4_shape s, int4_recipe r = int4_recipe::asym) {
    int4_quant_args a;
    a.shape = s;
    a.recipe = r;
    a.w = w.data();
    a.weight_packed = packed.data();
    a.weight_scale = scale.data();
    a.weight_zero_point = zp.data();
    return int4_quantize(a, "t");
  };
  auto err = [&](int4_shape s, int4_recipe r = int4_recipe::asym) {
    auto st = call(s, r);
    return st ? std::string("(ok)") : st.error();
  };
  BOOST_TEST(call({1, 64, 256, 128}).has_value());
  BOOST_TEST(err({1, 64, 256, 0}) == "t: int4-asym quantization: group size 0 is not supported (use 32, 64, 128, "
                                     "or -1 for one group per output channel)");
  BOOST_TEST(err({1, 64, 144, 48}).find("group size 48 is not supported") != std::string::npos);
  BOOST_TEST(err({1, 64, 96, 64}) == "t: int4-asym quantization: k (input features) = 96 is not a multiple of "
                                     "the group size 64");
  BOOST_TEST(err({1, 64, 36, k_int4_channel}).find("k (input features) = 36 is not a multiple of 8") !=
             std::string::npos);
  BOOST_TEST(err({1, 12, 64, 32}).find("n (output features) = 12 is not a multiple of 8") != std::string::npos);
  BOOST_TEST(call({1, 12, 64, 32}, int4_recipe::sym).has_value()); // no zero points: any n
  BOOST_TEST(err({1, 64, 64, 32}, static_cast<int4_recipe>(9)).find("unknown INT4 recipe 9") != std::string::npos);

  int4_quant_args a;
  a.shape = {1, 8, 32, 32};
  a.w = w.data();
  a.weight_packed = packed.data();
  a.weight_scale = scale.data();
  uint64_t flag = 0;
  a.nonfinite = &flag;
  BOOST_TEST((int4_quant_can_implement(a) == kernel_status::invalid_problem)); // asym, no zp buffer
  auto st = int4_quantize(a, "t");
  BOOST_TEST(st.error() == "t: int4-asym quantization: asymmetric quantization needs a weight_zero_point buffer");
  a.recipe = int4_recipe::sym;
  BOOST_TEST((int4_quant_can_implement(a) == kernel_status::ok));
  a.w = nullptr;
  BOOST_TEST((int4_quantize_ref(a) == kernel_status::invalid_problem));

  // The fused path checks the serving tile too.
  int4_quant_serving_args f;
  f.shape = {1, 96, 128, 32};
  f.recipe = int4_recipe::sym;
  f.w = w.data();
  f.serving_weight = packed.data();
  f.serving_scale = scale.data();
  auto fs = int4_quantize_serving(f, "t");
  BOOST_TEST(fs.error() == "t: int4-sym quantization: n (output features) = 96 is not a multiple of 64 "
                           "(the serving layout stores 16 (k) x 64 (n) tiles)");
  f.shape = {1, 64, 40, k_int4_channel};
  BOOST_TEST(int4_quantize_serving(f, "t").error().find("k (input features) = 40 is not a multiple of 16") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(fused_serving_equals_quantize_then_repack_from_either_layout) {
  t4::rng pick(11);
  for (auto r : k_recipes)
    for (int32_t g : k_group_sizes) {
      int4_shape s{1 + pick.below(2), 64 * (1 + pick.below(3)), 0, g};
      s.k = g == k_int4_channel ? 16 * (1 + pick.below(12)) : g * (1 + pick.below(3));
      auto w = t4::adversarial_weights(s, 77 + g);
      const bool asym = r == int4_recipe::asym;
      std::vector<int32_t> fw(serving_weight_words(s)), fz(asym ? serving_zero_point_words(s) : 0);
      std::vector<uint16_t> fs(serving_scale_count(s));
      t4::poison(fw);
      t4::poison(fs);
      t4::poison(fz);
      uint64_t flag = 0;
      int4_quant_serving_args f{s, r, w.data(), fw.data(), fs.data(), asym ? fz.data() : nullptr, &flag};
      BOOST_REQUIRE(int4_quantize_serving_ref(f) == kernel_status::ok);
      BOOST_TEST(flag == k_int4_all_finite);
      BOOST_TEST(t4::word_norm(fw) > 0);
      // Through the miles layout: quantize, repack -> the same serving bytes.
      auto layout = asym ? zero_point_layout::miles : zero_point_layout::standard;
      auto q = quantize(s, r, layout, w);
      std::vector<int32_t> rw(fw.size()), rz(fz.size());
      std::vector<uint16_t> rs(fs.size());
      t4::poison(rw);
      serving_repack_args p{s, asym, layout, q.packed.data(), q.scale.data(), asym ? q.zp.data() : nullptr,
                            rw.data(), rs.data(), asym ? rz.data() : nullptr};
      BOOST_REQUIRE(serving_repack_ref(p) == kernel_status::ok);
      BOOST_TEST(t4::compare_or_dump(fw, rw, "fused_weight", s) == -1);
      BOOST_TEST(t4::compare_or_dump(fs, rs, "fused_scale", s) == -1);
      BOOST_TEST(t4::compare_or_dump(fz, rz, "fused_zp", s) == -1);
    }
}

BOOST_AUTO_TEST_SUITE_END()
