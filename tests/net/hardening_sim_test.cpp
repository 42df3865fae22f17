// Regression tests for what a careless trainer or a hostile client could do to the server when
// it was probed: each case is one defect found then, driven through real sockets against a real
// engine (tiny model). The engine must answer with an error naming what is wrong, keep every
// other client's requests running, and never be left locked, paused or dead.
#include "tests/net/net_test_support.hpp"

#include <cstring>

#include "net/protocol.hpp"

using namespace rlserve;
using namespace rlserve::test;
using net::json;
using net::server_message;
namespace http = boost::beast::http;

namespace {

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// The next message that is not a chunk.
server_message next_final(net::client& c) {
  for (;;) {
    auto m = c.receive();
    BOOST_REQUIRE_MESSAGE(m.has_value(), (m ? std::string() : m.error()));
    if (m->kind != server_message::chunk)
      return *m;
  }
}

std::vector<std::byte> binary_frame_with_header(const std::string& header) {
  std::vector<std::byte> f(4 + header.size());
  uint32_t h = static_cast<uint32_t>(header.size());
  for (int i = 0; i < 4; ++i)
    f[static_cast<std::size_t>(i)] = static_cast<std::byte>((h >> (8 * i)) & 0xff);
  std::memcpy(f.data() + 4, header.data(), header.size());
  return f;
}

} // namespace

BOOST_AUTO_TEST_SUITE(hardening_sim_test)

// 1e400 made nlohmann throw out_of_range, which killed the connection actor: the websocket
// stopped answering, its disconnect clean-up never ran, and the session it had opened blocked
// every /generate. Over HTTP the request was never answered.
BOOST_AUTO_TEST_CASE(number_outside_double_range_is_an_error_not_a_dead_actor) {
  served_engine s;
  {
    auto c = s.connect();
    auto b = c->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
    BOOST_REQUIRE(b.has_value() && b->success);
    std::string text = R"({"id": 1, "type": "generate", "body": {"input_ids": [1],)"
                       R"( "sampling_params": {"temperature": 1e400}}})";
    BOOST_REQUIRE(c->send_raw(as_bytes(text), false));
    auto m = c->receive();
    BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
    BOOST_TEST(m->code == "bad_json");
    BOOST_TEST(m->message.find("1e400") != std::string::npos, m->message);
    // The same in a binary frame's header.
    auto frame = binary_frame_with_header(
      R"({"id": 2, "type": "update_weights_from_tensor", "body": {"named_tensors": [], "x": -1e400}})");
    BOOST_REQUIRE(c->send_raw(frame, true));
    m = c->receive();
    BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
    BOOST_TEST(m->code == "bad_frame");
    BOOST_TEST(m->message.find("1e400") != std::string::npos, m->message);
    // The connection still answers...
    auto ping = c->call("ping", {{"x", 1}});
    BOOST_REQUIRE_MESSAGE(ping.has_value(), ping.error());
    BOOST_TEST(ping->body == json({{"x", 1}}));
  } // ...and its disconnect clean-up runs: the session it opened is aborted.
  BOOST_TEST(eventually([&] { return !s.engine->get_server_info().weight_update_session_open; }));
  auto g = s.engine->generate(greedy_ids({1, 2}, 2));
  BOOST_TEST(g.success, g.message);

  // HTTP: in the body, and in a query parameter (which is then a string the codec refuses).
  auto r = http_request(s.port(), http::verb::post, "/generate",
                        R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 1e400}})");
  BOOST_TEST(r.status == 400u);
  BOOST_TEST(r.body.find("1e400") != std::string::npos, r.body);
  r = http_request(s.port(), http::verb::post, "/flush_cache?timeout=1e400", "{}");
  BOOST_TEST(r.status == 400u);
  BOOST_TEST(r.body.find("timeout_s") != std::string::npos, r.body);
  r = http_request(s.port(), http::verb::post, "/pause_generation?mode=1e400");
  BOOST_TEST(r.status == 400u);
  BOOST_TEST(r.body.find("mode") != std::string::npos, r.body);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/health").status == 200u);
}

BOOST_AUTO_TEST_SUITE_END()
