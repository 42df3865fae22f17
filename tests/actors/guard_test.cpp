// guarded_behavior (actors/guard.hpp): a handler that throws answers with an error and the actor
// lives on; pending_requests (actors/watch.hpp): a request the dead actor held is answered.
#include <boost/test/unit_test.hpp>

#include <future>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/guard.hpp"
#include "actors/watch.hpp"
#include "caf/all.hpp"
#include "messages/all.hpp"

using namespace rlserve;

namespace {

// Three handler shapes: a plain reply with success/message, a caf::result of one, and a reply
// without them (answered with a CAF error); each throws on a flag of its message.
using toy_actor = caf::typed_actor<caf::replies_to<HealthCheckReqInput>::with<HealthCheckReqOutput>,
                                   caf::replies_to<FlushCacheReqInput>::with<FlushCacheReqOutput>,
                                   caf::replies_to<int32_t>::with<int32_t>,
                                   caf::reacts_to<std::string>>;

// `name` is a spawn argument because CAF 0.17 dereferences a null argument tuple when a
// function-based actor is spawned without arguments (UBSan reports it).
toy_actor::behavior_type toy(toy_actor::pointer, const char* name) {
  return guarded_behavior<toy_actor::behavior_type>(
    name,
    [](HealthCheckReqInput&) -> HealthCheckReqOutput { throw std::bad_alloc(); },
    [](FlushCacheReqInput& req) -> caf::result<FlushCacheReqOutput> {
      if (req.timeout_s)
        throw std::runtime_error("bad timeout");
      return FlushCacheReqOutput{true, "flushed"};
    },
    [](int32_t x) -> int32_t {
      if (x < 0)
        throw std::out_of_range("negative");
      return x + 1;
    },
    [](std::string&) { throw 42; });
}

} // namespace

BOOST_AUTO_TEST_SUITE(guard_test)

BOOST_AUTO_TEST_CASE(a_throwing_handler_answers_with_an_error_and_the_actor_lives_on) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto a = sys.spawn(toy, "toy");
  caf::scoped_actor self{sys};
  self->request(a, caf::infinite, HealthCheckReqInput{})
    .receive(
      [](HealthCheckReqOutput& out) {
        BOOST_TEST(!out.success);
        BOOST_TEST(out.message == "the toy failed handling this request: out of memory");
      },
      [](caf::error&) { BOOST_FAIL("an error reply was expected as a value"); });
  caf::anon_send(a, std::string("throws something that is no exception"));
  self->request(a, caf::infinite, FlushCacheReqInput{1.0})
    .receive(
      [](FlushCacheReqOutput& out) {
        BOOST_TEST(!out.success);
        BOOST_TEST(out.message.find("bad timeout") != std::string::npos);
      },
      [](caf::error&) { BOOST_FAIL("an error reply was expected as a value"); });
  self->request(a, caf::infinite, int32_t{-1})
    .receive([](int32_t) { BOOST_FAIL("a CAF error was expected"); },
             [&](caf::error& e) {
               BOOST_TEST(sys.render(e).find("negative") != std::string::npos);
             });
  // Still alive, still answering.
  self->request(a, caf::infinite, FlushCacheReqInput{})
    .receive([](FlushCacheReqOutput& out) { BOOST_TEST(out.success); },
             [](caf::error&) { BOOST_FAIL("the actor died"); });
  self->request(a, caf::infinite, int32_t{1})
    .receive([](int32_t y) { BOOST_TEST(y == 2); },
             [](caf::error&) { BOOST_FAIL("the actor died"); });
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

// A holder keeps every request's promise and never answers; a waiter asks it through
// pending_requests. When the holder is killed, the waiter's request fails with the reason.
BOOST_AUTO_TEST_CASE(a_request_held_by_a_dead_actor_is_answered) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto got = std::make_shared<std::promise<void>>();
  // Inputs as spawn arguments (see toy).
  auto holder = sys.spawn([](caf::event_based_actor* self,
                             std::shared_ptr<std::promise<void>> got) -> caf::behavior {
    auto held = std::make_shared<std::vector<caf::response_promise>>();
    return {[self, held, got](int32_t) -> caf::result<std::string> {
      held->push_back(self->make_response_promise());
      got->set_value();
      return caf::delegated<std::string>{};
    }};
  }, got);
  struct waiter_state {
    pending_requests waits;
  };
  auto waiter = sys.spawn([](caf::stateful_actor<waiter_state>* self, caf::actor holder) -> caf::behavior {
    self->monitor(holder);
    self->set_down_handler(
      [self](caf::down_msg& dm) { self->state.waits.peer_down(dm.source, "gone"); });
    return {[self, holder](int32_t x) -> caf::result<std::string> {
      auto rp = self->make_response_promise<std::string>();
      self->state.waits.request<std::string>(
        self, holder, x, [rp](std::string& s) mutable { rp.deliver(s); },
        [rp](const std::string& why) mutable { rp.deliver("failed: " + why); });
      return rp;
    }};
  }, holder);
  // The kill comes once the holder has the request (the blocking receive below waits for it).
  std::thread killer([got, holder] {
    got->get_future().wait();
    caf::anon_send_exit(holder, caf::exit_reason::kill);
  });
  caf::scoped_actor self{sys};
  std::string reply;
  self->request(waiter, caf::infinite, int32_t{1})
    .receive([&](std::string& s) { reply = s; }, [&](caf::error& e) { reply = sys.render(e); });
  killer.join();
  BOOST_TEST(reply == "failed: gone");
  caf::anon_send_exit(waiter, caf::exit_reason::user_shutdown);
}

// A reply handler that throws (a bug, or std::bad_alloc) does not end the waiting actor: its
// error handler answers the caller, and the next request is served.
BOOST_AUTO_TEST_CASE(a_throwing_reply_handler_fails_its_request_and_the_waiter_lives_on) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto echo = sys.spawn([](caf::event_based_actor*, int32_t) -> caf::behavior {
    return {[](int32_t x) -> int32_t { return x; }};
  }, int32_t{0});
  struct waiter_state {
    pending_requests waits;
  };
  auto waiter = sys.spawn([](caf::stateful_actor<waiter_state>* self, caf::actor echo) -> caf::behavior {
    return {[self, echo](int32_t x) -> caf::result<std::string> {
      auto rp = self->make_response_promise<std::string>();
      self->state.waits.request<int32_t>(
        self, echo, x,
        [rp](int32_t& y) mutable {
          if (y < 0)
            throw std::runtime_error("negative");
          rp.deliver(std::to_string(y));
        },
        [rp](const std::string& why) mutable { rp.deliver("failed: " + why); });
      return rp;
    }};
  }, echo);
  caf::scoped_actor self{sys};
  auto ask = [&](int32_t x) {
    std::string reply;
    self->request(waiter, std::chrono::seconds(10), x)
      .receive([&](std::string& s) { reply = s; }, [&](caf::error& e) { reply = sys.render(e); });
    return reply;
  };
  BOOST_TEST(ask(-1) == "failed: handling the reply failed: negative");
  BOOST_TEST(ask(7) == "7"); // alive
  caf::anon_send_exit(waiter, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_SUITE_END()
