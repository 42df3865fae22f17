// CUDA repack / restore vs the CPU twins, byte for byte, over random bits (any bits are valid:
// both directions are permutations) for every group size, sym/asym and both zero-point layouts,
// plus restore(repack(x)) == x entirely on the device and the bad-shape messages. The device
// kernels gather through the other direction of the index maps than the CPU twins scatter, so
// agreement also checks the forward and inverse maps against each other. Needs a GPU.
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "kernels/serving_layout.hpp"
#include "tests/support/device_buffer.cuh"
#include "tests/kernels/int4_test_util.hpp"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;

namespace {

constexpr int32_t k_group_sizes[] = {32, 64, 128, k_int4_channel};

template <class T>
std::vector<T> random_bits(std::size_t count, uint64_t seed) {
  t4::rng r(seed);
  std::vector<T> v(count);
  for (auto& x : v)
    x = static_cast<T>(r.next());
  return v;
}

void check_shape(const int4_shape& s, bool asym, zero_point_layout layout, uint64_t seed) {
  // Load format -> serving: CPU vs GPU.
  auto packed = random_bits<int32_t>(ct_weight_packed_words(s), seed);
  auto scale = random_bits<uint16_t>(ct_scale_count(s), seed + 1);
  auto zp = asym ? random_bits<int32_t>(ct_zero_point_words(s), seed + 2) : std::vector<int32_t>{};
  std::vector<int32_t> sw(serving_weight_words(s)), sz(asym ? serving_zero_point_words(s) : 0);
  std::vector<uint16_t> ss(serving_scale_count(s));
  serving_repack_args cpu{s, asym, layout, packed.data(), scale.data(), asym ? zp.data() : nullptr,
                          sw.data(), ss.data(), asym ? sz.data() : nullptr};
  BOOST_REQUIRE(serving_repack_ref(cpu) == kernel_status::ok);

  rlserve::test::device_buffer<int32_t> dp(packed), dz(zp), dsw(sw.size()), dsz(sz.size());
  rlserve::test::device_buffer<uint16_t> ds(scale), dss(ss.size());
  serving_repack_args gpu{s, asym, layout, dp.get(), ds.get(), asym ? dz.get() : nullptr,
                          dsw.get(), dss.get(), asym ? dsz.get() : nullptr};
  BOOST_REQUIRE(serving_repack_device(gpu, "t", nullptr).has_value());
  BOOST_TEST(t4::compare_or_dump(dsw.download(), sw, "gpu_repack_weight", s) == -1);
  BOOST_TEST(t4::compare_or_dump(dss.download(), ss, "gpu_repack_scale", s) == -1);
  BOOST_TEST(t4::compare_or_dump(dsz.download(), sz, "gpu_repack_zp", s) == -1);

  // restore on the device of what the device repacked: the original bits.
  rlserve::test::device_buffer<int32_t> rp(packed.size()), rz(zp.size());
  rlserve::test::device_buffer<uint16_t> rs(scale.size());
  serving_restore_args back{s, asym, layout, dsw.get(), dss.get(), asym ? dsz.get() : nullptr,
                            rp.get(), rs.get(), asym ? rz.get() : nullptr};
  BOOST_REQUIRE(serving_restore_device(back, "t", nullptr).has_value());
  BOOST_TEST(t4::compare_or_dump(rp.download(), packed, "gpu_restore_weight", s) == -1);
  BOOST_TEST(t4::compare_or_dump(rs.download(), scale, "gpu_restore_scale", s) == -1);
  BOOST_TEST(t4::compare_or_dump(rz.download(), zp, "gpu_restore_zp", s) == -1);

  // Serving -> load format from arbitrary serving bits: CPU vs GPU.
  auto ysw = random_bits<int32_t>(sw.size(), seed + 3);
  auto yss = random_bits<uint16_t>(ss.size(), seed + 4);
  auto ysz = random_bits<int32_t>(sz.size(), seed + 5);
  std::vector<int32_t> cp(packed.size()), cz(zp.size());
  std::vector<uint16_t> cs(scale.size());
  serving_restore_args cpu_back{s, asym, layout, ysw.data(), yss.data(), asym ? ysz.data() : nullptr,
                                cp.data(), cs.data(), asym ? cz.data() : nullptr};
  BOOST_REQUIRE(serving_restore_ref(cpu_back) == kernel_status::ok);
  dsw.upload(ysw);
  dss.upload(yss);
  dsz.upload(ysz);
  rp.poison();
  rs.poison();
  rz.poison();
  BOOST_REQUIRE(serving_restore_launch(back, nullptr) == kernel_status::ok);
  BOOST_TEST(t4::word_norm(cp) > 0);
  BOOST_TEST(t4::compare_or_dump(rp.download(), cp, "gpu_restore_weight_any", s) == -1);
  BOOST_TEST(t4::compare_or_dump(rs.download(), cs, "gpu_restore_scale_any", s) == -1);
  BOOST_TEST(t4::compare_or_dump(rz.download(), cz, "gpu_restore_zp_any", s) == -1);
}

} // namespace

BOOST_AUTO_TEST_SUITE(serving_layout_gpu_test)

BOOST_AUTO_TEST_CASE(repack_and_restore_match_cpu_over_the_sweep) {
  rlserve::test::require_device();
  t4::rng pick(303);
  int cases = 0;
  for (int32_t g : k_group_sizes)
    for (int asym = 0; asym < 2; ++asym)
      for (auto layout : {zero_point_layout::standard, zero_point_layout::miles})
        for (int rep = 0; rep < 4; ++rep) {
          if (!asym && layout == zero_point_layout::miles)
            continue;
          int4_shape s;
          s.batch = 1 + pick.below(4);
          s.n = 64 * (1 + pick.below(6));
          s.k = g == k_int4_channel ? 16 * (1 + pick.below(100)) : g * (1 + pick.below(8));
          s.group_size = g;
          check_shape(s, asym, layout, 1000 + 10 * cases);
          ++cases;
        }
  BOOST_TEST(cases == 4 * 3 * 4);
  // Square zero-point case (n/8 == k/G) in both layouts, and Qwen3-30B-A3B expert shapes.
  check_shape({2, 64, 256, 32}, true, zero_point_layout::standard, 1);
  check_shape({2, 64, 256, 32}, true, zero_point_layout::miles, 2);
  check_shape({8, 1536, 2048, 128}, true, zero_point_layout::miles, 3);
  check_shape({8, 2048, 768, 32}, true, zero_point_layout::miles, 4);
}

BOOST_AUTO_TEST_CASE(bad_shapes_fail_before_launch) {
  rlserve::test::require_device();
  rlserve::test::device_buffer<int32_t> a(1 << 14), b(1 << 14), z(1 << 10), y(1 << 10);
  rlserve::test::device_buffer<uint16_t> s(1 << 12), t(1 << 12);
  serving_repack_args r{{1, 96, 128, 32}, true, zero_point_layout::standard, a.get(), s.get(), z.get(),
                        b.get(), t.get(), y.get()};
  BOOST_TEST((serving_repack_launch(r, nullptr) == kernel_status::invalid_problem));
  BOOST_TEST(serving_repack_device(r, "t", nullptr).error() ==
             "t: serving repack: n (output features) = 96 is not a multiple of 64 (the serving layout stores 16 "
             "(k) x 64 (n) tiles)");
  serving_restore_args q{{1, 64, 40, k_int4_channel}, false, zero_point_layout::standard, a.get(), s.get(),
                         nullptr, b.get(), t.get(), nullptr};
  BOOST_TEST((serving_restore_launch(q, nullptr) == kernel_status::invalid_problem));
  BOOST_TEST(serving_restore_device(q, "t", nullptr).error().find("k (input features) = 40 is not a multiple of 16") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(throughput_is_reported) {
  // Informational: repack and restore of one layer's experts (Qwen3-30B-A3B w13, 128 x 1536 x 2048,
  // asym g128): bytes read + written per second.
  rlserve::test::require_device();
  const int4_shape s{128, 1536, 2048, 128};
  rlserve::test::device_buffer<int32_t> packed(ct_weight_packed_words(s)), zp(ct_zero_point_words(s));
  rlserve::test::device_buffer<uint16_t> scale(ct_scale_count(s)), sscale(serving_scale_count(s));
  rlserve::test::device_buffer<int32_t> sw(serving_weight_words(s)), sz(serving_zero_point_words(s));
  serving_repack_args r{s, true, zero_point_layout::miles, packed.get(), scale.get(), zp.get(), sw.get(), sscale.get(), sz.get()};
  serving_restore_args b{s, true, zero_point_layout::miles, sw.get(), sscale.get(), sz.get(), packed.get(), scale.get(), zp.get()};
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const double bytes = 2.0 * (4.0 * ct_weight_packed_words(s) + 2.0 * ct_scale_count(s) + 4.0 * ct_zero_point_words(s));
  for (int dir = 0; dir < 2; ++dir) {
    auto launch = [&] { return dir == 0 ? serving_repack_launch(r, nullptr) : serving_restore_launch(b, nullptr); };
    for (int i = 0; i < 3; ++i)
      BOOST_REQUIRE(launch() == kernel_status::ok);
    cudaEventRecord(start);
    for (int i = 0; i < 10; ++i)
      BOOST_REQUIRE(launch() == kernel_status::ok);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    const double us = 100.0 * ms;
    BOOST_TEST_MESSAGE((dir == 0 ? "serving repack" : "serving restore") << " 128 experts 1536x2048 g128 asym: " << us
                       << " us, " << bytes / us / 1e3 << " GB/s read+write");
    BOOST_TEST(us > 0);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

BOOST_AUTO_TEST_SUITE_END()
