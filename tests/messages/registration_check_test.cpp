// messages/registration_check.hpp, checked both ways at compile time: an interface whose
// messages are all in the type-ID block passes, one with a stray type fails.
#include <boost/test/unit_test.hpp>

#include "caf/typed_actor.hpp"
#include "messages/all.hpp"
#include "messages/registration_check.hpp"

namespace {

struct not_registered {
  int x = 0;
};

using good_actor = caf::typed_actor<
  caf::replies_to<rlserve::GenerateReqInput>::with<rlserve::GenerateReqOutput>,
  caf::replies_to<rlserve::commit_atom, rlserve::EndWeightUpdateReqInput>::with<
    rlserve::EndWeightUpdateReqOutput>,
  caf::reacts_to<rlserve::AbortReq>,
  caf::replies_to<std::string, int32_t>::with<bool>>;

using bad_input_actor =
  caf::typed_actor<caf::replies_to<rlserve::GenerateReqInput>::with<rlserve::GenerateReqOutput>,
                   caf::reacts_to<not_registered>>;

using bad_output_actor =
  caf::typed_actor<caf::replies_to<rlserve::GenerateReqInput>::with<not_registered>>;

static_assert(rlserve::interface_registered<good_actor>::value);
static_assert(!rlserve::interface_registered<bad_input_actor>::value);
static_assert(!rlserve::interface_registered<bad_output_actor>::value);
static_assert(rlserve::has_type_id_v<const rlserve::HostTensor&>);
// Parts of messages (sent only inside another) need no ID of their own.
static_assert(!rlserve::has_type_id_v<rlserve::FinishReason>);

} // namespace

BOOST_AUTO_TEST_SUITE(registration_check_test)

BOOST_AUTO_TEST_CASE(checks_are_compile_time) {
  BOOST_TEST(rlserve::interface_registered<good_actor>::value);
  BOOST_TEST(!rlserve::interface_registered<bad_input_actor>::value);
}

BOOST_AUTO_TEST_SUITE_END()
