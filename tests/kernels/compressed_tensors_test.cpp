// compressed-tensors pack-quantized: bit positions by hand, unpack(pack(x)) == x and
// pack(unpack(w)) == w, both zero-point layouts (standard natural order, miles AWQ order), the
// layout detector including the ambiguous square case, shape inference from checkpoint tensors,
// and the reference dequantizer.
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "kernels/compressed_tensors.hpp"
#include "tests/kernels/int4_test_util.hpp"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;

namespace {

std::vector<uint8_t> random_codes(std::size_t count, uint64_t seed) {
  t4::rng r(seed);
  std::vector<uint8_t> c(count);
  for (auto& x : c)
    x = static_cast<uint8_t>(r.below(16));
  return c;
}

std::vector<int32_t> random_words(std::size_t count, uint64_t seed) {
  t4::rng r(seed);
  std::vector<int32_t> w(count);
  for (auto& x : w)
    x = static_cast<int32_t>(static_cast<uint32_t>(r.next()));
  return w;
}

std::string detect_error(std::vector<int64_t> zp_shape, int4_shape s, zero_point_layout_hint h) {
  auto r = detect_zero_point_layout(zp_shape, s, h, "m.w");
  return r ? std::string("(ok: ") + std::string(to_string(*r)) + ")" : r.error();
}

} // namespace

BOOST_AUTO_TEST_SUITE(compressed_tensors_test)

BOOST_AUTO_TEST_CASE(weight_packing_lowest_nibble_is_lowest_k) {
  std::vector<uint8_t> codes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  std::vector<int32_t> packed(2, 0x5D5D5D5D);
  BOOST_REQUIRE(ct_pack_weight_ref(codes.data(), packed.data(), 1, 16) == kernel_status::ok);
  BOOST_TEST(static_cast<uint32_t>(packed[0]) == 0x76543210u);
  BOOST_TEST(static_cast<uint32_t>(packed[1]) == 0xFEDCBA98u);
  BOOST_TEST(packed[1] < 0); // code 15 in slot 7 sets the int32 sign bit: fine, it is a bit field
  std::vector<uint8_t> back(16, 0xD5);
  BOOST_REQUIRE(ct_unpack_weight_ref(packed.data(), back.data(), 1, 16) == kernel_status::ok);
  BOOST_TEST(back == codes);
}

BOOST_AUTO_TEST_CASE(weight_pack_roundtrips_and_rejects_bad_input) {
  for (auto [rows, k] : {std::pair<int64_t, int64_t>{1, 8}, {3, 64}, {17, 136}}) {
    auto codes = random_codes(static_cast<std::size_t>(rows * k), static_cast<uint64_t>(rows * k));
    std::vector<int32_t> packed(static_cast<std::size_t>(rows * k / 8));
    t4::poison(packed);
    BOOST_REQUIRE(ct_pack_weight_ref(codes.data(), packed.data(), rows, k) == kernel_status::ok);
    BOOST_TEST(!t4::all_poison(packed));
    std::vector<uint8_t> back(codes.size(), 0xD5);
    BOOST_REQUIRE(ct_unpack_weight_ref(packed.data(), back.data(), rows, k) == kernel_status::ok);
    BOOST_TEST(back == codes);
    // And from arbitrary words: pack(unpack(w)) == w.
    auto words = random_words(packed.size(), 99);
    BOOST_REQUIRE(ct_unpack_weight_ref(words.data(), back.data(), rows, k) == kernel_status::ok);
    BOOST_REQUIRE(ct_pack_weight_ref(back.data(), packed.data(), rows, k) == kernel_status::ok);
    BOOST_TEST(packed == words);
  }
  std::vector<uint8_t> codes(16, 3);
  std::vector<int32_t> packed(2);
  BOOST_TEST((ct_pack_weight_ref(codes.data(), packed.data(), 1, 12) == kernel_status::invalid_problem));
  codes[5] = 16;
  BOOST_TEST((ct_pack_weight_ref(codes.data(), packed.data(), 1, 16) == kernel_status::invalid_problem));
  BOOST_TEST((ct_unpack_weight_ref(nullptr, codes.data(), 1, 16) == kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_CASE(zero_point_layouts_by_hand) {
  // n = 8 rows, k = 64, G = 32: two groups; zp(n, g) = n + 8g, all distinct.
  const int4_shape s{1, 8, 64, 32};
  std::vector<uint8_t> zp(16);
  for (int n = 0; n < 8; ++n)
    for (int g = 0; g < 2; ++g)
      zp[n * 2 + g] = static_cast<uint8_t>(n + 8 * g);
  std::vector<int32_t> standard(2), miles(2);
  BOOST_REQUIRE(ct_pack_zero_point_ref(zp.data(), standard.data(), s, zero_point_layout::standard) ==
                kernel_status::ok);
  // standard [n/8, k/G] = [1, 2]: word (0, g) holds rows 0..7 in natural order.
  BOOST_TEST(static_cast<uint32_t>(standard[0]) == 0x76543210u);
  BOOST_TEST(static_cast<uint32_t>(standard[1]) == 0xFEDCBA98u);
  BOOST_REQUIRE(ct_pack_zero_point_ref(zp.data(), miles.data(), s, zero_point_layout::miles) ==
                kernel_status::ok);
  // miles [k/G, n/8] = [2, 1]: slot s holds row [0,2,4,6,1,3,5,7][s].
  BOOST_TEST(static_cast<uint32_t>(miles[0]) == 0x75316420u);
  BOOST_TEST(static_cast<uint32_t>(miles[1]) == 0xFDB9ECA8u);
}

BOOST_AUTO_TEST_CASE(zero_point_roundtrips_and_conversions) {
  for (int4_shape s : {int4_shape{1, 64, 256, 128}, int4_shape{3, 24, 96, 32}, int4_shape{2, 128, 64, 64},
                       int4_shape{2, 16, 48, k_int4_channel}}) {
    const auto count = static_cast<std::size_t>(s.batch * s.n * int4_groups(s));
    auto zp = random_codes(count, static_cast<uint64_t>(s.n));
    std::vector<int32_t> standard(ct_zero_point_words(s)), miles(ct_zero_point_words(s)),
      converted(ct_zero_point_words(s));
    t4::poison(standard);
    t4::poison(miles);
    BOOST_REQUIRE(ct_pack_zero_point_ref(zp.data(), standard.data(), s, zero_point_layout::standard) ==
                  kernel_status::ok);
    BOOST_REQUIRE(ct_pack_zero_point_ref(zp.data(), miles.data(), s, zero_point_layout::miles) ==
                  kernel_status::ok);
    BOOST_TEST(t4::word_norm(standard) > 0);
    for (auto [words, layout] : {std::pair{&standard, zero_point_layout::standard}, {&miles, zero_point_layout::miles}}) {
      std::vector<uint8_t> back(count, 0xD5);
      BOOST_REQUIRE(ct_unpack_zero_point_ref(words->data(), back.data(), s, layout) == kernel_status::ok);
      BOOST_TEST(back == zp);
    }
    t4::poison(converted);
    BOOST_REQUIRE(ct_convert_zero_point_ref(standard.data(), zero_point_layout::standard, converted.data(),
                                            zero_point_layout::miles, s) == kernel_status::ok);
    BOOST_TEST(converted == miles);
    BOOST_REQUIRE(ct_convert_zero_point_ref(miles.data(), zero_point_layout::miles, converted.data(),
                                            zero_point_layout::standard, s) == kernel_status::ok);
    BOOST_TEST(converted == standard);
    if (s.n / 8 != int4_groups(s))
      BOOST_TEST(standard != miles); // the layouts really differ
  }
  const int4_shape bad{1, 12, 64, 32}; // zero points need n % 8 == 0
  std::vector<uint8_t> zp(64);
  std::vector<int32_t> out(64);
  BOOST_TEST((ct_pack_zero_point_ref(zp.data(), out.data(), bad, zero_point_layout::standard) ==
              kernel_status::invalid_problem));
  zp.assign(64, 16);
  BOOST_TEST((ct_pack_zero_point_ref(zp.data(), out.data(), {1, 8, 64, 32}, zero_point_layout::standard) ==
              kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_CASE(layout_detection_from_shapes_and_hints) {
  using h = zero_point_layout_hint;
  const int4_shape s{1, 256, 512, 128}; // standard [32, 4], miles [4, 32]
  BOOST_TEST(detect_error({32, 4}, s, h::auto_detect) == "(ok: standard)");
  BOOST_TEST(detect_error({4, 32}, s, h::auto_detect) == "(ok: miles)");
  BOOST_TEST(detect_error({32, 4}, s, h::standard) == "(ok: standard)");
  BOOST_TEST(detect_error({4, 32}, s, h::miles) == "(ok: miles)");
  BOOST_TEST(detect_error({4, 32}, s, h::standard) ==
             "m.w: weight_zero_point has shape [4, 32], but the configuration says the standard [n/8, k/G] = [32, 4]");
  BOOST_TEST(detect_error({32, 4}, s, h::miles) ==
             "m.w: weight_zero_point has shape [32, 4], but the configuration says the miles [k/G, n/8] = [4, 32]");
  BOOST_TEST(detect_error({16, 8}, s, h::auto_detect) ==
             "m.w: weight_zero_point has shape [16, 8], which is neither the standard [n/8, k/G] = [32, 4] nor the "
             "miles [k/G, n/8] = [4, 32] layout");
  BOOST_TEST(detect_error({32}, s, h::auto_detect).find("expected 2 dimensions") != std::string::npos);

  // Square: n/8 == k/G (64/8 == 256/32 == 8): both fit, a hint is required.
  const int4_shape sq{1, 64, 256, 32};
  BOOST_TEST(detect_error({8, 8}, sq, h::auto_detect) ==
             "m.w: weight_zero_point has shape [8, 8], which fits both the standard [n/8, k/G] = [8, 8] and the "
             "miles [k/G, n/8] = [8, 8] (n/8 == k/G); the zero-point layout must be given explicitly (standard or "
             "miles)");
  BOOST_TEST(detect_error({8, 8}, sq, h::miles) == "(ok: miles)");
  BOOST_TEST(detect_error({8, 8}, sq, h::standard) == "(ok: standard)");

  // Experts first.
  const int4_shape e{4, 256, 512, 128};
  BOOST_TEST(detect_error({4, 4, 32}, e, h::auto_detect) == "(ok: miles)");
  BOOST_TEST(detect_error({3, 4, 32}, e, h::auto_detect) ==
             "m.w: weight_zero_point has shape [3, 4, 32], but there are 4 experts");
  BOOST_TEST(detect_error({4, 32}, e, h::auto_detect).find("without an experts dimension") != std::string::npos);
  // A shape the format cannot hold at all.
  BOOST_TEST(detect_error({1, 4}, int4_shape{1, 12, 512, 128}, h::auto_detect).find("n (output features) = 12") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(shape_inference_from_checkpoint_tensors) {
  auto ok = ct_infer_shape(std::vector<int64_t>{256, 64}, std::vector<int64_t>{256, 4}, 256, 512, 128, "m");
  BOOST_REQUIRE(ok.has_value());
  BOOST_TEST(ok->batch == 1);
  BOOST_TEST(ok->n == 256);
  BOOST_TEST(ok->group_size == 128);
  auto experts = ct_infer_shape(std::vector<int64_t>{8, 256, 64}, std::vector<int64_t>{8, 256, 1}, 256, 512,
                                k_int4_channel, "m");
  BOOST_REQUIRE(experts.has_value());
  BOOST_TEST(experts->batch == 8);
  auto bad_packed = ct_infer_shape(std::vector<int64_t>{256, 32}, std::vector<int64_t>{256, 4}, 256, 512, 128, "m");
  BOOST_TEST(bad_packed.error() == "m: weight_packed has shape [256, 32], but weight_shape (256, 512) needs [256, 64]");
  auto bad_scale = ct_infer_shape(std::vector<int64_t>{256, 64}, std::vector<int64_t>{256, 8}, 256, 512, 128, "m");
  BOOST_TEST(bad_scale.error() ==
             "m: weight_scale has shape [256, 8], but n = 256, k = 512 and group size 128 need [256, 4]");
  auto bad_group = ct_infer_shape(std::vector<int64_t>{256, 64}, std::vector<int64_t>{256, 4}, 256, 512, 48, "m");
  BOOST_TEST(bad_group.error().find("m: group size 48 is not supported") == 0u);
  auto bad_rank = ct_infer_shape(std::vector<int64_t>{16384}, std::vector<int64_t>{256, 4}, 256, 512, 128, "m");
  BOOST_TEST(bad_rank.error().find("expected [n, k/8] or [experts, n, k/8]") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(dequant_by_hand_sym_asym_and_f16_scales) {
  // One row, k = 32, G = 32. Codes 0..15 twice; scale 0.5.
  std::vector<uint8_t> codes(32);
  for (int i = 0; i < 32; ++i)
    codes[i] = static_cast<uint8_t>(i % 16);
  std::vector<int32_t> packed(4);
  BOOST_REQUIRE(ct_pack_weight_ref(codes.data(), packed.data(), 1, 32) == kernel_status::ok);
  std::vector<uint16_t> scale = {float_to_bf16(0.5f)};
  std::vector<uint16_t> out(32, 0xD5D5);
  ct_dequant_args d;
  d.shape = {1, 1, 32, 32};
  d.weight_packed = packed.data();
  d.weight_scale = scale.data();
  d.out = out.data();
  BOOST_REQUIRE(ct_dequant_ref(d) == kernel_status::ok);
  for (int i = 0; i < 32; ++i)
    BOOST_TEST(bf16_to_float(out[i]) == 0.5f * static_cast<float>(i % 16 - 8));
  // Asymmetric, 8 rows so the zero point word is whole; row r has zero point r.
  std::vector<uint8_t> codes8(8 * 32);
  for (int i = 0; i < 8 * 32; ++i)
    codes8[i] = static_cast<uint8_t>(i % 16);
  std::vector<int32_t> packed8(32);
  BOOST_REQUIRE(ct_pack_weight_ref(codes8.data(), packed8.data(), 8, 32) == kernel_status::ok);
  std::vector<uint16_t> scale8(8, float_to_f16(0.25f));
  std::vector<uint8_t> zp = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int32_t> zpw(1);
  const int4_shape s{1, 8, 32, 32};
  BOOST_REQUIRE(ct_pack_zero_point_ref(zp.data(), zpw.data(), s, zero_point_layout::miles) == kernel_status::ok);
  std::vector<uint16_t> out8(8 * 32, 0xD5D5);
  d.shape = s;
  d.has_zero_point = true;
  d.zp_layout = zero_point_layout::miles;
  d.scale_type = int4_scale_type::f16;
  d.weight_packed = packed8.data();
  d.weight_scale = scale8.data();
  d.weight_zero_point = zpw.data();
  d.out = out8.data();
  BOOST_REQUIRE(ct_dequant_ref(d) == kernel_status::ok);
  for (int r = 0; r < 8; ++r)
    for (int i = 0; i < 32; ++i)
      BOOST_TEST(bf16_to_float(out8[r * 32 + i]) == 0.25f * static_cast<float>((r * 32 + i) % 16 - r));
  d.weight_zero_point = nullptr;
  BOOST_TEST((ct_dequant_ref(d) == kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_SUITE_END()
