// Every type of the type-ID block (messages/type_ids.hpp) survives CAF's binary serialization,
// alone and inside a caf::message, with every field set to a non-default value: the check that
// each inspect() names every field and that the block registers every type (a type missing from
// the block cannot be deserialized out of a message).
#include <boost/test/unit_test.hpp>

#include <string>
#include <utility>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/actor_system_config.hpp"
#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"
#include "caf/deep_to_string.hpp"
#include "caf/make_message.hpp"
#include "caf/message.hpp"
#include "message_samples.hpp"
#include "messages/all.hpp"

using namespace rlserve;
using namespace rlserve_test;

namespace {

// An actor system only for its type registry; the testing scheduler starts no worker threads.
struct system_fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.add_message_types<caf::id_block::rlserve>();
    c.set("scheduler.policy", caf::atom("testing"));
    return c;
  }
  system_fixture() : sys(init(cfg)) {}
};

template <class T>
void check_defaults_replaced(const T& x, const std::string& label) {
  auto left = default_fields(x);
  std::string text;
  for (auto i : left)
    text += std::to_string(i) + " ";
  BOOST_TEST(left.empty(), label << ": fields still at their default (indices): " << text);
}

template <class T>
void check_roundtrip(caf::actor_system& sys, const T& original, const std::string& label) {
  // Alone.
  {
    T copy = original;
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    auto err = sink(copy);
    BOOST_TEST_REQUIRE(!err, label << ": serialize: " << sys.render(err));
    T back{};
    caf::binary_deserializer source{sys, buf};
    err = source(back);
    BOOST_TEST_REQUIRE(!err, label << ": deserialize: " << sys.render(err));
    BOOST_TEST(source.remaining() == 0u, label << ": " << source.remaining() << " bytes unread");
    BOOST_TEST((back == original), label << ": round trip changed the value:\n  sent "
                                         << caf::deep_to_string(original) << "\n  got  "
                                         << caf::deep_to_string(back));
  }
  // Inside a caf::message, as an actor would send it to another process: this goes through
  // the type registry, so an unregistered type fails here.
  {
    auto msg = caf::make_message(original);
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    auto err = sink(msg);
    BOOST_TEST_REQUIRE(!err, label << ": serialize message: " << sys.render(err));
    caf::message back;
    caf::binary_deserializer source{sys, buf};
    err = source(back);
    BOOST_TEST_REQUIRE(!err, label << ": deserialize message: " << sys.render(err));
    BOOST_TEST_REQUIRE(back.match_elements<T>(), label << ": message holds "
                                                       << caf::to_string(back));
    BOOST_TEST((back.template get_as<T>(0) == original), label << ": message round trip changed "
                                                                  "the value");
  }
}

template <class T>
void check_type(caf::actor_system& sys) {
  const std::string label = caf::type_name<T>::value;
  const T full = samples<T>::full();
  check_defaults_replaced(full, label);
  check_roundtrip(sys, full, label + " (full)");
  // Every variant the JSON tests use too: optionals unset, alternative shapes.
  int i = 0;
  for (const auto& x : samples<T>::json())
    check_roundtrip(sys, x, label + " (variant " + std::to_string(i++) + ")");
  check_roundtrip(sys, T{}, label + " (default)");
}

template <caf::type_id_t... Offsets>
void check_block(caf::actor_system& sys, std::integer_sequence<caf::type_id_t, Offsets...>) {
  (check_type<typename caf::type_by_id<caf::id_block::rlserve::begin + Offsets>::type>(sys), ...);
}

} // namespace

BOOST_AUTO_TEST_SUITE(roundtrip_test)

// Walks the type-ID block itself, so a type added there is covered (or, without samples and a
// field count in message_samples.hpp, fails to compile) without touching this test.
BOOST_FIXTURE_TEST_CASE(every_registered_type_round_trips, system_fixture) {
  constexpr auto count = caf::id_block::rlserve::end - caf::id_block::rlserve::begin;
  BOOST_TEST_MESSAGE("checking " << count << " registered types");
  check_block(sys, std::make_integer_sequence<caf::type_id_t, count>{});
}

BOOST_FIXTURE_TEST_CASE(host_tensor_bytes_are_copied_not_aliased, system_fixture) {
  const auto original = samples<HostTensor>::full();
  HostTensor copy = original;
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  BOOST_TEST_REQUIRE(!sink(copy));
  HostTensor back;
  caf::binary_deserializer source{sys, buf};
  BOOST_TEST_REQUIRE(!source(back));
  BOOST_TEST(back.nbytes == original.nbytes);
  BOOST_TEST(back.data.get() != original.data.get());
  BOOST_TEST(std::memcmp(back.data.get(), original.data.get(), original.nbytes) == 0);
  // The deserialized tensor owns its bytes: dropping the buffer must not affect it.
  buf.assign(buf.size(), 0);
  BOOST_TEST((back == original));
}

BOOST_FIXTURE_TEST_CASE(truncated_input_fails_cleanly, system_fixture) {
  auto original = samples<UpdateWeightsFromTensorReqInput>::full();
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  BOOST_TEST_REQUIRE(!sink(original));
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, buf.size() / 2, buf.size() - 1}) {
    UpdateWeightsFromTensorReqInput back;
    caf::binary_deserializer source{sys, buf.data(), cut};
    BOOST_TEST(static_cast<bool>(source(back)), "a message cut at byte " << cut << " decoded");
  }
}

BOOST_AUTO_TEST_SUITE_END()
