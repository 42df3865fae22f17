#include "actors/keeper.hpp"

#include <chrono>
#include <cstdio>
#include <memory>

#include "actors/guard.hpp"
#include "caf/all.hpp"

namespace rlserve {

namespace {

using clock_type = std::chrono::steady_clock;
constexpr auto k_min_restart_interval = std::chrono::seconds(1);

struct keeper_state {
  keeper_state() = default; // not an aggregate (CAF 0.17 + C++20; docs/architecture.md)
  std::string what;
  std::function<caf::actor()> spawn_helper;
  // The helper running now (invalid while a restart waits); shared with the keeper's exit
  // functor, which outlives the state's use.
  std::shared_ptr<caf::actor> helper = std::make_shared<caf::actor>();
  clock_type::time_point started{};
  static inline const char* name = "keeper";
};

using keeper_actor = caf::stateful_actor<keeper_state>;

// Monitored, not linked: a helper killed with exit_reason::kill would take a linked keeper
// with it (CAF delivers `kill` to linked actors unconditionally, bypassing the exit handler).
void start_helper(keeper_actor* self) {
  auto& st = self->state;
  *st.helper = st.spawn_helper();
  st.started = clock_type::now();
  self->monitor(*st.helper);
}

caf::behavior keeper(keeper_actor* self, std::string what, std::function<caf::actor()> spawn_helper) {
  self->state.what = std::move(what);
  self->state.spawn_helper = std::move(spawn_helper);
  start_helper(self);
  // However the keeper ends (an exit from the server, a kill), the helper ends with it.
  self->attach_functor([helper = self->state.helper] {
    if (*helper)
      caf::anon_send_exit(*helper, caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (!*st.helper || dm.source != st.helper->address())
      return;
    *st.helper = caf::actor{};
    if (dm.reason == caf::exit_reason::normal || dm.reason == caf::exit_reason::user_shutdown) {
      self->quit(dm.reason); // it ended as asked: nothing to keep
      return;
    }
    guarded(
      [&] {
        std::fprintf(stderr, "rlserve: the %s stopped (%s); starting it again\n", st.what.c_str(),
                     self->system().render(dm.reason).c_str());
        const auto since = clock_type::now() - st.started;
        if (since >= k_min_restart_interval)
          start_helper(self);
        else
          self->delayed_send(self, k_min_restart_interval - since, caf::tick_atom_v);
      },
      [self](const std::string& why) {
        std::fprintf(stderr, "rlserve: the %s could not be started again: %s\n",
                     self->state.what.c_str(), why.c_str());
      });
  });
  return guarded_behavior<caf::behavior>(
    keeper_state::name,
    [self](caf::tick_atom) {
      if (!*self->state.helper)
        start_helper(self);
    },
    [self](caf::get_atom) -> caf::actor { return *self->state.helper; });
}

} // namespace

caf::actor spawn_keeper(caf::actor_system& sys, std::string what, std::function<caf::actor()> spawn_helper) {
  return sys.spawn(keeper, std::move(what), std::move(spawn_helper));
}

} // namespace rlserve
