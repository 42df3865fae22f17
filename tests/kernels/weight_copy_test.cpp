// kernels/weight_copy: the CPU references of the batched NaN/Inf scan and bf16 conversion, held to
// definitions written here (std::isfinite per element; kernels::float_to_bf16 per element), at
// odd alignments and across dtypes; bad arguments refused.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/weight_copy.hpp"

using namespace rlserve;
using namespace rlserve::kernels;

namespace {

struct batch {
  std::vector<std::vector<unsigned char>> storage;
  std::vector<const void*> src;
  std::vector<void*> dst;
  std::vector<int64_t> count;
  std::vector<uint8_t> type;
  std::vector<uint64_t> flags;
  std::vector<std::vector<uint16_t>> out;

  // A tensor of `n` values of `t`, placed `misalign` bytes into its buffer.
  void add(dtype t, const std::vector<float>& values, std::size_t misalign) {
    const std::size_t es = t == dtype::f32 ? 4 : 2;
    storage.emplace_back(values.size() * es + misalign + 8);
    auto* p = storage.back().data() + misalign;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (t == dtype::f32) {
        std::memcpy(p + 4 * i, &values[i], 4);
      } else {
        uint16_t b = t == dtype::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
        std::memcpy(p + 2 * i, &b, 2);
      }
    }
    src.push_back(p);
    count.push_back(static_cast<int64_t>(values.size()));
    type.push_back(static_cast<uint8_t>(weight_type_of(t)));
    out.emplace_back(values.size() + 1);
  }
  weight_batch_args args() {
    flags.assign(src.size(), 0);
    dst.clear();
    for (auto& o : out)
      dst.push_back(o.data());
    return {static_cast<int64_t>(src.size()), src.data(), dst.data(), count.data(), type.data(), flags.data()};
  }
};

std::vector<float> randoms(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v)
    x = d(rng);
  return v;
}

} // namespace

BOOST_AUTO_TEST_SUITE(weight_copy_test)

BOOST_AUTO_TEST_CASE(scan_finds_the_least_non_finite_index_per_tensor) {
  batch b;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  auto clean = randoms(1000, 1);
  auto with_nan = randoms(1000, 2);
  with_nan[777] = nan;
  with_nan[901] = inf;
  auto with_inf = randoms(33, 3);
  with_inf[5] = -inf;
  b.add(dtype::bf16, clean, 0);
  b.add(dtype::bf16, with_nan, 2);
  b.add(dtype::f16, with_inf, 6);
  b.add(dtype::f32, with_nan, 4);
  b.add(dtype::f32, {}, 0);
  auto a = b.args();
  BOOST_REQUIRE(weight_scan_ref(a) == kernel_status::ok);
  BOOST_TEST(b.flags[0] == k_weight_all_finite);
  BOOST_TEST(b.flags[1] == 777u);
  BOOST_TEST(b.flags[2] == 5u);
  BOOST_TEST(b.flags[3] == 777u);
  BOOST_TEST(b.flags[4] == k_weight_all_finite);
  // f16 overflow: 70000 is finite in f32 but Inf once stored as f16.
  batch h;
  h.add(dtype::f16, {1.0f, 70000.0f}, 0);
  auto ha = h.args();
  BOOST_REQUIRE(weight_scan_ref(ha) == kernel_status::ok);
  BOOST_TEST(h.flags[0] == 1u);
}

BOOST_AUTO_TEST_CASE(integer_tensors_are_not_scanned) {
  std::vector<int32_t> words{-1, 0x7fc00000, 0x7f800000};
  const void* src[] = {words.data()};
  int64_t count[] = {3};
  uint8_t type[] = {static_cast<uint8_t>(weight_type_of(dtype::i32))};
  uint64_t flag[] = {0};
  weight_batch_args a{1, src, nullptr, count, type, flag};
  BOOST_REQUIRE(weight_scan_ref(a) == kernel_status::ok);
  BOOST_TEST(flag[0] == k_weight_all_finite);
  void* dst[] = {nullptr};
  a.dst = dst;
  BOOST_TEST((weight_to_bf16_ref(a) == kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_CASE(to_bf16_rounds_each_element_as_float_to_bf16) {
  batch b;
  auto v = randoms(517, 9);
  v[3] = 1.0f + 1.0f / 256.0f; // a tie: rounds to even
  b.add(dtype::f32, v, 4);
  b.add(dtype::f16, v, 2);
  b.add(dtype::bf16, v, 0);
  auto a = b.args();
  BOOST_REQUIRE(weight_to_bf16_ref(a) == kernel_status::ok);
  for (std::size_t i = 0; i < v.size(); ++i) {
    BOOST_TEST(b.out[0][i] == float_to_bf16(v[i]));
    BOOST_TEST(b.out[1][i] == float_to_bf16(f16_to_float(float_to_f16(v[i]))));
    BOOST_TEST(b.out[2][i] == float_to_bf16(v[i]));
  }
  BOOST_TEST(b.out[0][3] == float_to_bf16(1.0f));
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_refused) {
  weight_batch_args a;
  a.tensors = -1;
  BOOST_TEST((weight_scan_ref(a) == kernel_status::invalid_problem));
  a.tensors = 2;
  BOOST_TEST((weight_scan_ref(a) == kernel_status::invalid_problem)); // null arrays
  a.tensors = 0;
  BOOST_TEST((weight_scan_ref(a) == kernel_status::ok));
  BOOST_TEST(weight_batch_table_bytes(3) % 16 == 0u);
  BOOST_TEST(weight_batch_table_bytes(3) >= 3u * 33u);
}

BOOST_AUTO_TEST_SUITE_END()
