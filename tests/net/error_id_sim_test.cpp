// Replies always answer the request: a websocket message whose id can be read before its text
// goes wrong gets its error reply with that id (net/protocol.hpp, recover_ids), over a real
// socket against a real engine (tiny model). Each broken message is followed by a good one on
// the same connection, which must be answered too.
#include "tests/net/net_test_support.hpp"

#include <cstring>

#include "net/protocol.hpp"
#include "tests/support/raw_frames.hpp"

using namespace rlserve;
using namespace rlserve::test;
using net::json;
using net::server_message;

namespace {

struct broken_case {
  std::string name;
  std::string text;
  json id;           // null: the reply carries no id
  std::string words; // in the error message
};

} // namespace

BOOST_AUTO_TEST_SUITE(error_id_sim_test)

BOOST_AUTO_TEST_CASE(a_broken_message_is_answered_with_its_id_when_it_was_read) {
  served_engine s;
  auto c = s.connect();
  const std::string digits(400, '9');
  const std::vector<broken_case> cases = {
    {"1e400 after a number id", R"({"id": 1, "type": "generate", "body": {"input_ids": [1], "sampling_params": {"temperature": 1e400}}})",
     1, "1e400"},
    {"a 400-digit integer after a string id",
     R"({"id": "big-int", "type": "generate", "body": {"input_ids": [1], "x": )" + digits + "}}", "big-int",
     "number overflow"},
    {"a bad escape after the id", R"({"id": 3, "type": "generate", "body": {"text": "a\xb"}})", 3,
     "invalid JSON"},
    {"a lone surrogate after the id", R"({"id": "surrogate", "type": "generate", "body": {"text": "\ud800"}})",
     "surrogate", "surrogate"},
    {"truncated after the id", R"({"id": 5, "type": "generate", "body": {"text": "ab)", 5, "invalid JSON"},
    {"the id after the broken part",
     R"({"type": "generate", "body": {"text": "\x"}, "id": 7})", nullptr,
     "no top-level \"id\" key comes before that point"},
    {"two ids before the broken part", R"({"id": 8, "id": 9, "body": {"x": 1e400}})", nullptr,
     "more than one \"id\""},
  };
  for (const auto& k : cases) {
    BOOST_TEST_CONTEXT(k.name) {
      BOOST_REQUIRE(c->send_raw(as_bytes(k.text), false));
      auto m = c->receive();
      BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
      BOOST_TEST(m->kind == server_message::error);
      BOOST_TEST(m->code == "bad_json");
      BOOST_TEST(m->id == k.id, m->id.dump());
      BOOST_TEST(m->message.find(k.words) != std::string::npos, m->message);
      if (k.id.is_null())
        BOOST_TEST(m->message.find("this reply carries no id") != std::string::npos, m->message);
      // The connection keeps answering.
      auto health = c->call("health", json::object());
      BOOST_TEST(health.has_value(), (health ? "" : health.error()));
    }
  }
  // The same in a binary frame's header: the error answers the id read before the failure.
  BOOST_REQUIRE(c->send_raw(binary_frame_with_header(
                              R"({"id": "bin", "type": "update_weights_from_tensor", "body": {"x": 1e400}})"),
                            true));
  auto m = c->receive();
  BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
  BOOST_TEST(m->code == "bad_frame");
  BOOST_TEST(m->id == json("bin"));
  // Invalid UTF-8 after the id: in a binary frame's header, since a text frame with invalid
  // UTF-8 is failed by the websocket layer itself (close code 1007, RFC 6455 section 8.1)
  // before the server reads a byte of it.
  BOOST_REQUIRE(c->send_raw(binary_frame_with_header("{\"id\": \"utf8\", \"type\": "
                                                     "\"update_weights_from_tensor\", \"body\": "
                                                     "{\"text\": \"\xc3\x28\"}}"),
                            true));
  m = c->receive();
  BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
  BOOST_TEST(m->code == "bad_frame");
  BOOST_TEST(m->id == json("utf8"));
  BOOST_TEST(m->message.find("UTF-8") != std::string::npos, m->message);
  BOOST_REQUIRE(c->send_raw(binary_frame_with_header(R"({"body": {"x": 1e400}, "id": "late"})"), true));
  m = c->receive();
  BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
  BOOST_TEST(m->id.is_null());
  BOOST_TEST(m->message.find("this reply carries no id") != std::string::npos, m->message);
  auto health = c->call("health", json::object());
  BOOST_TEST(health.has_value(), (health ? "" : health.error()));
}

BOOST_AUTO_TEST_SUITE_END()
