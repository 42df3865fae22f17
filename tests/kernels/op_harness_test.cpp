// The kernel op table (tests/kernels/op_cases.hpp) on the CPU: every case's twin runs, twice with
// the same bits, and writes finite values that are not all zeros, so a case the GPU test compares
// against is a meaningful oracle. op_harness_gpu_test.cu compares the CUDA kernels with it.
#include <boost/test/unit_test.hpp>

#include <set>

#include "tests/kernels/op_cases.hpp"

using namespace rlserve::test::ops;

namespace {

std::vector<void*> pointers(host_arrays& a) {
  std::vector<void*> p;
  for (auto& v : a)
    p.push_back(v.empty() ? nullptr : v.data());
  return p;
}

} // namespace

BOOST_AUTO_TEST_SUITE(op_harness_test)

BOOST_AUTO_TEST_CASE(every_case_has_a_deterministic_meaningful_cpu_twin) {
  const auto cases = op_cases();
  BOOST_TEST(cases.size() >= 20u);
  std::set<std::string> names;
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      BOOST_TEST(names.insert(c.name).second, "case names are unique (they seed the arrays)");
      int written = 0;
      for (const auto& a : c.arrays)
        written += a.use != role::input;
      BOOST_TEST(written >= 1);
      auto first = make_arrays(c), second = make_arrays(c);
      BOOST_TEST((first == second), "the fill is a function of the case");
      BOOST_REQUIRE(c.call(backend::cpu, pointers(first)) == rlserve::kernels::kernel_status::ok);
      BOOST_REQUIRE(c.call(backend::cpu, pointers(second)) == rlserve::kernels::kernel_status::ok);
      for (std::size_t i = 0; i < c.arrays.size(); ++i) {
        const auto& a = c.arrays[i];
        if (a.use == role::input)
          continue;
        BOOST_TEST_CONTEXT(a.name) {
          BOOST_TEST((first[i] == second[i]), "the CPU twin gives the same bits twice");
          BOOST_TEST(all_finite(a.type, first[i]));
          BOOST_TEST(any_nonzero(a.type, first[i]));
        }
      }
    }
  }
}

// The comparison the GPU test relies on: exact where it must be, and it sees a changed value.
BOOST_AUTO_TEST_CASE(rel_l2_sees_one_changed_value) {
  std::vector<std::byte> want(16), got(16);
  const float w[4] = {1.0f, -2.0f, 3.0f, 0.5f};
  std::memcpy(want.data(), w, 16);
  std::memcpy(got.data(), w, 16);
  BOOST_TEST(rel_l2(elem::f32, got, want) == 0.0);
  const float changed = 3.001f;
  std::memcpy(got.data() + 8, &changed, 4);
  BOOST_TEST(rel_l2(elem::f32, got, want) > 0.0);
  const float nan = NAN;
  std::memcpy(got.data() + 8, &nan, 4);
  BOOST_TEST(std::isinf(rel_l2(elem::f32, got, want)));
}

BOOST_AUTO_TEST_SUITE_END()
