// The engine's front door dies while the network front waits on it: the HTTP call actors (SGLang's
// and OpenAI's routes, one request or a fan-out) and the websocket connection actor monitor it, so
// requests it held are answered (HTTP 503, websocket engine_error) instead of waiting forever,
// later ones fail at once, and the server stops cleanly.
#include "tests/net/net_test_support.hpp"

#include <future>

using namespace rlserve;
using namespace rlserve::test;
using net::json;
namespace http = boost::beast::http;

BOOST_AUTO_TEST_SUITE(front_door_death_sim_test)

BOOST_AUTO_TEST_CASE(requests_the_front_door_held_are_answered_when_it_dies) {
  served_engine s;
  // Paused: generate requests wait at the front door's gate, held there.
  BOOST_REQUIRE(s.engine->pause_generation({pause_mode::abort}).success);
  auto c = s.connect();
  auto ws_id = c->send("generate", to_json(greedy_ids({1, 2}, 2)));
  BOOST_REQUIRE_MESSAGE(ws_id.has_value(), ws_id.error());
  auto held_http = std::async(std::launch::async, [&] {
    return http_request(s.port(), http::verb::post, "/generate",
                        R"({"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 2}})");
  });
  // A fan-out (n = 2) and an OpenAI completion, held the same way.
  auto held_fanout = std::async(std::launch::async, [&] {
    return http_request(s.port(), http::verb::post, "/generate",
                        R"({"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 2, "n": 2}})");
  });
  auto held_openai = std::async(std::launch::async, [&] {
    return http_request(s.port(), http::verb::post, "/v1/completions",
                        R"({"prompt": [3, 4], "max_tokens": 2})");
  });
  BOOST_REQUIRE(eventually([&] { return s.engine->get_server_info().waiting_requests == 5; }));

  BOOST_REQUIRE(s.engine->kill_actor_for_test("tokenizer").has_value());

  // A hang guard, not a timing assertion.
  BOOST_REQUIRE(held_http.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
  auto r = held_http.get();
  BOOST_TEST(r.status == 503u);
  BOOST_TEST(r.body.find("front door stopped") != std::string::npos, r.body);
  for (auto* held : {&held_fanout, &held_openai}) {
    BOOST_REQUIRE(held->wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    auto h = held->get();
    BOOST_TEST(h.status == 503u);
    BOOST_TEST(h.body.find("front door stopped") != std::string::npos, h.body);
    BOOST_TEST(h.body.find("\"error\"") != std::string::npos, h.body); // SGLang's and OpenAI's shape
  }
  auto m = c->wait_for(json(*ws_id)); // an error frame comes back as "code: message"
  BOOST_REQUIRE(!m.has_value());
  BOOST_TEST(m.error().rfind("engine_error: ", 0) == 0, m.error());
  BOOST_TEST(m.error().find("front door stopped") != std::string::npos, m.error());

  // Later requests fail at once, on both transports.
  BOOST_TEST(http_request(s.port(), http::verb::get, "/health").status == 503u);
  auto later = http_request(s.port(), http::verb::post, "/generate",
                            R"({"input_ids": [5], "sampling_params": {"max_new_tokens": 1}})");
  BOOST_TEST(later.status == 503u);
  auto info = c->call("get_server_info", json::object());
  BOOST_TEST(!info.has_value());
  c->close();
  // served_engine's destructor stops the server and the engine: a hang there fails by timeout.
}

BOOST_AUTO_TEST_SUITE_END()
