// The weight-update group's actor (actors/weight_group_actor.hpp) ended while it joins a
// trainer's store that accepts and never answers (tests/support/fake_tcp_store.hpp, silent): as
// actor_death_sim_test does for the engine's other actors, the init request must be answered
// with an error saying what happened, the engine must serve on (generate, a new init and destroy
// of the same group, no update session left open), and nothing may wait for the trainer's
// deadline (600 s here): not the init, not a destroy, not the engine's shutdown.
//
// A CPU runner stands in for a GPU one (its manifest says cuda:0 and takes groups), as in
// weight_group_test: joining through a store needs neither NCCL nor a GPU. The graph is the
// engine's (runner, weight_updater, scheduler, front door) on CAF's threads; the weight_updater
// is given a group spawner that keeps each group actor's address, so the test can end one as a
// crash would.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "actors/runner_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/tokenizer_actor.hpp"
#include "actors/weight_group_actor.hpp"
#include "actors/weight_updater_actor.hpp"
#include "caf/all.hpp"
#include "messages/all.hpp"
#include "tests/support/engine_support.hpp"
#include "tests/support/fake_tcp_store.hpp"

using namespace rlserve;
using namespace rlserve::test;
using namespace std::chrono_literals;

namespace {

// A hang guard, not a timing assertion: with the trainer's deadline at 600 s, an answer that
// comes only at the deadline fails here.
constexpr auto k_answer_within = std::chrono::seconds(60);

using seconds = std::chrono::duration<double>;

// The group actors the weight_updater spawned, in order. Addresses, not handles: a handle kept
// here would keep an ended detached actor from being destroyed, and the actor system waits for
// that at its end.
struct spawned_groups {
  std::mutex mu;
  std::vector<caf::actor_addr> actors;

  caf::actor_addr last() {
    std::lock_guard lock(mu);
    return actors.empty() ? caf::actor_addr{} : actors.back();
  }
};

struct graph {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  runner_actor runner;
  weight_updater_actor updater;
  scheduler_actor scheduler;
  tokenizer_actor front;
  std::shared_ptr<spawned_groups> groups = std::make_shared<spawned_groups>();
  std::vector<caf::actor> clients;

  graph() {
    cfg.add_message_types<caf::id_block::rlserve>();
    sys = std::make_unique<caf::actor_system>(cfg);
    const auto dir = tiny_model("weight-group-death", 5);
    std::shared_ptr<model::qwen3_model> model = load_model(dir);
    runner_options ro;
    ro.model_path = dir;
    runner = spawn_cpu_runner(*sys, ro, model);
    RunnerManifest manifest;
    {
      caf::scoped_actor self{*sys};
      self->request(runner, caf::infinite, manifest_atom_v)
        .receive([&](RunnerManifest& m) { manifest = std::move(m); },
                 [&](caf::error& e) { BOOST_FAIL(sys->render(e)); });
    }
    manifest.device = "cuda:0";
    manifest.capabilities.weight_update_groups = true;
    manifest.capabilities.device_tensors = true;
    auto keep = groups;
    updater = spawn_weight_updater(
      *sys, {{runner, manifest}}, "0", false,
      [keep](caf::actor_system& s, std::shared_ptr<std::atomic<bool>> cancel) {
        auto a = spawn_weight_group(s, std::move(cancel));
        std::lock_guard lock(keep->mu);
        keep->actors.push_back(a.address());
        return a;
      });
    scheduler_options so;
    so.speculative_num_draft_tokens = 0;
    scheduler = spawn_scheduler(*sys, so, runner, runner_actor{}, manifest, updater, "0", nullptr);
    front_door_info info;
    info.model_path = dir.string();
    info.device = manifest.device;
    info.architecture = manifest.architecture;
    info.vocab_size = manifest.vocab_size;
    info.max_context_length = manifest.max_context_length;
    front = spawn_tokenizer(*sys, scheduler, nullptr, std::move(info));
  }

  ~graph() { shut_down(); }

  // Ends every actor and the actor system; returns how long that took.
  double shut_down() {
    if (!sys)
      return 0;
    auto started = std::chrono::steady_clock::now();
    for (auto& c : clients)
      caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(front, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(updater, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(runner, caf::exit_reason::user_shutdown);
    front = tokenizer_actor{};
    scheduler = scheduler_actor{};
    updater = weight_updater_actor{};
    runner = runner_actor{};
    clients.clear();
    sys.reset(); // waits for every actor, detached ones included
    return seconds(std::chrono::steady_clock::now() - started).count();
  }

  // Sends `msg` (and `extra...`) to the front door from a client actor of its own; the future
  // holds the reply (a CAF error becomes success = false).
  template <class Out, class In, class... Extra>
  std::future<Out> ask_async(In msg, Extra... extra) {
    auto done = std::make_shared<std::promise<Out>>();
    auto fut = done->get_future();
    // Inputs as spawn arguments: CAF 0.17 mishandles a function actor spawned without any.
    auto client = sys->spawn(
      [](caf::event_based_actor* self, tokenizer_actor front, std::shared_ptr<std::promise<Out>> done,
         In msg, Extra... extra) {
        self->request(front, caf::infinite, std::move(msg), std::move(extra)...)
          .then([self, done](Out& out) { done->set_value(std::move(out)); self->quit(); },
                [self, done](caf::error& e) {
                  Out out;
                  out.success = false;
                  out.message = "CAF error: " + self->system().render(e);
                  done->set_value(std::move(out));
                  self->quit();
                });
      },
      front, done, std::move(msg), std::move(extra)...);
    clients.push_back(client);
    return fut;
  }

  template <class Out, class In, class... Extra>
  Out ask(In msg, Extra... extra) {
    auto f = ask_async<Out>(std::move(msg), std::move(extra)...);
    BOOST_REQUIRE(f.wait_for(k_answer_within) == std::future_status::ready);
    return f.get();
  }

  GenerateReqOutput generate(GenerateReqInput req) {
    return ask<GenerateReqOutput>(std::move(req), caf::actor{});
  }
};

// The trainer's deadline is 600 s: no answer may wait for it.
InitWeightsUpdateGroupReqInput init_request(int port) { return join_request(port, 600); }

// Starts an init against `store`, which never answers, and returns once the engine's rank is
// waiting in the rendezvous: connected, its group actor known.
std::future<InitWeightsUpdateGroupReqOutput> init_waiting_on(graph& g, const fake_tcp_store& store) {
  const int before = store.accepted();
  auto init = g.ask_async<InitWeightsUpdateGroupReqOutput>(init_request(store.port()));
  auto give_up = std::chrono::steady_clock::now() + k_answer_within;
  while ((store.accepted() == before || !g.groups->last()) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(10ms);
  BOOST_REQUIRE(store.accepted() > before);
  BOOST_REQUIRE(init.wait_for(200ms) == std::future_status::timeout); // it is waiting
  return init;
}

// The engine serves on: generate, healthy, no update session left open, a new init and destroy
// of the same group (through a store that answers), and a session can still be opened and
// closed.
void serves_on(graph& g) {
  auto out = g.generate(greedy({1, 2, 3}, 4));
  BOOST_TEST(out.success, out.message);
  BOOST_TEST(out.output_ids.size() == 4u);
  auto info = g.ask<GetServerInfoReqOutput>(GetServerInfoReqInput{});
  BOOST_TEST(info.success, info.message);
  BOOST_TEST(!info.weight_update_session_open);
  auto health = g.ask<HealthCheckReqOutput>(HealthCheckReqInput{}); // a group is not the graph
  BOOST_TEST(health.success, health.message);
  fake_tcp_store store;
  auto joined = g.ask<InitWeightsUpdateGroupReqOutput>(init_request(store.port()));
  BOOST_TEST(joined.success, joined.message);
  auto left = g.ask<DestroyWeightsUpdateGroupReqOutput>(DestroyWeightsUpdateGroupReqInput{"G"});
  BOOST_TEST(left.success, left.message);
  auto begun = g.ask<BeginWeightUpdateReqOutput>(BeginWeightUpdateReqInput{});
  BOOST_TEST(begun.success, begun.message);
  auto ended = g.ask<EndWeightUpdateReqOutput>(EndWeightUpdateReqInput{});
  BOOST_TEST(ended.success, ended.message);
}

// The rendezvous's connection was closed by the engine: its wait ended, not left to the deadline.
void hung_up(const fake_tcp_store& store, int connections) {
  auto give_up = std::chrono::steady_clock::now() + k_answer_within;
  while (store.hung_up() < connections && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(10ms);
  BOOST_TEST(store.hung_up() == connections);
}

} // namespace

BOOST_AUTO_TEST_SUITE(weight_group_death_sim_test)

BOOST_AUTO_TEST_CASE(a_group_actor_ended_while_it_joins_answers_the_init) {
  for (auto reason : {caf::exit_reason::kill, caf::exit_reason::user_shutdown}) {
    BOOST_TEST_CONTEXT("exit reason " << caf::to_string(reason)) {
      graph g;
      fake_tcp_store store{fake_tcp_store::silent};
      auto init = init_waiting_on(g, store);
      caf::anon_send_exit(g.groups->last(), reason);
      BOOST_REQUIRE(init.wait_for(k_answer_within) == std::future_status::ready);
      auto out = init.get();
      BOOST_TEST(!out.success);
      BOOST_TEST(contains(out.message, "weight-update group \"G\" stopped while joining"), out.message);
      BOOST_TEST(contains(out.message, caf::to_string(reason)), out.message);
      hung_up(store, 1);
      serves_on(g);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_destroy_while_the_group_joins_cuts_the_join_short) {
  graph g;
  fake_tcp_store store{fake_tcp_store::silent};
  auto init = init_waiting_on(g, store);
  auto left = g.ask<DestroyWeightsUpdateGroupReqOutput>(DestroyWeightsUpdateGroupReqInput{"G"});
  BOOST_TEST(left.success, left.message);
  BOOST_REQUIRE(init.wait_for(k_answer_within) == std::future_status::ready);
  auto out = init.get();
  BOOST_TEST(!out.success);
  BOOST_TEST(contains(out.message, "destroyed"), out.message);
  BOOST_TEST(contains(out.message, "127.0.0.1:" + std::to_string(store.port())), out.message);
  hung_up(store, 1);
  serves_on(g);
}

BOOST_AUTO_TEST_CASE(the_engine_stops_without_waiting_for_a_join) {
  graph g;
  fake_tcp_store store{fake_tcp_store::silent};
  auto init = init_waiting_on(g, store);
  BOOST_TEST(g.shut_down() < 30.0); // not the trainer's 600 s
  hung_up(store, 1);
}

BOOST_AUTO_TEST_SUITE_END()
