// The index maps of kernels/int4_format.hpp: forward and inverse maps are bijections and inverse
// to each other, they agree with Marlin's published permutation tables, and the shape checks say
// which dimension is wrong and which multiple it needs.
#include <boost/test/unit_test.hpp>

#include <set>
#include <utility>

#include "kernels/int4_format.hpp"
#include "tests/kernels/int4_test_util.hpp"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;

BOOST_AUTO_TEST_SUITE(int4_format_test)

BOOST_AUTO_TEST_CASE(interleave_is_the_awq_order_and_its_inverse) {
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int s = 0; s < 8; ++s) {
    BOOST_TEST(int4_interleave(s) == order[s]);
    BOOST_TEST(int4_interleave_slot(order[s]) == s);
  }
}

BOOST_AUTO_TEST_CASE(nibble_helpers_touch_only_their_slot) {
  uint32_t w = 0xD5D5D5D5u;
  w = int4_put_nibble(w, 3, 0xA);
  BOOST_TEST(w == 0xD5D5A5D5u);
  BOOST_TEST(int4_get_nibble(w, 3) == 0xAu);
  BOOST_TEST(int4_get_nibble(w, 0) == 0x5u);
  BOOST_TEST(int4_get_nibble(0x76543210u, 7) == 7u);
}

BOOST_AUTO_TEST_CASE(serving_weight_maps_are_inverse_bijections) {
  for (auto [k, n] : {std::pair<int64_t, int64_t>{16, 64}, {32, 128}, {48, 192}, {128, 64}}) {
    std::set<std::pair<int64_t, int>> seen;
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t nn = 0; nn < n; ++nn) {
        int slot = -1;
        int64_t word = serving_weight_word(kk, nn, n, &slot);
        BOOST_REQUIRE(word >= 0);
        BOOST_REQUIRE(word < k * n / 8);
        BOOST_REQUIRE(slot >= 0);
        BOOST_REQUIRE(slot < 8);
        seen.insert({word, slot});
        int64_t k2 = -1, n2 = -1;
        serving_weight_source(word, int4_interleave(slot), n, &k2, &n2);
        BOOST_REQUIRE(k2 == kk);
        BOOST_REQUIRE(n2 == nn);
      }
    BOOST_TEST(static_cast<int64_t>(seen.size()) == k * n); // every (word, slot) used once
  }
}

BOOST_AUTO_TEST_CASE(serving_word_is_one_mma_lane_fragment) {
  // Lane 5 of tile (0, 0), n16 block j = 2: c = 1, r = 2 -> k rows 2, 3, 10, 11 at columns
  // 16*2 + 1 = 33 and 41 (the B fragment of mma.sync m16n8k16 for two n8 tiles).
  const int64_t word = 4 * 5 + 2;
  const int64_t want_k[8] = {2, 3, 10, 11, 2, 3, 10, 11};
  const int64_t want_n[8] = {33, 33, 33, 33, 41, 41, 41, 41};
  for (int e = 0; e < 8; ++e) {
    int64_t k = 0, n = 0;
    serving_weight_source(word, e, 128, &k, &n);
    BOOST_TEST(k == want_k[e]);
    BOOST_TEST(n == want_n[e]);
  }
  // Second k-slab of a 128-wide matrix: word 2n = 256 starts tile (1, 0).
  int64_t k = 0, n = 0;
  serving_weight_source(256, 0, 128, &k, &n);
  BOOST_TEST(k == 16);
  BOOST_TEST(n == 0);
  serving_weight_source(128, 0, 128, &k, &n); // tile (0, 1)
  BOOST_TEST(k == 0);
  BOOST_TEST(n == 64);
}

BOOST_AUTO_TEST_CASE(scale_maps_match_marlin_tables) {
  const int64_t n = 256;
  std::vector<uint16_t> cols(n);
  for (int64_t i = 0; i < n; ++i)
    cols[i] = static_cast<uint16_t>(i);
  for (bool grouped : {true, false}) {
    auto marlin = t4::marlin_permute_scales(cols, 1, n, grouped);
    for (int64_t p = 0; p < n; ++p) {
      BOOST_TEST(serving_scale_source(p, !grouped) == marlin[p]);
      BOOST_TEST(serving_scale_position(marlin[p], !grouped) == p);
    }
  }
}

BOOST_AUTO_TEST_CASE(zero_point_maps_match_marlin_zero_points) {
  const int64_t n = 192;
  std::vector<uint8_t> zp(n);
  for (int64_t i = 0; i < n; ++i)
    zp[i] = static_cast<uint8_t>(i % 16); // column id mod 16, distinct inside every word
  auto marlin = t4::marlin_zero_points(zp, 1, n);
  for (int64_t m = 0; m < n / 8; ++m)
    for (int s = 0; s < 8; ++s) {
      const int64_t col = serving_zp_source(m, s);
      BOOST_TEST(int4_get_nibble(static_cast<uint32_t>(marlin[m]), s) == static_cast<uint32_t>(col % 16));
      int slot = -1;
      BOOST_TEST(serving_zp_word(col, &slot) == m);
      BOOST_TEST(slot == s);
    }
}

BOOST_AUTO_TEST_CASE(load_zero_point_maps) {
  int slot = -1;
  BOOST_TEST(ct_zp_standard_word(13, 2, 4, &slot) == 1 * 4 + 2);
  BOOST_TEST(slot == 5);
  // miles: n % 8 = 2 is logical element 2, held by slot 1 ([0,2,4,...][1] == 2).
  BOOST_TEST(ct_zp_miles_word(10, 3, 64, &slot) == 3 * 8 + 1);
  BOOST_TEST(slot == 1);
  BOOST_TEST(ct_zp_miles_word(9, 0, 64, &slot) == 1);
  BOOST_TEST(slot == 4);
}

BOOST_AUTO_TEST_CASE(shape_checks_name_dimension_and_multiple) {
  auto load = [](int64_t b, int64_t n, int64_t k, int32_t g, bool zp) {
    return int4_check_load_shape(int4_shape{b, n, k, g}, zp);
  };
  BOOST_TEST(load(1, 64, 128, 128, true).empty());
  BOOST_TEST(load(1, 12, 128, 32, false).empty()); // symmetric: n needs no multiple
  BOOST_TEST(load(1, 64, 256, k_int4_channel, true).empty());
  BOOST_TEST(load(1, 64, 128, 0, false).find("group size 0 is not supported") != std::string::npos);
  BOOST_TEST(load(1, 64, 144, 48, false).find("group size 48 is not supported") != std::string::npos);
  BOOST_TEST(load(1, 64, 100, 32, false).find("k (input features) = 100 is not a multiple of 8") !=
             std::string::npos);
  BOOST_TEST(load(1, 64, 96, 64, false).find("k (input features) = 96 is not a multiple of the group size 64") !=
             std::string::npos);
  BOOST_TEST(load(1, 12, 128, 32, true).find("n (output features) = 12 is not a multiple of 8") !=
             std::string::npos);
  BOOST_TEST(load(0, 64, 128, 32, false).find("batch = 0") != std::string::npos);
  BOOST_TEST(load(1, 0, 128, 32, false).find("n (output features) = 0") != std::string::npos);
  BOOST_TEST(load(1, 64, -8, 32, false).find("k (input features) = -8") != std::string::npos);
  BOOST_TEST(load(int64_t{1} << 30, 1 << 20, 1 << 20, 32, false).find("too large") != std::string::npos);

  auto serving = [](int64_t n, int64_t k, int32_t g) { return int4_check_serving_shape(int4_shape{1, n, k, g}); };
  BOOST_TEST(serving(64, 128, 32).empty());
  BOOST_TEST(serving(128, 16, k_int4_channel).empty());
  BOOST_TEST(serving(100, 128, 32).find("n (output features) = 100 is not a multiple of 64") != std::string::npos);
  BOOST_TEST(serving(96, 128, 32).find("n (output features) = 96 is not a multiple of 64") != std::string::npos);
  BOOST_TEST(serving(64, 40, k_int4_channel).find("k (input features) = 40 is not a multiple of 16") !=
             std::string::npos);
  BOOST_TEST(serving(64, 128, 48).find("group size 48") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(groups_and_counts) {
  int4_shape s{3, 128, 256, 64};
  BOOST_TEST(int4_groups(s) == 4);
  BOOST_TEST(int4_group_len(s) == 64);
  BOOST_TEST(ct_weight_packed_words(s) == 3 * 128 * 32);
  BOOST_TEST(ct_scale_count(s) == 3 * 128 * 4);
  BOOST_TEST(ct_zero_point_words(s) == 3 * 16 * 4);
  BOOST_TEST(serving_weight_words(s) == 3 * 16 * 256);
  BOOST_TEST(serving_zero_point_words(s) == 3 * 4 * 16);
  s.group_size = k_int4_channel;
  BOOST_TEST(int4_groups(s) == 1);
  BOOST_TEST(int4_group_len(s) == 256);
}

BOOST_AUTO_TEST_CASE(names_parse_back) {
  for (auto r : {int4_recipe::sym_qat, int4_recipe::sym, int4_recipe::asym})
    BOOST_TEST((parse_int4_recipe(to_string(r)) == r));
  for (auto l : {zero_point_layout::standard, zero_point_layout::miles})
    BOOST_TEST((parse_zero_point_layout(to_string(l)) == l));
  BOOST_TEST(!parse_int4_recipe("int4").has_value());
  BOOST_TEST(!parse_zero_point_layout("awq").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
