// The network front's own actors die — one per websocket connection, one per HTTP call — as a
// crash would end them (net::server::kill_connection_actors), while a websocket client owns the
// weight-update session and HTTP calls wait behind it. Nobody may be left waiting and nothing
// left held: the HTTP calls are answered (500, SGLang's and OpenAI's error shape), the websocket
// client is disconnected, its session is aborted as at a disconnect (the old weights serve), and
// the server goes on answering new connections.
#include "tests/net/net_test_support.hpp"

#include <future>

using namespace rlserve;
using namespace rlserve::test;
using net::json;
namespace http = boost::beast::http;

BOOST_AUTO_TEST_SUITE(connection_death_sim_test)

BOOST_AUTO_TEST_CASE(killed_connection_actors_answer_disconnect_and_give_back_the_session) {
  served_engine s;
  auto owner = s.connect();
  auto begun = owner->call("begin_weight_update", json::object());
  BOOST_REQUIRE_MESSAGE(begun.has_value(), begun.error());
  BOOST_REQUIRE(begun->ok);
  // Generation waits at the front door while the session is open.
  auto held = std::async(std::launch::async, [&] {
    return http_request(s.port(), http::verb::post, "/generate",
                        R"({"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 2}})");
  });
  auto held_openai = std::async(std::launch::async, [&] {
    return http_request(s.port(), http::verb::post, "/v1/completions", R"({"prompt": [3, 4], "max_tokens": 2})");
  });
  BOOST_REQUIRE(eventually([&] { return s.engine->get_server_info().waiting_requests == 2; }));

  auto killed = s.server->kill_connection_actors();
  BOOST_TEST(killed == 3u); // the websocket's and the two calls'

  // A hang guard, not a timing assertion.
  for (auto* h : {&held, &held_openai}) {
    BOOST_REQUIRE(h->wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    auto r = h->get();
    BOOST_TEST(r.status == 500u);
    BOOST_TEST(r.body.find("handler of this request stopped") != std::string::npos, r.body);
    BOOST_TEST(r.body.find("\"error\"") != std::string::npos, r.body);
  }
  // The owner is disconnected; its session is aborted as at a disconnect.
  auto after = owner->call("get_server_info", json::object());
  BOOST_TEST(!after.has_value());
  BOOST_REQUIRE(eventually([&] { return !s.engine->get_server_info().weight_update_session_open; }));
  // The killed generate requests were aborted or ran; either way the engine is free again.
  BOOST_REQUIRE(eventually([&] {
    auto info = s.engine->get_server_info();
    return info.waiting_requests == 0 && info.running_requests == 0;
  }));

  // New clients are served: generation, and a session of a new connection.
  auto fresh = http_request(s.port(), http::verb::post, "/generate",
                            R"({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})");
  BOOST_TEST(fresh.status == 200u, fresh.body);
  auto next = s.connect();
  auto again = next->call("begin_weight_update", json::object());
  BOOST_REQUIRE(again.has_value());
  BOOST_TEST(again->ok, again->body.dump());
  auto end = next->call("end_weight_update", json{{"abort", true}});
  BOOST_REQUIRE(end.has_value());
  BOOST_TEST(end->ok);
  BOOST_TEST(s.engine->get_server_info().weight_version == "0");
  next->close();
}

BOOST_AUTO_TEST_SUITE_END()
