// Private to net/: the actor behind one websocket connection.
//
//   ws_session --deliver_text/binary/closed--> connection actor --request--> front door
//        ^                                           |
//        +------ link<ws_outbound>::with(post_text) -+   (replies, streamed chunks)
//
// It parses frames (so I/O threads only read and write), checks auth and limits, decodes bodies
// through codec_registry, sends requests to the front door with request().then() (codec_entry::
// ask for every family but generate, which streams to this actor) and posts encoded replies to
// the session. When the connection ends it aborts the client's generate requests and any
// update session (or, when configured, pause) the client left open, then quits. Never blocks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "caf/actor.hpp"
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
  // `bytes` of delivered frames are done with (parsed, or their request answered): the session
  // may read again if it had stopped (server_options::max_unanswered_bytes_per_connection).
  virtual void post_consumed(std::size_t bytes) = 0;
};

caf::actor spawn_ws_connection(std::shared_ptr<shared_state> st,
                               std::shared_ptr<link<ws_outbound>> out, uint64_t connection_id,
                               std::vector<std::string> tokens);
void deliver_text(const caf::actor& conn, shared_bytes text);
void deliver_binary(const caf::actor& conn, shared_bytes frame);
// The socket is gone: abort the connection's requests and any session or pause it holds.
void deliver_closed(const caf::actor& conn);

} // namespace rlserve::net::detail
