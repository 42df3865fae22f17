// Deadlock and lost-request tests for every ordering of pause / begin / end / continue
// (docs/sglang-contract.md, 'The pause-aware update lock'), in each pause mode, with requests
// running and one abort(rid) in the middle. Each control call is issued on its own thread in the
// given order; all of them, and every request, must return within a deadline (a deadlock fails the
// test instead of hanging CI), and afterwards the engine must be unpaused, without a session, and
// serving.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <future>
#include <string>
#include <thread>

#include "tests/support/engine_support.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

enum class op { pause, begin, end, resume };

const char* name(op o) {
  switch (o) {
    case op::pause: return "pause";
    case op::begin: return "begin";
    case op::end: return "end";
    case op::resume: return "continue";
  }
  return "?";
}

const char* name(pause_mode m) {
  return m == pause_mode::abort ? "abort" : m == pause_mode::retract ? "retract" : "in_place";
}

constexpr auto k_deadline = std::chrono::seconds(20);

} // namespace

BOOST_AUTO_TEST_SUITE(update_orderings_sim_test)

BOOST_AUTO_TEST_CASE(every_ordering_of_pause_begin_end_continue_finishes) {
  auto dir = tiny_model("target", 61);
  auto update = perturbed(dir, 62);
  auto e = start(dir);
  int orderings = 0;
  for (auto mode : {pause_mode::abort, pause_mode::retract, pause_mode::in_place}) {
    std::array<op, 4> order{op::pause, op::begin, op::end, op::resume};
    std::sort(order.begin(), order.end());
    do {
      std::string label = std::string(name(mode)) + ":";
      for (auto o : order)
        label += std::string(" ") + name(o);
      BOOST_TEST_CONTEXT(label) {
        ++orderings;
        std::vector<std::future<GenerateReqOutput>> requests;
        for (int i = 0; i < 6; ++i) {
          auto r = greedy({1, 2, 3, i}, 300 + 20 * i);
          r.rid = "req-" + std::to_string(i);
          requests.push_back(e->generate_async(r));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::vector<std::future<std::pair<bool, std::string>>> calls;
        for (std::size_t step = 0; step < order.size(); ++step) {
          auto o = order[step];
          calls.push_back(std::async(std::launch::async, [&, o]() -> std::pair<bool, std::string> {
            switch (o) {
              case op::pause: {
                auto r = e->pause_generation({mode});
                return {r.success, r.message};
              }
              case op::begin: {
                auto r = e->begin_weight_update({});
                if (!r.success)
                  return {false, r.message};
                UpdateWeightsFromTensorReqInput u;
                u.named_tensors = update;
                auto s = e->update_weights_from_tensor(u);
                return {s.success, s.message};
              }
              case op::end: {
                auto r = e->end_weight_update({});
                return {r.success, r.message};
              }
              case op::resume: {
                auto r = e->continue_generation({});
                return {r.success, r.message};
              }
            }
            return {false, "unknown op"};
          }));
          std::this_thread::sleep_for(std::chrono::milliseconds(3));
          if (step == 1) // an abort in the middle of it all
            BOOST_TEST(e->abort({"req-5", false, "test abort"}).success);
        }
        for (std::size_t step = 0; step < calls.size(); ++step) {
          BOOST_TEST_CONTEXT("call " << name(order[step])) {
            // A call may legitimately wait for a later one (continue waits for end; an
            // unpaused begin for the running requests), so all are collected with one deadline.
            BOOST_REQUIRE_MESSAGE(calls[step].wait_for(k_deadline) == std::future_status::ready,
                                  "deadlock: " << name(order[step]) << " never returned");
            auto [ok, message] = calls[step].get();
            BOOST_TEST_MESSAGE(label << ": " << name(order[step]) << " -> " << ok << " " << message);
          }
        }
        // Clean up what the ordering left: an open session, a pause.
        if (e->get_server_info().weight_update_session_open)
          BOOST_TEST(e->end_weight_update({}).success);
        if (e->get_server_info().paused)
          BOOST_TEST(e->continue_generation({}).success);
        for (auto& f : requests) {
          BOOST_REQUIRE_MESSAGE(f.wait_for(k_deadline) == std::future_status::ready,
                                "a request never ended");
          auto out = f.get();
          BOOST_TEST(out.finished);
          bool aborted = out.finish_reason && out.finish_reason->type == "abort";
          // Only the aborted request, or everything in abort mode, may end early.
          if (out.rid != "req-5" && mode != pause_mode::abort)
            BOOST_TEST(!aborted, out.rid << " was aborted: " << out.message);
        }
        auto info = e->get_server_info();
        BOOST_TEST(!info.paused);
        BOOST_TEST(!info.weight_update_session_open);
        BOOST_TEST(info.running_requests == 0);
        BOOST_TEST(e->generate(greedy({5, 6}, 3)).success);
      }
    } while (std::next_permutation(order.begin(), order.end()));
  }
  BOOST_TEST(orderings == 3 * 24);
}

BOOST_AUTO_TEST_CASE(control_calls_while_paused_never_wait_for_frozen_requests) {
  // post_process_weights, update_weight_version, check_weights and a disk update while paused
  // in place or retracted: each returns although paused requests still hold the front door
  // (the writer-lock deadlock of sglang #22211 / #29670), and none aborts anything.
  auto dir = tiny_model("target", 61);
  for (auto mode : {pause_mode::retract, pause_mode::in_place}) {
    BOOST_TEST_CONTEXT(name(mode)) {
      auto e = start(dir);
      auto running = e->generate_async(greedy({4, 4}, 600));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      BOOST_REQUIRE(e->pause_generation({mode}).success);
      auto within = [&](auto fn) {
        auto f = std::async(std::launch::async, fn);
        BOOST_REQUIRE_MESSAGE(f.wait_for(k_deadline) == std::future_status::ready, "deadlock");
        return f.get();
      };
      PostProcessWeightsReqInput pp;
      within([&] { return e->post_process_weights(pp).message; });
      UpdateWeightVersionReqInput v;
      v.new_version = "labelled";
      BOOST_TEST(within([&] { return e->update_weight_version(v).success; }));
      BOOST_TEST(within([&] { return e->check_weights({}).success; }));
      UpdateWeightFromDiskReqInput disk;
      disk.model_path = dir.string();
      BOOST_TEST(within([&] { return e->update_weights_from_disk(disk).success; }));
      BOOST_REQUIRE(e->continue_generation({}).success);
      auto out = running.get();
      BOOST_TEST(out.success);
      BOOST_TEST(out.completion_tokens == 600); // nothing aborted it
    }
  }
}

BOOST_AUTO_TEST_CASE(pause_is_idempotent_and_continue_without_pause_is_harmless) {
  auto e = start(tiny_model("target", 61));
  BOOST_TEST(e->continue_generation({}).success);
  BOOST_TEST(e->pause_generation({pause_mode::retract}).success); // nothing running
  BOOST_TEST(e->pause_generation({pause_mode::retract}).success);
  BOOST_TEST(e->pause_generation({pause_mode::in_place}).success);
  auto held = e->generate_async(greedy({1, 2}, 3));
  BOOST_TEST((held.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout));
  BOOST_TEST(e->continue_generation({}).success);
  BOOST_TEST(e->continue_generation({}).success);
  BOOST_TEST(held.get().success);
}

BOOST_AUTO_TEST_SUITE_END()
