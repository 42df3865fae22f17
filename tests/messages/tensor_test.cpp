// messages/tensor.hpp: checked_numel, the one check every path that takes a shape from outside
// (inline tensors, CUDA IPC references, NCCL broadcasts) runs before computing byte counts.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

#include "messages/tensor.hpp"

using namespace rlserve;
using shape = std::vector<int64_t>;

BOOST_AUTO_TEST_SUITE(tensor_test)

BOOST_AUTO_TEST_CASE(ordinary_shapes_count_their_elements) {
  BOOST_TEST(checked_numel(shape{}) == 1);        // a scalar
  BOOST_TEST(checked_numel(shape{4096, 512}) == 4096 * 512);
  BOOST_TEST(checked_numel(shape{3, 0, 7}) == 0); // empty, even next to a huge dimension
  BOOST_TEST(checked_numel(shape{0, INT64_MAX}) == 0);
}

BOOST_AUTO_TEST_CASE(negative_and_overflowing_shapes_are_refused) {
  BOOST_TEST(checked_numel(shape{4, -1}) == -1);
  BOOST_TEST(checked_numel(shape{INT64_MAX / 16 + 1}) == -1);      // its bytes would overflow
  BOOST_TEST(checked_numel(shape{INT64_MAX / 16}) == INT64_MAX / 16);
  BOOST_TEST(checked_numel(shape{1LL << 32, 1LL << 32}) == -1);     // the product overflows
  BOOST_TEST(checked_numel(shape{INT64_MAX / 2 + 1}, 2) == -1);     // per element size
  BOOST_TEST(checked_numel(shape{INT64_MAX / 2}, 2) == INT64_MAX / 2);
}

BOOST_AUTO_TEST_CASE(host_tensors_check_with_their_own_element_size) {
  HostTensor t;
  t.type = dtype::bf16;
  t.shape = {INT64_MAX / 2};
  BOOST_TEST(t.checked_numel() == INT64_MAX / 2);
  t.shape = {INT64_MAX / 2 + 1};
  BOOST_TEST(t.checked_numel() == -1);
  t.shape = {2, -3};
  BOOST_TEST(t.checked_numel() == -1);
}

BOOST_AUTO_TEST_SUITE_END()
