#include "net/session_watchdog.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "actors/guard.hpp"
#include "actors/keeper.hpp"
#include "caf/all.hpp"
#include "net/log.hpp"
#include "net/request_accounting.hpp"
#include "net/shared_state.hpp"

namespace rlserve::net::detail {

namespace {

struct watchdog_state {
  watchdog_state() = default; // not an aggregate (CAF 0.17 + C++20; docs/architecture.md)
  std::shared_ptr<shared_state> st;
  caf::timespan tick{};
  static inline const char* name = "session_watchdog";
};

using watchdog_actor = caf::stateful_actor<watchdog_state>;

void log_failure(const std::string& what) {
  log_warn("the session watchdog failed handling a message: " + what);
}

void check(watchdog_actor* self) {
  self->delayed_send(self, self->state.tick, caf::tick_atom_v); // first: whatever the check does
  auto st = self->state.st;
  if (!st->stopping && st->owners.take_idle_http_session(st->opts.update_session_idle_timeout)) {
    st->stats.disconnect_cleanup("abort_idle_session");
    log_warn(fmt::format("the weight-update session begun over HTTP had no request for {:.0f} s "
                         "(server option update_session_idle_timeout); aborting it, the old "
                         "weights keep serving",
                         std::chrono::duration<double>(st->opts.update_session_idle_timeout).count()));
    EndWeightUpdateReqInput end;
    end.abort = true;
    self->request(st->front, caf::infinite, end)
      .then(
        [st](EndWeightUpdateReqOutput& out) {
          guarded(
            [&] {
              if (auto length = st->owners.end_finished()) {
                st->stats.update_phase("session", *length);
                st->stats.update_session_ended("aborted");
              }
              log_info("idle HTTP session aborted: " + out.message);
            },
            log_failure);
        },
        [self, st](caf::error& err) {
          guarded(
            [&] {
              st->owners.end_finished();
              log_warn("aborting an idle HTTP session failed: " + self->system().render(err));
            },
            log_failure);
        });
  }
}

caf::behavior watchdog(watchdog_actor* self, std::shared_ptr<shared_state> st) {
  auto limit = std::chrono::duration_cast<caf::timespan>(st->opts.update_session_idle_timeout);
  // A quarter of the deadline, at most a second: the abort comes at most that late.
  self->state.tick = std::min<caf::timespan>(limit / 4, std::chrono::seconds(1));
  self->state.st = std::move(st);
  self->delayed_send(self, self->state.tick, caf::tick_atom_v);
  return guarded_behavior<caf::behavior>(watchdog_state::name, [self](caf::tick_atom) { check(self); });
}

} // namespace

caf::actor spawn_session_watchdog(std::shared_ptr<shared_state> st) {
  if (st->opts.update_session_idle_timeout.count() <= 0)
    return {};
  auto& sys = st->sys;
  return spawn_keeper(sys, "session watchdog", [&sys, st] { return sys.spawn(watchdog, st); });
}

} // namespace rlserve::net::detail
