// The engine's actor graph (a CPU runner over a real model, the weight_updater, the scheduler and
// the tokenizer front door) under CAF's deterministic test coordinator: there are no worker
// threads; the test runs one message at a time and picks, from a seed, which actor with queued
// mail runs next. Every interleaving of message deliveries the real scheduler could produce
// between actors is one a seed can pick (mail between two actors stays in order, as CAF
// guarantees), and a failing seed replays exactly.
//
//   actor_sim sim(model_dir, seed);
//   auto out = sim.generate(greedy({1, 2, 3}, 8));          // a client actor sends it
//   auto paused = sim.ask<PauseGenerationReqOutput>(PauseGenerationReqInput{pause_mode::retract});
//   BOOST_REQUIRE(sim.run_until([&] { return out->has_value() && paused->has_value(); }));
//
// Time: timeouts (flush deadlines, health probes) fire only when no actor has mail, one at a
// time, as if the clock jumped to the next deadline while everyone waited. A run that stops with
// neither mail nor timeouts left before its goal is a deadlock.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "actors/runner_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/tokenizer_actor.hpp"
#include "actors/weight_updater_actor.hpp"
#include "caf/actor_system.hpp"
#include "caf/actor_system_config.hpp"
#include "caf/event_based_actor.hpp"
#include "caf/scheduler/test_coordinator.hpp"
#include "caf/scoped_actor.hpp"
#include "model/bpe_tokenizer.hpp"
#include "tests/support/engine_support.hpp"

namespace rlserve::test {

struct sim_options {
  int32_t max_running_requests = 16;
  int64_t max_batch_tokens = 1 << 14;
  int64_t kv_cache_tokens = 8192;
  int64_t kv_block_size = 16;
  bool prefix_cache = true;
};

// Seeds a test explores: `count` from `first`, or only $RLSERVE_SIM_SEED when it is set (to
// replay the seed a failure named). $RLSERVE_SIM_SEED_DIVISOR = d explores the first count / d
// (at least one): the sanitizer suite sets it, since every seed costs several times more there
// and the plain suite explores them all.
inline std::vector<uint64_t> sim_seeds(uint64_t first, std::size_t count) {
  if (const char* only = std::getenv("RLSERVE_SIM_SEED"))
    return {std::strtoull(only, nullptr, 10)};
  if (const char* divisor = std::getenv("RLSERVE_SIM_SEED_DIVISOR"))
    if (auto d = std::strtoull(divisor, nullptr, 10); d > 1)
      count = std::max<std::size_t>(1, count / d);
  std::vector<uint64_t> out(count);
  for (std::size_t i = 0; i < count; ++i)
    out[i] = first + i;
  return out;
}

class actor_sim {
public:
  actor_sim(const fs::path& model_dir, uint64_t seed, sim_options o = {}) : rng_(seed) {
    cfg_.add_message_types<caf::id_block::rlserve>();
    cfg_.set("scheduler.policy", caf::atom("testing"));
    cfg_.set("logger.file-verbosity", caf::atom("quiet"));
    cfg_.set("logger.console-verbosity", caf::atom("quiet"));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    sched_ = &dynamic_cast<caf::scheduler::test_coordinator&>(sys_->scheduler());
    sched_->clock().current_time += std::chrono::hours(1); // timestamps are never 0

    std::shared_ptr<model::qwen3_model> model = load_model(model_dir);
    std::shared_ptr<const model::bpe_tokenizer> tokenizer;
    if (fs::exists(model_dir / "tokenizer.json")) {
      auto tok = model::bpe_tokenizer::from_file(model_dir / "tokenizer.json");
      BOOST_REQUIRE(tok.has_value());
      tokenizer = std::make_shared<model::bpe_tokenizer>(std::move(*tok));
    }
    runner_options ro;
    ro.model_path = model_dir;
    ro.kv_block_size = o.kv_block_size;
    ro.kv_num_blocks = o.kv_cache_tokens / o.kv_block_size;
    ro.detached = false; // scheduled by the test coordinator like every other actor
    runner_ = spawn_cpu_runner(*sys_, ro, model);
    auto manifest = ask_actor<RunnerManifest>(runner_, manifest_atom_v);
    BOOST_REQUIRE(run_until([&] { return manifest->has_value(); }));
    manifest_ = **manifest;
    updater_ = spawn_weight_updater(*sys_, {{runner_, manifest_}}, "0");
    scheduler_options so;
    so.max_running_requests = o.max_running_requests;
    so.max_batch_tokens = o.max_batch_tokens;
    so.speculative_num_draft_tokens = 0;
    so.prefix_cache = o.prefix_cache;
    scheduler_ = spawn_scheduler(*sys_, so,
                                 runner_, runner_actor{}, manifest_, updater_, "0", tokenizer);
    front_door_info info;
    info.model_path = model_dir.string();
    info.device = "cpu";
    info.architecture = manifest_.architecture;
    info.vocab_size = manifest_.vocab_size;
    info.max_context_length = manifest_.max_context_length;
    front_ = spawn_tokenizer(*sys_, scheduler_, tokenizer, std::move(info));
  }

  ~actor_sim() {
    for (const auto& a : {caf::actor_cast<caf::actor>(front_), caf::actor_cast<caf::actor>(scheduler_),
                          caf::actor_cast<caf::actor>(updater_), caf::actor_cast<caf::actor>(runner_)})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched_->run(); // every actor, clients included, ends: their pending requests fail
  }

  actor_sim(const actor_sim&) = delete;
  actor_sim& operator=(const actor_sim&) = delete;

  // A client actor sends `req` to the front door; the slot holds the reply once it came (an
  // error becomes a reply with success = false).
  template <class Out, class In>
  std::shared_ptr<std::optional<Out>> ask(In req) {
    return ask_actor<Out>(front_, std::move(req));
  }

  std::shared_ptr<std::optional<GenerateReqOutput>> generate(GenerateReqInput req) {
    auto slot = std::make_shared<std::optional<GenerateReqOutput>>();
    // Inputs as spawn arguments (spawn_client says why).
    spawn_client(
      [](caf::event_based_actor* self, tokenizer_actor front, GenerateReqInput req, decltype(slot) s) {
        self->request(front, caf::infinite, std::move(req), caf::actor{})
          .then([s](GenerateReqOutput& out) { *s = std::move(out); },
                [s, self](caf::error& err) { *s = failed<GenerateReqOutput>(*self, err); });
      },
      front_, std::move(req), slot);
    return slot;
  }

  // Spawns a client actor: `f(self, args...)`. Its inputs must be arguments, not only captures:
  // CAF 0.17 dereferences a null argument tuple when a function-based actor is spawned without
  // arguments (UBSan reports it in the checking build).
  template <class F, class... Args>
  void spawn_client(F f, Args&&... args) {
    sys_->spawn(std::move(f), std::forward<Args>(args)...);
  }

  // Runs one message of an actor the seed picks; false when no actor has mail.
  bool step() {
    auto& jobs = sched_->jobs;
    if (jobs.empty())
      return false;
    auto pick = jobs.begin() + static_cast<std::ptrdiff_t>(rng_() % jobs.size());
    std::rotate(jobs.begin(), pick, pick + 1);
    sched_->run_once();
    ++steps_;
    return true;
  }

  // Runs `n` steps (fewer when everything waits).
  void run_steps(std::size_t n) {
    for (std::size_t i = 0; i < n && step(); ++i) {
    }
  }

  // Runs until `done()`; false when it stops before: nothing left to run (a deadlock) or
  // `max_steps` taken (a livelock).
  bool run_until(const std::function<bool()>& done, std::size_t max_steps = 2'000'000) {
    std::size_t taken = 0;
    while (!done()) {
      if (++taken > max_steps)
        return false;
      if (step())
        continue;
      if (sched_->has_pending_timeout()) {
        sched_->trigger_timeout();
        continue;
      }
      return false;
    }
    return true;
  }

  // A number from the seed's stream (scenario choices: lengths, when to send what).
  uint64_t random(uint64_t bound) { return rng_() % bound; }
  std::size_t steps() const { return steps_; }
  const RunnerManifest& manifest() const { return manifest_; }
  const tokenizer_actor& front() const { return front_; }
  caf::actor_system& system() { return *sys_; }

private:
  template <class Out>
  static Out failed(caf::event_based_actor& self, const caf::error& err) {
    Out out;
    out.success = false;
    out.message = "no answer: " + self.system().render(err);
    return out;
  }

  template <class Out, class Handle, class In>
  std::shared_ptr<std::optional<Out>> ask_actor(const Handle& dest, In req) {
    auto slot = std::make_shared<std::optional<Out>>();
    spawn_client(
      [](caf::event_based_actor* self, Handle dest, In req, decltype(slot) s) {
        self->request(dest, caf::infinite, std::move(req))
          .then([s](Out& out) { *s = std::move(out); },
                [s, self](caf::error& err) {
                  if constexpr (requires(Out o) { o.success; })
                    *s = failed<Out>(*self, err);
                  else
                    (void)self, (void)err; // a reply without success (a manifest): stays empty
                });
      },
      dest, std::move(req), slot);
    return slot;
  }

  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::scheduler::test_coordinator* sched_ = nullptr;
  std::mt19937_64 rng_;
  std::size_t steps_ = 0;
  RunnerManifest manifest_;
  runner_actor runner_;
  weight_updater_actor updater_;
  scheduler_actor scheduler_;
  tokenizer_actor front_;
};

} // namespace rlserve::test
