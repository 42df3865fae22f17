// keeper: keeps one helper actor alive. The actors of the graph are watched by the actors that
// wait on them (watch.hpp), which answer their own callers when one dies; a helper that works on
// its own timer, such as the network front's session watchdog (net/session_watchdog.hpp), has no
// caller: if it died, nobody would notice, and what it guards would silently stop. The keeper
// spawns the helper, monitors it, and spawns it again when it ends for any reason but a normal
// end or a shutdown, at most once a second (a helper that dies at once every time must not spin).
// Sending the keeper an exit ends both.
#pragma once

#include <functional>
#include <string>

#include "caf/fwd.hpp"

namespace rlserve {

// `what` names the helper in the log line of a restart ("the session watchdog stopped (...);
// started again"). The keeper answers caf::get_atom with the helper running now (tests kill it
// through this; an invalid handle while a restart waits).
caf::actor spawn_keeper(caf::actor_system& sys, std::string what, std::function<caf::actor()> spawn_helper);

} // namespace rlserve
