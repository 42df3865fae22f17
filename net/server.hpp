// rlserve::net::server — the network front of an Engine (docs/protocol.md): one TCP port
// speaking HTTP/1.1 and websocket, served by a small fixed pool of Asio threads.
//
//   auto engine = rlserve::Engine::start({});
//   rlserve::net::server_options o;            // 127.0.0.1:30000, 2 I/O threads, no keys
//   auto srv = rlserve::net::server::start(**engine, o);
//   std::printf("listening on %s\n", (*srv)->address().c_str());
//   ...
//   (*srv)->stop();                             // before the engine goes away
//
// Websocket (any path): the protocol of docs/protocol.md — every route of
// messages/codec_registry.hpp, multiplexed by client-chosen id, streamed generate chunks,
// binary frames for tensors. HTTP: GET /health, /health_generate, /metrics, /model_info,
// /get_server_info, and POST /<route> for every route with SGLang's bodies and replies
// (POST /generate with "stream": true answers with server-sent events).
//
// Threads: Asio threads only read, write and hand frames to CAF actors (one per websocket
// connection, one per HTTP call) spawned in the engine's actor system; actors answer by posting
// to the session's strand. Neither ever blocks on the other.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "messages/expected.hpp"
#include "net/auth.hpp"

namespace rlserve {
class Engine;
}

namespace rlserve::net {

class metrics;

struct server_options {
  std::string host = "127.0.0.1"; // loopback unless asked otherwise
  uint16_t port = 30000;          // 0: any free port (see server::port())
  std::size_t io_threads = 2;
  api_keys keys;
  // Largest websocket message (text or binary) and HTTP body accepted; a bigger websocket
  // message closes the connection with status 1009 (message too big), an HTTP body gets 413.
  std::size_t max_message_bytes = std::size_t{1} << 30;
  // Tensor bytes accepted per weight-update session (and per message outside one).
  uint64_t max_session_tensor_bytes = uint64_t{64} << 30;
  // Bytes of websocket frames a connection may have delivered and not yet answered (a binary
  // tensor frame counts until its reply, a text frame until it is parsed); past this the server
  // stops reading from that client until replies catch up, so a client pipelining large frames
  // cannot fill the server's memory faster than the engine takes them.
  std::size_t max_unanswered_bytes_per_connection = std::size_t{2} << 30;
  // Requests in flight per websocket connection; more are refused with too_many_requests.
  std::size_t max_inflight_per_connection = 4096;
  // Bytes queued for a client that does not read; past this the connection is closed.
  std::size_t max_queued_bytes_per_connection = std::size_t{256} << 20;
  // Reading an HTTP request (headers and body) and the websocket handshake.
  std::chrono::milliseconds request_timeout{30'000};
  // A websocket peer that sends nothing (not even a pong to the server's keep-alive pings,
  // sent at half this period) for this long is disconnected. 0: never.
  std::chrono::milliseconds idle_timeout{300'000};
  // When a websocket client that paused generation disconnects without continuing, send
  // continue_generation for it. Off by default: a pause, unlike an update session, outlives the
  // connection that made it (as over HTTP, and so that `rlserve client pause_generation` and a
  // later `rlserve client continue_generation` work as two commands).
  bool resume_on_disconnect = false;
  // A weight-update session begun over HTTP (which has no connection whose end could abort it)
  // is aborted after this long without a request of the session in flight or arriving; the old
  // weights keep serving. A websocket session ends with its connection instead. 0: never.
  std::chrono::milliseconds update_session_idle_timeout{600'000};
  // Browser origins ("http://host:port") allowed besides the server's own address. A request
  // carrying an Origin header (only browsers send one) from anywhere else is refused, so a web
  // page cannot drive the engine through the user's browser.
  std::vector<std::string> allowed_origins;
  // SGLang launch flags rlserve takes only to report them in /server_info: trainers with an
  // external engine compare /server_info with the ServerArgs they would launch (slime and miles
  // check enable_memory_saver, and enable_return_routed_experts with routing replay). rlserve
  // serves release/resume_memory_occupation and return_routed_experts either way.
  bool enable_memory_saver = false;
  bool enable_return_routed_experts = false;
  // Reported as SGLang's enable_deterministic_inference; set from the engine's own flag
  // (engine_config::enable_deterministic_inference), which is what makes it true.
  bool enable_deterministic_inference = false;
  // The model's name in OpenAI replies, /v1/models and /server_info's served_model_name (SGLang's
  // --served-model-name); empty: the model path.
  std::string served_model_name;
  // SGLang's --tool-call-parser and --reasoning-parser: how chat replies are split into
  // tool_calls and reasoning_content (net/tool_call_parser.hpp, net/reasoning_parser.hpp). Empty:
  // not parsed. An unknown name fails start, naming the accepted ones.
  std::string tool_call_parser;
  std::string reasoning_parser;
  // vLLM's --enable-sleep-mode: without it /sleep and /wake_up fail as vLLM's do (500).
  bool enable_sleep_mode = false;
};

class server {
public:
  // Binds, listens and starts the I/O threads. Fails with a sentence when the address cannot be
  // bound (in use, no such interface) or the options make no sense.
  static expected<std::unique_ptr<server>> start(Engine& engine, server_options options);
  ~server(); // stop()
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  uint16_t port() const;
  // "127.0.0.1:30000"
  std::string address() const;
  // Stops accepting, closes every connection (websocket: close status 1001, going away; their
  // requests are aborted and any session they hold is aborted), waits for the connection actors
  // to finish (a few seconds at most), and joins the I/O threads. Idempotent.
  void stop();

  const metrics& stats() const;

  // Kills every connection's and HTTP call's actor now, as a crash would, and returns how many
  // there were. For tests: their clients must be answered (HTTP 500) or disconnected
  // (websocket), and what their connections held (an update session, a pause) given back.
  std::size_t kill_connection_actors();
  // Kills the session watchdog (net/session_watchdog.hpp) now, as a crash would, and returns its
  // actor id; 0 when there is none (its timeout is 0) or its restart is pending. For tests: it
  // must be started again (a new id) and abort an abandoned HTTP session as before.
  uint64_t kill_session_watchdog();

  struct impl;

private:
  explicit server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace rlserve::net
