// The session watchdog (net/session_watchdog.hpp) dies, as a crash would end it
// (net::server::kill_session_watchdog), three times in a row: nothing answers its callers (it has
// none), so its keeper must notice and start it again, and an HTTP weight-update session
// abandoned afterwards must still be aborted at its idle deadline, the old weights serving.
#include "tests/net/net_test_support.hpp"

#include "net/metrics.hpp"

using namespace rlserve;
using namespace rlserve::test;
namespace http = boost::beast::http;

BOOST_AUTO_TEST_SUITE(session_watchdog_death_sim_test)

BOOST_AUTO_TEST_CASE(a_killed_watchdog_is_started_again_and_still_aborts_idle_sessions) {
  net::server_options o;
  o.update_session_idle_timeout = std::chrono::milliseconds(300);
  served_engine s(o);
  const auto first = s.server->kill_session_watchdog();
  BOOST_REQUIRE(first != 0u);
  // Until the keeper hears of the death it still names the dead one, and a restart within a
  // second of the last start waits: ask until another watchdog runs, and kill that one too.
  uint64_t second = 0;
  BOOST_REQUIRE(eventually([&] { return (second = s.server->kill_session_watchdog()) != 0 && second != first; }));
  uint64_t third = 0;
  BOOST_REQUIRE(eventually([&] { return (third = s.server->kill_session_watchdog()) != 0 && third != second; }));
  BOOST_REQUIRE(eventually([&] {
    return http_request(s.port(), http::verb::get, "/health").status == 200u;
  }));
  auto sum_before = s.engine->check_weights({}).payload.at(0).per_gpu_checksum;
  BOOST_REQUIRE(http_request(s.port(), http::verb::post, "/begin_weight_update", "{}").status == 200u);
  BOOST_TEST(eventually([&] { return !s.engine->get_server_info().weight_update_session_open; },
                        std::chrono::seconds(30)));
  auto g = s.engine->generate(greedy_ids({1, 2}, 2));
  BOOST_TEST(g.success, g.message);
  BOOST_TEST(s.engine->get_server_info().weight_version == "0");
  BOOST_TEST(s.engine->check_weights({}).payload.at(0).per_gpu_checksum == sum_before);
  auto m = s.server->stats().render(nullptr);
  BOOST_TEST(m.find("action=\"abort_idle_session\"} 1") != std::string::npos, m);
}

// With no idle deadline there is no watchdog to kill.
BOOST_AUTO_TEST_CASE(no_deadline_no_watchdog) {
  net::server_options o;
  o.update_session_idle_timeout = std::chrono::milliseconds(0);
  served_engine s(o);
  BOOST_TEST(s.server->kill_session_watchdog() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
