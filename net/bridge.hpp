// Private to net/: the actors between the Asio sessions and the engine's front door.
//
//   ws_session --deliver_text/binary/closed--> connection actor --request--> front door
//        ^                                           |
//        +------ link<ws_outbound>::with(post_text) -+   (replies, streamed chunks)
//
// One connection actor per websocket connection parses frames (so I/O threads only read and
// write), checks auth and limits, decodes bodies through codec_registry, sends requests to
// the front door with request().then() and posts encoded replies to the session. One call
// actor per HTTP request does the same for a single request. Neither blocks.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "caf/actor.hpp"
#include "messages/codec_registry.hpp"
#include "net/protocol.hpp"
#include "net/shared_state.hpp"

namespace rlserve::net::detail {

// What a websocket session offers its actor; both calls post to the session's strand.
class ws_outbound {
public:
  virtual ~ws_outbound() = default;
  virtual void post_text(std::shared_ptr<const std::string> text) = 0;
  // Closes the connection with a policy-violation status and `reason`.
  virtual void post_close(std::string reason) = 0;
};

// An HTTP response: whole, or the end of a server-sent event stream.
struct http_reply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  bool end_of_stream = false; // true: the SSE stream ends (body unused)
};

class http_outbound {
public:
  virtual ~http_outbound() = default;
  // One server-sent event `data: <json>`; the first one starts the event stream.
  virtual void post_event(std::shared_ptr<const std::string> data) = 0;
  virtual void post_reply(http_reply reply) = 0;
};

caf::actor spawn_ws_connection(std::shared_ptr<shared_state> st,
                               std::shared_ptr<link<ws_outbound>> out, uint64_t connection_id,
                               std::vector<std::string> tokens);
void deliver_text(const caf::actor& conn, shared_bytes text);
void deliver_binary(const caf::actor& conn, shared_bytes frame);
// The socket is gone: abort the connection's requests and any session or pause it holds.
void deliver_closed(const caf::actor& conn);

// What an HTTP call asks for.
struct http_call {
  enum kind_t { route, metrics, model_info, server_info, health, health_generate } kind = route;
  const codec_entry* codec = nullptr; // kind == route
  std::string body;                   // request body (JSON text; empty: {})
  std::map<std::string, std::string> query;
};

caf::actor spawn_http_call(std::shared_ptr<shared_state> st,
                           std::shared_ptr<link<http_outbound>> out, http_call call);
// The HTTP client went away: abort the call's generate request, if any.
void deliver_cancel(const caf::actor& call);

} // namespace rlserve::net::detail
