// The update-ordering and pause-mode scenarios under the deterministic test coordinator
// (tests/support/actor_sim.hpp): each seed picks the scenario's choices (pause mode, the order
// and timing of the control calls, request lengths) and the order in which actors handle their
// mail, so hundreds of interleavings run per test and a failure names the seed that replays it:
//
//   RLSERVE_SIM_SEED=1234 build/tests/rlserve_actors_tests --run_test=seeded_orderings_sim_test
//
// What must hold in every interleaving: no call or request waits forever (a run that stops with
// nothing left to deliver is a deadlock), every request ends exactly once, only what the pause
// mode allows is aborted, the engine ends unpaused, without a session and serving, and every
// token is the greedy choice of the weights its version span names.
#include <boost/test/unit_test.hpp>

#include <array>
#include <string>
#include <vector>

#include "tests/support/actor_sim.hpp"
#include "tests/support/engine_support.hpp"
#include "tests/support/greedy_check.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

template <class T>
using slot = std::shared_ptr<std::optional<T>>;

const char* name(pause_mode m) {
  return m == pause_mode::abort ? "abort" : m == pause_mode::retract ? "retract" : "in_place";
}

// A control call in flight: whether it was answered, and then (success, message).
using outcome = std::pair<bool, std::string>;
struct pending_call {
  std::string what;
  slot<outcome> result = std::make_shared<std::optional<outcome>>();
};

template <class Out>
auto record(slot<outcome> result) {
  return [result](Out& out) { *result = outcome{out.success, out.message}; };
}

auto record_error(slot<outcome> result) {
  return [result](caf::error&) { *result = outcome{false, "no answer"}; };
}

template <class Out, class In>
pending_call call(actor_sim& sim, std::string what, In req) {
  pending_call c{std::move(what)};
  sim.spawn_client(
    [](caf::event_based_actor* self, tokenizer_actor front, In req, slot<outcome> r) {
      self->request(front, caf::infinite, std::move(req)).then(record<Out>(r), record_error(r));
    },
    sim.front(), std::move(req), c.result);
  return c;
}

// begin_weight_update, then (if it opened) one update_weights_from_tensor, from one client.
pending_call update_session(actor_sim& sim, std::vector<NamedTensor> update) {
  pending_call c{"begin+update"};
  sim.spawn_client(
    [](caf::event_based_actor* self, tokenizer_actor front, std::vector<NamedTensor> update,
       slot<outcome> r) {
    self->request(front, caf::infinite, BeginWeightUpdateReqInput{})
      .then(
        [self, front, update, r](BeginWeightUpdateReqOutput& begun) {
          if (!begun.success) {
            *r = outcome{false, begun.message};
            return;
          }
          UpdateWeightsFromTensorReqInput u;
          u.named_tensors = update;
          self->request(front, caf::infinite, std::move(u))
            .then(record<UpdateWeightsFromTensorReqOutput>(r), record_error(r));
        },
        record_error(r));
    },
    sim.front(), std::move(update), c.result);
  return c;
}

std::vector<GenerateReqInput> random_requests(actor_sim& sim, int n, int first_id, int max_tokens) {
  std::vector<GenerateReqInput> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(2 + sim.random(20));
    for (auto& t : prompt)
      t = static_cast<int32_t>(sim.random(500));
    auto r = greedy(std::move(prompt), static_cast<int32_t>(1 + sim.random(max_tokens)));
    r.rid = "r" + std::to_string(first_id + i);
    out.push_back(std::move(r));
  }
  return out;
}

template <class T>
bool all_answered(const std::vector<slot<T>>& slots) {
  return std::all_of(slots.begin(), slots.end(), [](const auto& s) { return s->has_value(); });
}

// Ends what a scenario left open: an update session, a pause.
void close_what_is_open(actor_sim& sim) {
  auto info = sim.ask<GetServerInfoReqOutput>(GetServerInfoReqInput{});
  BOOST_REQUIRE(sim.run_until([&] { return info->has_value(); }));
  if ((*info)->weight_update_session_open) {
    auto end = sim.ask<EndWeightUpdateReqOutput>(EndWeightUpdateReqInput{});
    BOOST_REQUIRE(sim.run_until([&] { return end->has_value(); }));
    BOOST_TEST((*end)->success, (*end)->message);
  }
  if ((*info)->paused) {
    auto resumed = sim.ask<ContinueGenerationReqOutput>(ContinueGenerationReqInput{});
    BOOST_REQUIRE(sim.run_until([&] { return resumed->has_value(); }));
    BOOST_TEST((*resumed)->success, (*resumed)->message);
  }
}

// After a scenario and its clean-up: the engine is idle, unpaused, without a session, serving.
void check_engine_serves(actor_sim& sim) {
  auto probe = sim.generate(greedy({5, 6}, 3));
  BOOST_REQUIRE_MESSAGE(sim.run_until([&] { return probe->has_value(); }),
                        "the engine does not serve after the scenario");
  BOOST_TEST((*probe)->success, (*probe)->message);
  auto after = sim.ask<GetServerInfoReqOutput>(GetServerInfoReqInput{});
  BOOST_REQUIRE(sim.run_until([&] { return after->has_value(); }));
  BOOST_TEST(!(*after)->paused);
  BOOST_TEST(!(*after)->weight_update_session_open);
  BOOST_TEST((*after)->running_requests == 0);
  BOOST_TEST((*after)->waiting_requests == 0);
}

} // namespace

BOOST_AUTO_TEST_SUITE(seeded_orderings_sim_test)

// pause / begin+update / end / continue sent in a seeded order at seeded moments while six
// requests run, and an abort of one of them somewhere in between: the threaded version of this
// test (update_orderings_sim_test) tries each order once; here every seed also picks how the
// actors' mail interleaves.
BOOST_AUTO_TEST_CASE(control_calls_in_any_order_and_interleaving_finish) {
  auto dir = tiny_model("target", 61);
  auto update = perturbed(dir, 62);
  int seeds = 0, pause_aborts = 0, commits = 0;
  for (auto seed : sim_seeds(1000, 300)) {
    actor_sim sim(dir, seed);
    auto mode = static_cast<pause_mode>(1 + sim.random(3)); // abort, retract, in_place
    enum op { pause, begin_update, end, resume };
    std::array<op, 4> order{pause, begin_update, end, resume};
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    std::string label;
    for (auto o : order)
      label += std::string(" ") + std::array{"pause", "begin+update", "end", "continue"}[o];
    BOOST_TEST_CONTEXT("seed " << seed << ": " << name(mode) << "," << label) {
      ++seeds;
      std::vector<slot<GenerateReqOutput>> outs;
      for (int i = 0; i < 6; ++i) {
        auto r = greedy({1, 2, 3, i}, static_cast<int32_t>(4 + sim.random(24)));
        r.rid = "req-" + std::to_string(i);
        outs.push_back(sim.generate(r));
      }
      std::vector<pending_call> calls;
      const auto abort_at = sim.random(order.size() + 1);
      for (std::size_t k = 0; k <= order.size(); ++k) {
        sim.run_steps(sim.random(40));
        if (k == abort_at)
          calls.push_back(call<AbortReqOutput>(sim, "abort req-5", AbortReq{"req-5", false, "test abort"}));
        if (k == order.size())
          break;
        switch (order[k]) {
          case pause:
            calls.push_back(call<PauseGenerationReqOutput>(sim, "pause", PauseGenerationReqInput{mode}));
            break;
          case begin_update: calls.push_back(update_session(sim, update)); break;
          case end:
            calls.push_back(call<EndWeightUpdateReqOutput>(sim, "end", EndWeightUpdateReqInput{}));
            break;
          case resume:
            calls.push_back(call<ContinueGenerationReqOutput>(sim, "continue", ContinueGenerationReqInput{}));
            break;
        }
      }
      // A call may wait for a later one (continue for end; an unpaused begin for the running
      // requests), so the run goes on until all are answered. Requests may still wait after
      // that (paused, or behind a session the order left open) until the clean-up.
      bool answered = sim.run_until([&] {
        return std::all_of(calls.begin(), calls.end(), [](const auto& c) { return c.result->has_value(); });
      });
      for (auto& c : calls)
        BOOST_TEST(c.result->has_value(), "deadlock: " << c.what << " was never answered");
      BOOST_REQUIRE_MESSAGE(answered, "deadlock after " << sim.steps() << " steps");
      close_what_is_open(sim);
      BOOST_REQUIRE_MESSAGE(sim.run_until([&] { return all_answered(outs); }),
                            "a request never ended (" << sim.steps() << " steps)");
      for (auto& c : calls)
        if (c.what == "end" && (*c.result)->first)
          ++commits;
      for (auto& s : outs) {
        const auto& out = **s;
        BOOST_TEST(out.finished);
        bool aborted = out.finish_reason && out.finish_reason->type == "abort";
        // Only the aborted request, or anything running in abort mode, may end early.
        if (out.rid != "req-5" && mode != pause_mode::abort)
          BOOST_TEST(!aborted, out.rid << " was aborted: " << out.message);
        if (aborted && out.rid != "req-5")
          ++pause_aborts;
        if (!aborted)
          BOOST_TEST(out.success, out.rid << ": " << out.message);
      }
      check_engine_serves(sim);
    }
  }
  BOOST_TEST_MESSAGE(seeds << " seeds: " << commits << " sessions committed, " << pause_aborts
                           << " requests aborted by a pause");
  if (seeds > 1) {
    BOOST_TEST(commits > 0);
    BOOST_TEST(pause_aborts > 0);
  }
}

// The pause-mode scenario of pause_modes_sim_test, small and from seeds: requests run, a pause
// in the seed's mode comes at a seeded moment, then a session that updates every weight while
// more requests arrive, then continue. Every token is checked against the weights its version
// span names (the old weights, the new ones from scratch, or the new ones on the old KV when
// paused in place).
BOOST_AUTO_TEST_CASE(pause_modes_around_an_update_in_any_interleaving) {
  auto dir = tiny_model("target", 51);
  auto update = perturbed(dir, 52);
  auto old_model = load_model(dir);
  auto new_model = load_model(dir, &update);
  int seeds = 0, spanning = 0, aborted = 0;
  for (auto seed : sim_seeds(5000, 200)) {
    actor_sim sim(dir, seed, sim_options{.max_running_requests = 6});
    auto mode = static_cast<pause_mode>(1 + sim.random(3)); // abort, retract, in_place
    BOOST_TEST_CONTEXT("seed " << seed << ": " << name(mode)) {
      ++seeds;
      auto inputs = random_requests(sim, 10, 0, 16);
      auto wave2 = random_requests(sim, 4, 10, 16);
      std::vector<slot<GenerateReqOutput>> outs;
      for (auto& r : inputs)
        outs.push_back(sim.generate(r));
      sim.run_steps(sim.random(120));
      // One client runs the trainer's sequence; wave 2 arrives once the session is open.
      auto script = std::make_shared<std::optional<outcome>>();
      auto session_open = std::make_shared<bool>(false);
      sim.spawn_client([](caf::event_based_actor* self, tokenizer_actor front, pause_mode mode,
                          std::vector<NamedTensor> update, decltype(script) script,
                          std::shared_ptr<bool> session_open) {
        auto fail = [script](std::string why) { *script = outcome{false, std::move(why)}; };
        self->request(front, caf::infinite, PauseGenerationReqInput{mode}).then(
          [=](PauseGenerationReqOutput& p) {
            if (!p.success)
              return fail("pause: " + p.message);
            self->request(front, caf::infinite, BeginWeightUpdateReqInput{}).then(
              [=](BeginWeightUpdateReqOutput& b) {
                if (!b.success)
                  return fail("begin: " + b.message);
                *session_open = true;
                UpdateWeightsFromTensorReqInput u;
                u.named_tensors = update;
                self->request(front, caf::infinite, std::move(u)).then(
                  [=](UpdateWeightsFromTensorReqOutput& s) {
                    if (!s.success)
                      return fail("update: " + s.message);
                    self->request(front, caf::infinite, EndWeightUpdateReqInput{}).then(
                      [=](EndWeightUpdateReqOutput& e) {
                        if (!e.success)
                          return fail("end: " + e.message);
                        self->request(front, caf::infinite, ContinueGenerationReqInput{}).then(
                          [=](ContinueGenerationReqOutput& c) { *script = outcome{c.success, c.message}; },
                          record_error(script));
                      },
                      record_error(script));
                  },
                  record_error(script));
              },
              record_error(script));
          },
          record_error(script));
      }, sim.front(), mode, update, script, session_open);
      BOOST_REQUIRE_MESSAGE(sim.run_until([&] { return *session_open || script->has_value(); }),
                            "deadlock before the session opened");
      for (auto& r : wave2) {
        inputs.push_back(r);
        outs.push_back(sim.generate(r));
      }
      BOOST_REQUIRE_MESSAGE(sim.run_until([&] { return script->has_value() && all_answered(outs); }),
                            "deadlock or lost request after " << sim.steps() << " steps");
      BOOST_REQUIRE_MESSAGE((*script)->first, (*script)->second);
      for (std::size_t i = 0; i < outs.size(); ++i) {
        const auto& in = inputs[i];
        const auto& out = **outs[i];
        BOOST_TEST_CONTEXT("request " << out.rid) {
          BOOST_TEST(out.rid == *in.rid);
          BOOST_TEST(out.finished);
          auto n = out.output_ids.size();
          bool is_abort = out.finish_reason && out.finish_reason->type == "abort";
          if (is_abort) {
            ++aborted;
            BOOST_TEST((mode == pause_mode::abort));
            BOOST_TEST(i < 10u); // only requests submitted before the pause
          } else {
            BOOST_TEST(out.success, out.message);
            BOOST_TEST(n == static_cast<std::size_t>(in.sampling_params.max_new_tokens));
          }
          const std::size_t split = first_token_of_version(out, "1"); // where the new weights begin
          if (i >= 10u)
            BOOST_TEST(split == 0u); // arrived during the session: new weights only
          if (mode == pause_mode::abort)
            BOOST_TEST((split == 0 || split == n)); // nothing survives the pause to span two
          if (split > 0 && split < n)
            ++spanning;
          check_tokens_follow_their_weights(*old_model, *new_model, mode, in, out, split);
        }
      }
      close_what_is_open(sim); // nothing: the script ended its session and continued
      check_engine_serves(sim);
    }
  }
  BOOST_TEST_MESSAGE(seeds << " seeds: " << spanning << " requests spanning both weights, "
                           << aborted << " aborted by a pause");
  if (seeds > 1) {
    BOOST_TEST(spanning > 0);
    BOOST_TEST(aborted > 0);
  }
}

BOOST_AUTO_TEST_SUITE_END()
