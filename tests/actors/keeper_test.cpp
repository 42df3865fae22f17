// actors/keeper: a helper that dies is started again (at most once a second), one that ends as
// asked is not, and an exit sent to the keeper ends the helper with it.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "actors/keeper.hpp"
#include "caf/all.hpp"

using namespace rlserve;
using namespace std::chrono_literals;

namespace {

// Answers n with n + 1; ends normally on "quit".
caf::behavior helper(caf::event_based_actor* self, int32_t unused) {
  (void)unused; // CAF 0.17 needs a spawn argument (guard_test.cpp says why)
  return {
    [](int32_t n) { return n + 1; },
    [self](std::string& s) {
      if (s == "quit")
        self->quit();
    },
  };
}

struct fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::atomic<int> started{0};
  caf::actor keeper = spawn_keeper(sys, "test helper", [this] {
    ++started;
    return sys.spawn(helper, 0);
  });

  ~fixture() { caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown); }

  // The helper running now (invalid while a restart waits, or once the keeper is gone).
  caf::actor current() {
    caf::scoped_actor self{sys};
    caf::actor out;
    self->request(keeper, 10s, caf::get_atom_v).receive([&](caf::actor& a) { out = a; }, [](caf::error&) {});
    return out;
  }

  bool answers(const caf::actor& a) {
    caf::scoped_actor self{sys};
    bool ok = false;
    self->request(a, 10s, int32_t{41}).receive([&](int32_t n) { ok = n == 42; }, [](caf::error&) {});
    return ok;
  }

  // Polls `ready` (a hang guard bounds it, nothing is timed).
  static bool eventually(const std::function<bool()>& ready) {
    for (auto end = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < end;
         std::this_thread::sleep_for(10ms))
      if (ready())
        return true;
    return false;
  }

  bool ended(const caf::actor& a) {
    caf::scoped_actor self{sys};
    self->monitor(a);
    bool down = false;
    self->receive([&](caf::down_msg&) { down = true; }, caf::after(30s) >> [] {});
    return down;
  }
};

} // namespace

BOOST_AUTO_TEST_SUITE(keeper_test)

BOOST_FIXTURE_TEST_CASE(a_killed_helper_is_started_again_even_twice_in_a_row, fixture) {
  auto first = current();
  BOOST_REQUIRE(first);
  BOOST_TEST(answers(first));
  caf::anon_send_exit(first, caf::exit_reason::kill);
  BOOST_TEST(ended(first));
  caf::actor second;
  BOOST_REQUIRE(eventually([&] { return (second = current()) && second != first; }));
  BOOST_TEST(answers(second));
  // Killed again at once: the restart waits out the second since the last start, then comes.
  caf::anon_send_exit(second, caf::exit_reason::kill);
  caf::actor third;
  BOOST_REQUIRE(eventually([&] { return (third = current()) && third != second; }));
  BOOST_TEST(answers(third));
  BOOST_TEST(started.load() == 3);
}

BOOST_FIXTURE_TEST_CASE(an_exit_to_the_keeper_ends_the_helper, fixture) {
  auto h = current();
  BOOST_REQUIRE(h);
  caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
  BOOST_TEST(ended(h));
  BOOST_TEST(started.load() == 1);
}

BOOST_FIXTURE_TEST_CASE(a_helper_that_ends_as_asked_is_not_started_again, fixture) {
  auto h = current();
  BOOST_REQUIRE(h);
  caf::anon_send(h, std::string("quit"));
  BOOST_TEST(ended(keeper)); // nothing left to keep
  BOOST_TEST(started.load() == 1);
}

BOOST_AUTO_TEST_SUITE_END()
