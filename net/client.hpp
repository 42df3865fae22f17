// rlserve::net::client — a blocking websocket client of the protocol in docs/protocol.md, on
// Beast. One connection; many requests may be in flight on it (send, then receive in any
// order), or one at a time (call).
//
//   auto c = rlserve::net::client::connect({.port = 30000, .api_key = "k"});
//   if (!c) { std::cerr << c.error(); return 1; }
//   rlserve::GenerateReqInput req;
//   req.text = "Hello";
//   auto out = (*c)->generate(req, [](const rlserve::GenerateReqOutput& chunk) {
//     std::cout << chunk.text << std::flush;                 // streamed as it comes
//   });
//   auto paused = (*c)->call<rlserve::PauseGenerationReqOutput>("pause_generation",
//                                                               rlserve::PauseGenerationReqInput{});
//
// Every function returns an expected<>: a connection failure, a timeout, a protocol error from
// the server ({"error": {"code", "message"}}) all come back as a sentence. A reply with
// success = false is a reply, not an error (the caller reads its message). Not thread-safe: one
// thread per client (the load test opens one client per thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "messages/json_codec.hpp"
#include "net/protocol.hpp"

namespace rlserve::net {

struct client_options {
  std::string host = "127.0.0.1";
  uint16_t port = 30000;
  // Sent at the upgrade: the api_key as "Authorization: Bearer", the admin key as "x-api-key"
  // (or as the bearer token when there is no api_key).
  std::string api_key;
  std::string admin_api_key;
  // Connecting, and each send or receive.
  std::chrono::milliseconds timeout{60'000};
  // Largest message accepted from the server.
  std::size_t max_message_bytes = std::size_t{1} << 30;
};

// One message from the server.
struct server_message {
  enum kind_t { reply, chunk, error } kind = reply;
  json id;
  std::string type;  // route name (a chunk's type without ".chunk")
  bool ok = false;   // reply: the body's success (true when it has none)
  json body;         // reply and chunk
  std::string code;  // error: error_code name ("bad_request", "unauthorized", ...)
  std::string message; // error: the sentence
};

class client {
public:
  static expected<std::unique_ptr<client>> connect(const client_options& options);
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  // ---- multiplexed ----
  // Sends {"id", "type", "body"} with the next integer id; returns that id.
  expected<int64_t> send(std::string_view type, const json& body);
  // The same with the caller's id (a string or an integer).
  status send_with_id(const json& id, std::string_view type, const json& body);
  // update_weights_from_tensor as one binary frame: `req`'s named_tensors become the payload,
  // everything else the JSON header.
  expected<int64_t> send_tensors(const UpdateWeightsFromTensorReqInput& req);
  // A frame exactly as given (text or binary): for tests and benchmarks.
  status send_raw(std::span<const std::byte> bytes, bool binary);
  // The next message from the server, in arrival order (messages that call() set aside come
  // first).
  expected<server_message> receive();

  // ---- one request at a time ----
  // Sends and waits for the final message of this request; its chunks go to `on_chunk`; other
  // requests' messages are kept for receive(). A protocol error becomes the failure.
  expected<server_message> call(std::string_view type, const json& body,
                                const std::function<void(const json&)>& on_chunk = {});
  // Typed, through the JSON codecs: call<PauseGenerationReqOutput>("pause_generation", req).
  template <class Out, class In>
  expected<Out> call(std::string_view route, const In& request) {
    auto m = call(route, to_json(request));
    if (!m)
      return std::move(m).take_failure();
    return from_json<Out>(m->body);
  }
  // Waits for the final message of a request sent before (send, send_tensors); as call().
  expected<server_message> wait_for(const json& id,
                                     const std::function<void(const json&)>& on_chunk = {});
  // generate with streaming when `on_chunk` is given (req.stream is then forced on).
  expected<GenerateReqOutput> generate(GenerateReqInput req,
                                       const std::function<void(const GenerateReqOutput&)>& on_chunk = {});
  expected<UpdateWeightsFromTensorReqOutput> update_weights_from_tensor(
    const UpdateWeightsFromTensorReqInput& req);

  // Closes the websocket politely (close frame, status 1000).
  void close();
  // After a receive() failed because the server closed: its close code (1009: a message was too
  // big) and reason; 0 when it did not close with a code.
  int close_code() const;

  struct impl;

private:
  explicit client(std::unique_ptr<impl> p);
  // The next frame from the socket (nothing set aside).
  expected<server_message> read_frame();
  std::unique_ptr<impl> impl_;
};

// Parses one text frame from the server.
expected<server_message> parse_server_message(std::string_view text);

} // namespace rlserve::net
