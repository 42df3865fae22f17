// Private to net/: the actor behind one routed HTTP request (http_session makes one per request).
// It decodes the body through codec_registry, asks the front door, and answers in SGLang's HTTP
// shapes through link<http_outbound>: one whole reply, or server-sent events for a streamed
// /generate. The HTTP-only routes (/health, /health_generate, /metrics, /model_info,
// /get_weight_version, /v1/loads, /start_profile, /stop_profile) are answered here too. A
// client that hangs up (deliver_cancel) has its generate request aborted. Never blocks.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "caf/actor.hpp"
#include "caf/allowed_unsafe_message_type.hpp"
#include "caf/fwd.hpp"
#include "messages/codec_registry.hpp"
#include "net/protocol.hpp"
#include "net/request_accounting.hpp"
#include "net/shared_state.hpp"
#include "net/vllm_route.hpp"

namespace rlserve::net::detail {

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

// What an HTTP call asks for.
struct http_call {
  enum kind_t {
    route,
    metrics,
    model_info,
    server_info,
    weight_version,
    loads,
    load,               // GET /get_load (SGLang's older per-rank load list)
    start_profile,
    stop_profile,
    health,
    health_generate,
    openai_models,      // GET /v1/models
    openai_completions, // POST /v1/completions
    openai_chat,        // POST /v1/chat/completions
    vllm_route,         // vLLM's control routes (net/vllm_call_actor.hpp)
  } kind = route;
  const codec_entry* codec = nullptr; // kind == route
  std::string body;                   // request body (JSON text; empty: {})
  std::map<std::string, std::string> query;
  vllm_control vllm; // kind == vllm_route
};

// The message deliver_cancel sends (local only: never serialized).
struct http_cancel_msg {};

// What both call actors (this one and openai_call_actor) keep of their call, the base of their
// states; watch_front_door reads it.
// What the client has been sent, readable after the actor is gone (answer_if_ended_early).
struct call_progress {
  std::atomic<bool> answered{false}; // the reply, or the end of the stream, was posted
  std::atomic<bool> streaming{false}; // events were posted
};

struct call_state {
  std::shared_ptr<shared_state> st;
  std::shared_ptr<link<http_outbound>> out;
  call_info info;
  bool stream = false;
  bool events_sent = false;
  bool done = false; // the client has its reply
  bool sent = false; // the request went to the engine: after_reply is owed
  std::shared_ptr<call_progress> progress = std::make_shared<call_progress>();
};

// Posts `r` to the client once (the actor's reply functions go through here).
void post_reply_once(call_state& s, http_reply r);
void post_event(call_state& s, std::string data);

// An actor that ends before its client has a reply — killed, or a bug that escaped its guards —
// must not leave the client waiting: as it ends, a 500 naming why goes out (or, mid-stream, an
// error event and the end of the stream).
void answer_if_ended_early(caf::scheduled_actor* self, call_state& s);

// A front door that dies holding a call would never answer it (CAF 0.17 drops the promises of a
// dead actor), and the client would wait forever. `self` (whose state `s` is) monitors the front
// door; when it stops before the call is answered, a request already sent is counted as not
// answered and `fail` gets the message for the client, which it answers with (a 503, or an
// error event that ends a stream).
void watch_front_door(caf::scheduled_actor* self, call_state& s,
                      std::function<void(const std::string&)> fail);

caf::actor spawn_http_call(std::shared_ptr<shared_state> st,
                           std::shared_ptr<link<http_outbound>> out, http_call call);
// The HTTP client went away: abort the call's generate request, if any.
void deliver_cancel(const caf::actor& call);

} // namespace rlserve::net::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::net::detail::http_cancel_msg)
