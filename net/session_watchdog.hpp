// The actor that aborts an abandoned weight-update session begun over HTTP. Over a websocket a
// session belongs to its connection and ends with it; over HTTP every request is its own
// connection, so a trainer that dies between begin_weight_update and end_weight_update would
// hold the update lock forever and every /generate would wait behind it. The watchdog checks
// every `tick` whether such a session has had no request in flight or arriving for
// server_options::update_session_idle_timeout, and then ends it with abort = true: nothing
// staged is applied and the old weights keep serving.
#pragma once

#include <chrono>
#include <memory>

#include "caf/fwd.hpp"

namespace rlserve::net::detail {

struct shared_state;

// Spawns the watchdog (none when the timeout is 0) under a keeper (actors/keeper.hpp), which
// starts it again if it dies; the handle is the keeper's: sending it an exit ends both. The
// watchdog's handlers are guarded (actors/guard.hpp), and its next check is scheduled before
// the current one runs, so an exception in a check neither ends it nor stops its ticking.
caf::actor spawn_session_watchdog(std::shared_ptr<shared_state> st);

} // namespace rlserve::net::detail
