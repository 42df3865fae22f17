// Serving layout: repack agrees byte for byte with Marlin's published packer (weights, grouped and
// single scale permutations, zero points); restore(repack(x)) == x and repack(restore(y)) == y
// for arbitrary bits over random shapes, every group size, sym/asym and both zero-point layouts;
// dequant(serving) == dequant(load) element-wise through the inverse-map reference dequantizer;
// a partial update leaves the untouched tensor bit-identical; shapes the tiles cannot hold are
// sentences naming the dimension and the multiple.
#include <boost/test/unit_test.hpp>

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

// A random shape the serving layout can hold: n in 64..256, k a multiple of the group (>= 16).
int4_shape random_shape(t4::rng& r, int32_t g) {
  int4_shape s;
  s.batch = 1 + r.below(3);
  s.n = 64 * (1 + r.below(4));
  s.k = g == k_int4_channel ? 16 * (1 + r.below(16)) : g * (1 + r.below(4));
  s.group_size = g;
  return s;
}

template <class T>
std::vector<T> random_bits(std::size_t count, uint64_t seed) {
  t4::rng r(seed);
  std::vector<T> v(count);
  for (auto& x : v)
    x = static_cast<T>(r.next());
  return v;
}

struct load_tensors {
  std::vector<int32_t> packed;
  std::vector<uint16_t> scale;
  std::vector<int32_t> zp;
};
struct serving_tensors {
  std::vector<int32_t> weight;
  std::vector<uint16_t> scale;
  std::vector<int32_t> zp;
};

serving_tensors repack(const int4_shape& s, bool asym, zero_point_layout layout, const load_tensors& in) {
  serving_tensors out;
  out.weight.resize(serving_weight_words(s));
  out.scale.resize(serving_scale_count(s));
  out.zp.resize(asym ? serving_zero_point_words(s) : 0);
  t4::poison(out.weight);
  t4::poison(out.scale);
  t4::poison(out.zp);
  serving_repack_args a{s, asym, layout, in.packed.data(), in.scale.data(), asym ? in.zp.data() : nullptr,
                        out.weight.data(), out.scale.data(), asym ? out.zp.data() : nullptr};
  BOOST_REQUIRE(serving_repack(a, "t").has_value());
  return out;
}

load_tensors restore(const int4_shape& s, bool asym, zero_point_layout layout, const serving_tensors& in) {
  load_tensors out;
  out.packed.resize(ct_weight_packed_words(s));
  out.scale.resize(ct_scale_count(s));
  out.zp.resize(asym ? ct_zero_point_words(s) : 0);
  t4::poison(out.packed);
  t4::poison(out.scale);
  t4::poison(out.zp);
  serving_restore_args a{s, asym, layout, in.weight.data(), in.scale.data(), asym ? in.zp.data() : nullptr,
                         out.packed.data(), out.scale.data(), asym ? out.zp.data() : nullptr};
  BOOST_REQUIRE(serving_restore(a, "t").has_value());
  return out;
}

load_tensors quantized(const int4_shape& s, int4_recipe r, zero_point_layout layout, uint64_t seed) {
  auto w = t4::adversarial_weights(s, seed);
  load_tensors out;
  out.packed.resize(ct_weight_packed_words(s));
  out.scale.resize(ct_scale_count(s));
  out.zp.resize(r == int4_recipe::asym ? ct_zero_point_words(s) : 0);
  int4_quant_args a;
  a.shape = s;
  a.recipe = r;
  a.zp_layout = layout;
  a.w = w.data();
  a.weight_packed = out.packed.data();
  a.weight_scale = out.scale.data();
  a.weight_zero_point = r == int4_recipe::asym ? out.zp.data() : nullptr;
  BOOST_REQUIRE(int4_quantize(a, "t").has_value());
  return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(serving_layout_test)

BOOST_AUTO_TEST_CASE(repack_matches_marlin_packer_byte_for_byte) {
  t4::rng pick(5);
  for (int32_t g : k_group_sizes) {
    const int4_shape s = random_shape(pick, g);
    const int64_t groups = int4_groups(s);
    auto in = quantized(s, int4_recipe::asym, zero_point_layout::standard, 300 + g);
    auto out = repack(s, true, zero_point_layout::standard, in);
    std::vector<uint8_t> codes(static_cast<std::size_t>(s.batch * s.n * s.k)), zp(s.batch * s.n * groups);
    BOOST_REQUIRE(ct_unpack_weight_ref(in.packed.data(), codes.data(), s.batch * s.n, s.k) == kernel_status::ok);
    BOOST_REQUIRE(ct_unpack_zero_point_ref(in.zp.data(), zp.data(), s, zero_point_layout::standard) ==
                  kernel_status::ok);
    for (int64_t b = 0; b < s.batch; ++b) {
      // Marlin's packer takes the [k, n] (transposed) codes and [groups, n] scales.
      std::vector<uint8_t> kn(static_cast<std::size_t>(s.k * s.n)), zp_gn(groups * s.n);
      std::vector<uint16_t> scale_gn(groups * s.n);
      for (int64_t n = 0; n < s.n; ++n) {
        for (int64_t k = 0; k < s.k; ++k)
          kn[k * s.n + n] = codes[(b * s.n + n) * s.k + k];
        for (int64_t gi = 0; gi < groups; ++gi) {
          scale_gn[gi * s.n + n] = in.scale[(b * s.n + n) * groups + gi];
          zp_gn[gi * s.n + n] = zp[(b * s.n + n) * groups + gi];
        }
      }
      auto want_w = t4::marlin_pack(kn, s.k, s.n);
      auto want_s = t4::marlin_permute_scales(scale_gn, groups, s.n, groups > 1);
      auto want_z = t4::marlin_zero_points(zp_gn, groups, s.n);
      std::vector<int32_t> got_w(out.weight.begin() + b * (s.k * s.n / 8), out.weight.begin() + (b + 1) * (s.k * s.n / 8));
      std::vector<uint16_t> got_s(out.scale.begin() + b * groups * s.n, out.scale.begin() + (b + 1) * groups * s.n);
      std::vector<int32_t> got_z(out.zp.begin() + b * groups * s.n / 8, out.zp.begin() + (b + 1) * groups * s.n / 8);
      BOOST_TEST(t4::word_norm(want_w) > 0);
      BOOST_TEST(t4::compare_or_dump(got_w, want_w, "marlin_weight", s) == -1);
      BOOST_TEST(t4::compare_or_dump(got_s, want_s, "marlin_scale", s) == -1);
      BOOST_TEST(t4::compare_or_dump(got_z, want_z, "marlin_zp", s) == -1);
    }
  }
}

BOOST_AUTO_TEST_CASE(restore_inverts_repack_for_any_bits) {
  t4::rng pick(17);
  int cases = 0;
  for (int32_t g : k_group_sizes)
    for (int asym = 0; asym < 2; ++asym)
      for (auto layout : {zero_point_layout::standard, zero_point_layout::miles})
        for (int rep = 0; rep < 3; ++rep) {
          if (!asym && layout == zero_point_layout::miles)
            continue;
          const int4_shape s = random_shape(pick, g);
          load_tensors in{random_bits<int32_t>(ct_weight_packed_words(s), 1 + cases),
                          random_bits<uint16_t>(ct_scale_count(s), 2 + cases),
                          asym ? random_bits<int32_t>(ct_zero_point_words(s), 3 + cases) : std::vector<int32_t>{}};
          auto served = repack(s, asym, layout, in);
          BOOST_TEST(!t4::all_poison(served.weight));
          auto back = restore(s, asym, layout, served);
          BOOST_TEST(t4::compare_or_dump(back.packed, in.packed, "restore_weight", s) == -1);
          BOOST_TEST(t4::compare_or_dump(back.scale, in.scale, "restore_scale", s) == -1);
          BOOST_TEST(t4::compare_or_dump(back.zp, in.zp, "restore_zp", s) == -1);
          // And the other way round: serving bits -> restore -> repack.
          serving_tensors y{random_bits<int32_t>(serving_weight_words(s), 4 + cases),
                            random_bits<uint16_t>(serving_scale_count(s), 5 + cases),
                            asym ? random_bits<int32_t>(serving_zero_point_words(s), 6 + cases) : std::vector<int32_t>{}};
          auto again = repack(s, asym, layout, restore(s, asym, layout, y));
          BOOST_TEST(again.weight == y.weight);
          BOOST_TEST(again.scale == y.scale);
          BOOST_TEST(again.zp == y.zp);
          ++cases;
        }
  BOOST_TEST(cases == 4 * 3 * 3);
}

BOOST_AUTO_TEST_CASE(dequant_of_serving_equals_dequant_of_load_format) {
  t4::rng pick(23);
  for (int32_t g : k_group_sizes)
    for (auto r : {int4_recipe::sym_qat, int4_recipe::sym, int4_recipe::asym})
      for (auto layout : {zero_point_layout::standard, zero_point_layout::miles}) {
        const bool asym = r == int4_recipe::asym;
        if (!asym && layout == zero_point_layout::miles)
          continue;
        const int4_shape s = random_shape(pick, g);
        auto in = quantized(s, r, layout, 900 + g);
        auto served = repack(s, asym, layout, in);
        const auto count = static_cast<std::size_t>(s.batch * s.n * s.k);
        std::vector<uint16_t> from_load(count), from_serving(count);
        t4::poison(from_load);
        t4::poison(from_serving);
        ct_dequant_args d;
        d.shape = s;
        d.has_zero_point = asym;
        d.zp_layout = layout;
        d.weight_packed = in.packed.data();
        d.weight_scale = in.scale.data();
        d.weight_zero_point = asym ? in.zp.data() : nullptr;
        d.out = from_load.data();
        BOOST_REQUIRE(ct_dequant_ref(d) == kernel_status::ok);
        serving_dequant_args e;
        e.shape = s;
        e.has_zero_point = asym;
        e.serving_weight = served.weight.data();
        e.serving_scale = served.scale.data();
        e.serving_zero_point = asym ? served.zp.data() : nullptr;
        e.out = from_serving.data();
        BOOST_REQUIRE(serving_dequant_ref(e) == kernel_status::ok);
        BOOST_TEST(t4::word_norm(from_load) > 0);
        BOOST_TEST(t4::compare_or_dump(from_serving, from_load, "serving_dequant", s) == -1);
      }
  // f16 scales and arbitrary codes: the dequantizer must read the same 16-bit word either way.
  const int4_shape s{2, 128, 256, 64};
  load_tensors in{random_bits<int32_t>(ct_weight_packed_words(s), 31), {}, random_bits<int32_t>(ct_zero_point_words(s), 33)};
  in.scale.resize(ct_scale_count(s));
  t4::rng r(32);
  for (auto& x : in.scale)
    x = float_to_f16(static_cast<float>(0.001 + 0.01 * r.uniform()));
  auto served = repack(s, true, zero_point_layout::standard, in);
  std::vector<uint16_t> a(s.batch * s.n * s.k), b(a.size());
  ct_dequant_args d{s, true, zero_point_layout::standard, int4_scale_type::f16, in.packed.data(), in.scale.data(),
                    in.zp.data(), a.data()};
  serving_dequant_args e{s, true, int4_scale_type::f16, served.weight.data(), served.scale.data(), served.zp.data(),
                         b.data()};
  BOOST_REQUIRE(ct_dequant_ref(d) == kernel_status::ok);
  BOOST_REQUIRE(serving_dequant_ref(e) == kernel_status::ok);
  BOOST_TEST(t4::word_norm(a) > 0);
  BOOST_TEST(a == b);
}

BOOST_AUTO_TEST_CASE(partial_update_leaves_untouched_tensor_bit_identical) {
  // Two experts' w13 in serving form; the trainer updates only tensor A. Restore both, load A,
  // process both: B's serving bytes must not change.
  const int4_shape s{1, 128, 256, 128};
  auto a0 = repack(s, true, zero_point_layout::miles, quantized(s, int4_recipe::asym, zero_point_layout::miles, 1));
  auto b0 = repack(s, true, zero_point_layout::miles, quantized(s, int4_recipe::asym, zero_point_layout::miles, 2));
  auto a_load = restore(s, true, zero_point_layout::miles, a0);
  auto b_load = restore(s, true, zero_point_layout::miles, b0);
  a_load = quantized(s, int4_recipe::asym, zero_point_layout::miles, 3); // the update
  auto a1 = repack(s, true, zero_point_layout::miles, a_load);
  auto b1 = repack(s, true, zero_point_layout::miles, b_load);
  BOOST_TEST(b1.weight == b0.weight);
  BOOST_TEST(b1.scale == b0.scale);
  BOOST_TEST(b1.zp == b0.zp);
  BOOST_TEST(a1.weight != a0.weight);
}

BOOST_AUTO_TEST_CASE(shapes_the_tiles_cannot_hold_are_sentences) {
  std::vector<int32_t> w(1 << 16);
  std::vector<uint16_t> sc(1 << 16);
  auto repack_error = [&](int4_shape s, bool asym) {
    serving_repack_args a{s, asym, zero_point_layout::standard, w.data(), sc.data(), asym ? w.data() : nullptr,
                          w.data() + (1 << 15), sc.data() + (1 << 15), asym ? w.data() + (1 << 14) : nullptr};
    auto st = serving_repack(a, "model.layers.1.mlp.experts.0.down_proj");
    BOOST_TEST((serving_repack_can_implement(a) == kernel_status::invalid_problem));
    return st ? std::string("(ok)") : st.error();
  };
  BOOST_TEST(repack_error({1, 96, 128, 32}, false) ==
             "model.layers.1.mlp.experts.0.down_proj: serving repack: n (output features) = 96 is not a multiple "
             "of 64 (the serving layout stores 16 (k) x 64 (n) tiles)");
  BOOST_TEST(repack_error({1, 64, 40, k_int4_channel}, true) ==
             "model.layers.1.mlp.experts.0.down_proj: serving repack: k (input features) = 40 is not a multiple "
             "of 16 (the serving layout stores 16 (k) x 64 (n) tiles)");
  BOOST_TEST(repack_error({1, 64, 96, 64}, true).find("k (input features) = 96 is not a multiple of the group size 64") !=
             std::string::npos);
  BOOST_TEST(repack_error({1, 64, 144, 48}, false).find("group size 48 is not supported") != std::string::npos);
  BOOST_TEST(repack_error({1, 64, 128, 0}, false).find("group size 0 is not supported") != std::string::npos);

  serving_restore_args r{{1, 64, 128, 32}, true, zero_point_layout::miles, w.data(), sc.data(), nullptr,
                         w.data() + 4096, sc.data() + 4096, w.data() + 8192};
  BOOST_TEST(serving_restore(r, "x").error() ==
             "x: serving restore: asymmetric weights need the serving zero points and a weight_zero_point buffer");
  BOOST_TEST((serving_restore_can_implement(r) == kernel_status::invalid_problem));
  r.shape.n = 320 + 8;
  BOOST_TEST(serving_restore(r, "x").error().find("n (output features) = 328 is not a multiple of 64") !=
             std::string::npos);
  serving_dequant_args d;
  d.shape = {1, 64, 128, 32};
  BOOST_TEST((serving_dequant_ref(d) == kernel_status::invalid_problem));
#ifndef RLSERVE_HAVE_CUDA
  serving_repack_args a{};
  BOOST_TEST((serving_repack_launch(a, nullptr) == kernel_status::not_supported));
#endif
}

BOOST_AUTO_TEST_SUITE_END()
