// Actors of the graph are killed in turn, as a crash would end them, while a request runs.
// The engine must answer that request and every later one (with an error where it cannot serve),
// say it is unhealthy, and shut down cleanly: no caller may wait forever on an actor that is gone
// (CAF 0.17 drops the promises a dead actor held; the actors waiting on it monitor it).
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "actors/engine.hpp"
#include "tests/support/engine_support.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

// A hang guard, not a timing assertion: the answer comes at once or never.
template <class T>
T answered(std::future<T>& f) {
  BOOST_REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
  return f.get();
}

// The engine hears of a death by a down message, which may come a moment after the kill: asks
// until it reports unhealthy (a hang guard bounds the asking, nothing is timed).
HealthCheckReqOutput eventually_unhealthy(Engine& e) {
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto h = e.health();
  while (h.success && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    h = e.health();
  }
  return h;
}

// Runs `call` on a thread of its own and returns its future.
template <class F>
auto async_call(F call) {
  return std::async(std::launch::async, std::move(call));
}

} // namespace

BOOST_AUTO_TEST_SUITE(actor_death_sim_test)

BOOST_AUTO_TEST_CASE(every_request_is_answered_after_an_actor_dies) {
  auto model = tiny_model("actor-death", 0);
  auto draft = tiny_model("actor-death-draft", 7);
  for (std::string kind : {"tokenizer", "scheduler", "weight_updater", "runner", "draft_runner"}) {
    BOOST_TEST_CONTEXT(kind << " killed") {
      auto e = kind == "draft_runner" ? start(model, draft) : start(model);
      auto running = e->generate_async(greedy({1, 2, 3}, 300));
      BOOST_REQUIRE(e->kill_actor_for_test(kind).has_value());
      auto out = answered(running);
      // Generation needs neither the updater nor the draft (it only speeds decoding up).
      bool serves = kind == "weight_updater" || kind == "draft_runner";
      if (serves)
        BOOST_TEST(out.success, out.message);
      else if (!out.success)
        BOOST_TEST(!out.message.empty());
      auto later = e->generate(greedy({1}, 2));
      BOOST_TEST(later.success == serves, later.message);
      if (!later.success)
        BOOST_TEST(!later.message.empty());
      // Weight updates need every part (the draft's weights are updated too).
      auto b = e->begin_weight_update();
      BOOST_TEST(!b.success);
      BOOST_TEST(!b.message.empty());
      // Whatever part is gone, the engine needs a restart and says so.
      auto h = eventually_unhealthy(*e);
      BOOST_TEST(!h.success);
      BOOST_TEST(!h.message.empty());
      BOOST_TEST(!e->get_server_info().success);
      e.reset(); // shuts down cleanly (a hang here fails the test by its ctest timeout)
    }
  }
  BOOST_TEST(!start(model)->kill_actor_for_test("nobody").has_value());
  BOOST_TEST(!start(model)->kill_actor_for_test("draft_runner").has_value()); // no draft loaded
}

// The dead actor held the requests: the tokenizer a generate waiting at the paused gate, the
// scheduler a running request and a flush waiting for it to end.
BOOST_AUTO_TEST_CASE(requests_an_actor_held_are_answered_when_it_dies) {
  auto model = tiny_model("actor-death", 0);
  {
    auto e = start(model);
    BOOST_REQUIRE(e->pause_generation({pause_mode::abort}).success);
    auto waiting = e->generate_async(greedy({1, 2}, 4)); // held by the front door until continue
    BOOST_REQUIRE(e->kill_actor_for_test("tokenizer").has_value());
    auto out = answered(waiting);
    BOOST_TEST(!out.success);
    BOOST_TEST(!out.message.empty());
  }
  {
    auto e = start(model);
    auto first = std::make_shared<std::promise<void>>();
    auto first_seen = first->get_future();
    auto once = std::make_shared<std::once_flag>();
    auto on_chunk = [first, once](const GenerateReqOutput&) {
      std::call_once(*once, [&] { first->set_value(); });
    };
    auto running = e->generate_async(greedy({1, 2, 3}, 2000), on_chunk);
    BOOST_REQUIRE(first_seen.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    // in_place: the request stays running, so the flush waits for it inside the scheduler.
    BOOST_REQUIRE(e->pause_generation({pause_mode::in_place}).success);
    BOOST_REQUIRE(e->get_server_info().running_requests == 1);
    auto flush = async_call([&] { return e->flush_cache(FlushCacheReqInput{600.0}); });
    // The flush is held by the scheduler or, if the kill overtakes it, refused by a dead one:
    // answered either way.
    BOOST_REQUIRE(e->kill_actor_for_test("scheduler").has_value());
    auto f = answered(flush);
    BOOST_TEST(!f.success);
    BOOST_TEST(!f.message.empty());
    auto out = answered(running);
    BOOST_TEST(!out.success);
  }
}

// The chunk sink of a streaming generate_async runs the caller's callback: one that throws
// used to end the sink before it handed over the last chunk, and the call's future (which waits
// for the reply and the sink's end) never became ready. Now the exception is reported, every
// chunk still reaches the callback, and the call completes.
BOOST_AUTO_TEST_CASE(a_throwing_chunk_callback_neither_ends_the_sink_nor_hangs_the_call) {
  auto e = start(tiny_model("actor-death", 0));
  auto chunks = std::make_shared<std::atomic<int>>(0);
  auto running = e->generate_async(greedy({1, 2, 3}, 6), [chunks](const GenerateReqOutput&) {
    ++*chunks;
    throw std::runtime_error("the caller's callback failed");
  });
  auto out = answered(running);
  BOOST_TEST(out.success, out.message);
  BOOST_TEST(out.output_ids.size() == 6u);
  BOOST_TEST(chunks->load() >= 2); // called again after it threw, the final chunk included
  BOOST_TEST(e->generate(greedy({1}, 2)).success);
  BOOST_TEST(e->health().success);
}

BOOST_AUTO_TEST_SUITE_END()
