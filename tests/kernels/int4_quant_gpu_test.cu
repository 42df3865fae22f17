// CUDA quantization vs the CPU reference, byte for byte: load format (codes, bf16 scales, zero
// points in both layouts) and the fused BF16 -> serving kernel, over every recipe x group size,
// awkward shapes (n not a multiple of 64, one row per expert, per-channel with long k), adversarial
// data (ties, denormals, +-0, constant and all-zero groups, the scale floor, huge values), a
// misaligned input pointer, non-finite inputs (same flag index, same message) and bad shapes.
// Needs a GPU (CTest label gpu).
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "kernels/int4_quant.hpp"
#include "tests/support/device_buffer.cuh"
#include "tests/kernels/int4_test_util.hpp"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;

namespace {

constexpr int32_t k_group_sizes[] = {32, 64, 128, k_int4_channel};
constexpr int4_recipe k_recipes[] = {int4_recipe::sym_qat, int4_recipe::sym, int4_recipe::asym};

// Runs CPU and GPU load-format quantization of `w` and compares every output byte. `offset`
// elements of padding in front of the device copy make the input pointer misaligned.
void compare_load(const int4_shape& s, int4_recipe r, zero_point_layout layout,
                  const std::vector<uint16_t>& w, std::size_t offset = 0) {
  const bool asym = r == int4_recipe::asym;
  std::vector<int32_t> packed(ct_weight_packed_words(s)), zp(asym ? ct_zero_point_words(s) : 0);
  std::vector<uint16_t> scale(ct_scale_count(s));
  t4::poison(packed);
  t4::poison(scale);
  t4::poison(zp);
  uint64_t flag = 0;
  int4_quant_args cpu{s, r, layout, w.data(), packed.data(), scale.data(), asym ? zp.data() : nullptr, &flag};
  BOOST_REQUIRE(int4_quantize_ref(cpu) == kernel_status::ok);

  std::vector<uint16_t> padded(offset, 0);
  padded.insert(padded.end(), w.begin(), w.end());
  rlserve::test::device_buffer<uint16_t> dw(padded);
  rlserve::test::device_buffer<int32_t> dp(packed.size()), dz(zp.size());
  rlserve::test::device_buffer<uint16_t> ds(scale.size());
  rlserve::test::device_buffer<uint64_t> dflag(1);
  int4_quant_args gpu{s, r, layout, dw.get() + offset, dp.get(), ds.get(), asym ? dz.get() : nullptr, dflag.get()};
  BOOST_REQUIRE(int4_quantize_launch(gpu, nullptr) == kernel_status::ok);
  const std::string tag = std::string(to_string(r)) + "_" + std::string(to_string(layout));
  BOOST_TEST(t4::word_norm(packed) > 0);
  BOOST_TEST(t4::compare_or_dump(dp.download(), packed, "gpu_packed_" + tag, s) == -1);
  BOOST_TEST(t4::compare_or_dump(ds.download(), scale, "gpu_scale_" + tag, s) == -1);
  BOOST_TEST(t4::compare_or_dump(dz.download(), zp, "gpu_zp_" + tag, s) == -1);
  BOOST_TEST(dflag.download()[0] == flag);
}

void compare_serving(const int4_shape& s, int4_recipe r, const std::vector<uint16_t>& w) {
  const bool asym = r == int4_recipe::asym;
  std::vector<int32_t> sw(serving_weight_words(s)), sz(asym ? serving_zero_point_words(s) : 0);
  std::vector<uint16_t> ss(serving_scale_count(s));
  uint64_t flag = 0;
  int4_quant_serving_args cpu{s, r, w.data(), sw.data(), ss.data(), asym ? sz.data() : nullptr, &flag};
  BOOST_REQUIRE(int4_quantize_serving_ref(cpu) == kernel_status::ok);
  rlserve::test::device_buffer<uint16_t> dw(w);
  rlserve::test::device_buffer<int32_t> dsw(sw.size()), dsz(sz.size());
  rlserve::test::device_buffer<uint16_t> dss(ss.size());
  rlserve::test::device_buffer<uint64_t> dflag(1);
  int4_quant_serving_args gpu{s, r, dw.get(), dsw.get(), dss.get(), asym ? dsz.get() : nullptr, dflag.get()};
  BOOST_REQUIRE(int4_quantize_serving_launch(gpu, nullptr) == kernel_status::ok);
  const std::string tag(to_string(r));
  BOOST_TEST(t4::word_norm(sw) > 0);
  BOOST_TEST(t4::compare_or_dump(dsw.download(), sw, "gpu_serving_weight_" + tag, s) == -1);
  BOOST_TEST(t4::compare_or_dump(dss.download(), ss, "gpu_serving_scale_" + tag, s) == -1);
  BOOST_TEST(t4::compare_or_dump(dsz.download(), sz, "gpu_serving_zp_" + tag, s) == -1);
  BOOST_TEST(dflag.download()[0] == flag);
}

} // namespace

BOOST_AUTO_TEST_SUITE(int4_quant_gpu_test)

BOOST_AUTO_TEST_CASE(load_format_matches_cpu_over_the_sweep) {
  rlserve::test::require_device();
  t4::rng pick(101);
  int cases = 0;
  for (auto r : k_recipes)
    for (int32_t g : k_group_sizes)
      for (auto layout : {zero_point_layout::standard, zero_point_layout::miles}) {
        if (int4_symmetric(r) && layout == zero_point_layout::miles)
          continue;
        // Awkward shapes: one 8-row word, n below / just past a 64-row CTA, batches of experts.
        for (int64_t n : {8, 56, 72, 200}) {
          int4_shape s;
          s.batch = 1 + pick.below(3);
          s.n = n;
          s.k = g == k_int4_channel ? 8 * (1 + pick.below(300)) : g * (1 + pick.below(6));
          s.group_size = g;
          compare_load(s, r, layout, t4::adversarial_weights(s, 5000 + cases));
          compare_load(s, r, layout, t4::gaussian_weights(s.batch * s.n * s.k, 6000 + cases));
          ++cases;
        }
      }
  BOOST_TEST(cases == 16 * 4);
  // Symmetric recipes take any n (no zero points): odd row counts.
  compare_load({2, 3, 256, 128}, int4_recipe::sym, zero_point_layout::standard,
               t4::adversarial_weights({2, 3, 256, 128}, 7));
  compare_load({1, 1, 64, 32}, int4_recipe::sym_qat, zero_point_layout::standard,
               t4::adversarial_weights({1, 1, 64, 32}, 8));
}

BOOST_AUTO_TEST_CASE(misaligned_input_takes_the_scalar_path_and_agrees) {
  rlserve::test::require_device();
  const int4_shape s{2, 64, 512, 128};
  for (std::size_t offset : {1, 4})
    compare_load(s, int4_recipe::asym, zero_point_layout::miles, t4::adversarial_weights(s, 9), offset);
}

BOOST_AUTO_TEST_CASE(fused_serving_matches_cpu_over_the_sweep) {
  rlserve::test::require_device();
  t4::rng pick(202);
  int cases = 0;
  for (auto r : k_recipes)
    for (int32_t g : k_group_sizes)
      for (int rep = 0; rep < 4; ++rep) {
        int4_shape s;
        s.batch = 1 + pick.below(3);
        s.n = 64 * (1 + pick.below(5));
        s.k = g == k_int4_channel ? 16 * (1 + pick.below(200)) : g * (1 + pick.below(8));
        s.group_size = g;
        compare_serving(s, r, rep % 2 ? t4::gaussian_weights(s.batch * s.n * s.k, 7000 + cases)
                                      : t4::adversarial_weights(s, 7000 + cases));
        ++cases;
      }
  BOOST_TEST(cases == 3 * 4 * 4);
  // Qwen3-30B-A3B expert shapes: w13 (2I x H = 1536 x 2048) and w2 (H x I = 2048 x 768), g128/g32.
  compare_serving({2, 1536, 2048, 128}, int4_recipe::asym, t4::gaussian_weights(2 * 1536 * 2048, 1));
  compare_serving({2, 2048, 768, 32}, int4_recipe::asym, t4::gaussian_weights(2 * 2048 * 768, 2));
}

BOOST_AUTO_TEST_CASE(nonfinite_index_and_message_match_cpu) {
  rlserve::test::require_device();
  const int4_shape s{3, 64, 256, 64};
  auto w = t4::gaussian_weights(3 * 64 * 256, 10);
  w[(2 * 64 + 9) * 256 + 130] = 0xff80;  // -Inf
  w[(2 * 64 + 40) * 256 + 3] = 0x7fc0;   // a later NaN
  std::vector<int32_t> packed(ct_weight_packed_words(s)), zp(ct_zero_point_words(s));
  std::vector<uint16_t> scale(ct_scale_count(s));
  int4_quant_args cpu{s, int4_recipe::asym, zero_point_layout::standard, w.data(), packed.data(), scale.data(),
                      zp.data(), nullptr};
  auto cpu_status = int4_quantize(cpu, "experts.w13");
  BOOST_REQUIRE(!cpu_status);

  rlserve::test::device_buffer<uint16_t> dw(w);
  rlserve::test::device_buffer<int32_t> dp(packed.size()), dz(zp.size());
  rlserve::test::device_buffer<uint16_t> ds(scale.size());
  int4_quant_args gpu{s, int4_recipe::asym, zero_point_layout::standard, dw.get(), dp.get(), ds.get(), dz.get(), nullptr};
  auto gpu_status = int4_quantize_device(gpu, "experts.w13", nullptr);
  BOOST_REQUIRE(!gpu_status);
  BOOST_TEST(gpu_status.error() == cpu_status.error());
  BOOST_TEST(gpu_status.error() == "experts.w13: element [2, 9, 130] is -Inf; INT4 quantization needs finite weights");

  rlserve::test::device_buffer<int32_t> dsw(serving_weight_words(s)), dsz(serving_zero_point_words(s));
  rlserve::test::device_buffer<uint16_t> dss(serving_scale_count(s));
  int4_quant_serving_args fused{s, int4_recipe::sym, dw.get(), dsw.get(), dss.get(), nullptr, nullptr};
  auto fused_status = int4_quantize_serving_device(fused, "experts.w13", nullptr);
  BOOST_REQUIRE(!fused_status);
  BOOST_TEST(fused_status.error() == cpu_status.error());

  // Finite input: the device wrapper succeeds and leaves the flag at "all finite".
  rlserve::test::device_buffer<uint16_t> good(t4::gaussian_weights(3 * 64 * 256, 11));
  rlserve::test::device_buffer<uint64_t> flag(1);
  gpu.w = good.get();
  gpu.nonfinite = flag.get();
  BOOST_TEST(int4_quantize_device(gpu, "experts.w13", nullptr).has_value());
  BOOST_TEST(flag.download()[0] == k_int4_all_finite);
}

BOOST_AUTO_TEST_CASE(bad_shapes_fail_before_launch_with_the_cpu_message) {
  rlserve::test::require_device();
  rlserve::test::device_buffer<uint16_t> w(1 << 16), scale(1 << 12);
  rlserve::test::device_buffer<int32_t> packed(1 << 14), zp(1 << 12);
  rlserve::test::device_buffer<uint64_t> flag(1);
  for (int4_shape s : {int4_shape{1, 64, 128, 0}, int4_shape{1, 64, 144, 48}, int4_shape{1, 64, 96, 64},
                       int4_shape{1, 12, 64, 32}, int4_shape{1, 64, 36, k_int4_channel}}) {
    int4_quant_args a{s, int4_recipe::asym, zero_point_layout::standard, w.get(), packed.get(), scale.get(),
                      zp.get(), flag.get()};
    BOOST_TEST((int4_quantize_launch(a, nullptr) == kernel_status::invalid_problem));
    auto gpu = int4_quantize_device(a, "t", nullptr);
    BOOST_REQUIRE(!gpu);
    BOOST_TEST(gpu.error() == "t: int4-asym quantization: " + int4_quant_problem(a));
  }
  int4_quant_serving_args f{{1, 96, 128, 32}, int4_recipe::sym, w.get(), packed.get(), scale.get(), nullptr, flag.get()};
  BOOST_TEST((int4_quantize_serving_launch(f, nullptr) == kernel_status::invalid_problem));
  BOOST_TEST(int4_quantize_serving_device(f, "t", nullptr).error() ==
             "t: int4-sym quantization: n (output features) = 96 is not a multiple of 64 (the serving layout "
             "stores 16 (k) x 64 (n) tiles)");
}

BOOST_AUTO_TEST_CASE(throughput_is_reported) {
  // Informational: bf16 input bandwidth on a dense 14336 x 4096 matrix (the copy ceiling is
  // ~3.3 TB/s of bf16 input at g128, docs/formats.md '4. Serving layout'; the goal is >= 2 TB/s).
  rlserve::test::require_device();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  auto time_us = [&](auto launch) {
    for (int i = 0; i < 3; ++i)
      BOOST_REQUIRE(launch() == kernel_status::ok);
    const int iters = 20;
    cudaEventRecord(start);
    for (int i = 0; i < iters; ++i)
      BOOST_REQUIRE(launch() == kernel_status::ok);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return 1000.0 * ms / iters;
  };
  const int64_t n = 14336, k = 4096;
  rlserve::test::device_buffer<uint16_t> w(t4::gaussian_weights(n * k, 12));
  rlserve::test::device_buffer<int32_t> words(n * k / 8), zp(n * k / 32 / 8 + n);
  rlserve::test::device_buffer<uint16_t> scale(n * k / 32 + n);
  rlserve::test::device_buffer<uint64_t> flag(1);
  for (int32_t g : {32, 128, k_int4_channel})
    for (auto r : {int4_recipe::sym_qat, int4_recipe::asym}) {
      const int4_shape s{1, n, k, g};
      const bool asym = r == int4_recipe::asym;
      int4_quant_serving_args f{s, r, w.get(), words.get(), scale.get(), asym ? zp.get() : nullptr, flag.get()};
      const double fused = time_us([&] { return int4_quantize_serving_launch(f, nullptr); });
      int4_quant_args q{s, r, zero_point_layout::miles, w.get(), words.get(), scale.get(), asym ? zp.get() : nullptr,
                        flag.get()};
      const double load = time_us([&] { return int4_quantize_launch(q, nullptr); });
      BOOST_TEST_MESSAGE("int4 quantize 14336x4096 g" << g << " " << to_string(r) << ": fused->serving " << fused
                         << " us (" << 2.0 * n * k / fused / 1e3 << " GB/s of bf16), ->load format " << load
                         << " us (" << 2.0 * n * k / load / 1e3 << " GB/s)");
      BOOST_TEST(fused > 0);
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

BOOST_AUTO_TEST_SUITE_END()
