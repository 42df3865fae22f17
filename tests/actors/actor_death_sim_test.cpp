// Actors of the graph are killed in turn, as a crash would end them, while a request runs.
// The engine must answer that request and every later one (with an error where it cannot serve),
// and shut down cleanly: no caller may wait forever on an actor that is gone.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <future>

#include "actors/engine.hpp"
#include "tests/support/engine_support.hpp"

using namespace rlserve;
using namespace rlserve::test;

BOOST_AUTO_TEST_SUITE(actor_death_sim_test)

BOOST_AUTO_TEST_CASE(every_request_is_answered_after_an_actor_dies) {
  auto model = tiny_model("actor-death", 0);
  for (std::string kind : {"scheduler", "weight_updater"}) {
    BOOST_TEST_CONTEXT(kind << " killed") {
      auto e = start(model);
      auto running = e->generate_async(greedy({1, 2, 3}, 300));
      BOOST_REQUIRE(e->kill_actor_for_test(kind).has_value());
      // A hang guard, not a timing assertion: the answer comes at once or never.
      BOOST_REQUIRE(running.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
      auto out = running.get();
      if (kind == "weight_updater") {
        BOOST_TEST(out.success, out.message); // generation does not need the updater
        auto b = e->begin_weight_update();
        BOOST_TEST(!b.success);
        BOOST_TEST(!b.message.empty());
        BOOST_TEST(e->generate(greedy({1}, 2)).success);
      } else {
        auto later = e->generate(greedy({1}, 2));
        BOOST_TEST(!later.success);
        BOOST_TEST(!later.message.empty(), later.message);
        BOOST_TEST(!e->health().success);
        auto info = e->get_server_info();
        BOOST_TEST(!info.success);
      }
      e.reset(); // shuts down cleanly (a hang here fails the test by its ctest timeout)
    }
  }
  BOOST_TEST(!start(model)->kill_actor_for_test("nobody").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
