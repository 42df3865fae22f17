// One line per event on stderr, from any thread: "rlserve serve: <level>: <text>". The network
// front logs connections, refusals and failures here; it never logs a header, a token or a
// request body, so no secret can reach a log line.
#pragma once

#include <string_view>

namespace rlserve::net {

enum class log_level : int { debug = 0, info, warn, error, off };

// Lines below `level` are dropped. Default: info, or $RLSERVE_LOG_LEVEL (debug|info|warn|error|off).
void set_log_level(log_level level);
log_level current_log_level();

void log(log_level level, std::string_view text);
inline void log_debug(std::string_view text) { log(log_level::debug, text); }
inline void log_info(std::string_view text) { log(log_level::info, text); }
inline void log_warn(std::string_view text) { log(log_level::warn, text); }
inline void log_error(std::string_view text) { log(log_level::error, text); }

} // namespace rlserve::net
