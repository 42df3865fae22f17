// Private to net/: what both front actors (ws_connection_actor, http_call_actor) do around every
// request: limits checked before it goes to the engine (tensor bytes per session), and after the
// reply the ownership of sessions and pauses (net/ownership.hpp) and the metrics.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "caf/fwd.hpp"
#include "messages/codec_registry.hpp"
#include "messages/generate.hpp"
#include "net/protocol.hpp"
#include "net/shared_state.hpp"

namespace rlserve::net::detail {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t0);

// A reply body's `success`, true when it has none.
bool success_of(const json& body);
// An end_weight_update reply's `session_open`: the engine kept the session.
bool session_open_of(const json& body);

// The update phase a route times in /metrics ("begin", "update", ...), or empty.
std::string_view phase_of(std::string_view route);

struct refusal {
  error_code code;
  std::string message;
};

// One request on its way: what before_send learned, for after_reply.
struct call_info {
  const codec_entry* codec = nullptr;
  std::string route;
  clock::time_point t0 = clock::now();
  bool end_abort = false;
  bool end_counted = false; // end_weight_update: counted by ownership::end_sent
  std::string rid; // generate
  bool session_request = false; // counted by ownership::session_request_sent
  uint64_t tensor_bytes = 0;    // counted against the session's budget (refunded on failure)
  uint64_t session_epoch = 0;
};

// Limits and bookkeeping before a request goes to the front door, from `owner` (a websocket
// connection id; 0 for HTTP): session requests carry `owner` as their requester (the engine
// keeps a session begun over a websocket to that connection), and tensor bytes per session are
// limited. `copied`: tensors of a binary
// frame that had to be copied (metrics only).
std::optional<refusal> before_send(shared_state& st, call_info& info, caf::message& req,
                                   uint64_t owner, std::size_t copied = 0);

// Bookkeeping after a reply (`answered` false: the engine did not answer): ownership of
// sessions and pauses by `owner` (a websocket connection id; 0 for HTTP), metrics.
// `session_open`: an end_weight_update's reply said the session is still open.
void after_reply(shared_state& st, const call_info& info, std::string_view transport, bool answered,
                 bool ok, uint64_t owner, bool session_open = false);

// Tokens in and out and the finish reason of a finished generate request.
void note_generate(shared_state& st, const GenerateReqOutput& out);

// Every websocket route name, for "unknown route" messages.
std::string routes_list();

} // namespace rlserve::net::detail
