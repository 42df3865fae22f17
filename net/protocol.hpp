// The websocket protocol of docs/protocol.md, as pure functions (no sockets, no actors), shared
// by the server (net/ws_session.cpp, net/ws_connection_actor.cpp) and the client library (net/client.cpp).
//
// Text frames, one JSON object each:
//   request   {"id": 7, "type": "generate", "body": {...}}          id: a string or an integer
//   reply     {"id": 7, "type": "generate", "ok": true, "body": {...}}
//   chunk     {"id": 7, "type": "generate.chunk", "body": {...}}     (streamed generate)
//   error     {"id": 7, "type": "generate", "error": {"code": "bad_request", "message": "..."}}
// Binary frames (tensor payloads of update_weights_from_tensor):
//   [u32 little-endian H][H bytes of JSON header][payload]
//   header = {"id", "type": "update_weights_from_tensor", "body": {..., "named_tensors": [
//             {"name", "dtype", "shape", "offset", "nbytes"}, ...]}}, offsets into the payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/expected.hpp"
#include "messages/tensor.hpp"

namespace rlserve::net {

using json = nlohmann::json;

// Protocol-level failures (the engine's own failures are replies with ok = false instead).
enum class error_code {
  bad_json = 1,      // the text frame is not JSON
  bad_request,       // envelope or body does not validate (the message says where)
  bad_frame,         // a binary frame's layout is wrong (header length, offsets, sizes)
  unknown_type,      // no route of that name
  unauthorized,      // the connection's token does not allow this route
  forbidden,         // reserved: not sent today (a foreign origin is refused at the upgrade)
  duplicate_id,      // a request with this id is still in flight on this connection
  too_many_requests, // more requests in flight on this connection than allowed
  too_large,         // tensor bytes over the per-session limit
  engine_error,      // the engine did not answer (it is shutting down or failed)
  shutting_down,     // the server is stopping
  internal_error,    // handling the request failed inside the server (a bug); the connection lives
};

std::string_view to_string(error_code code);

// JSON text; invalid UTF-8 (a streamed chunk can end inside a character) becomes U+FFFD.
std::string dump(const json& j);

// What the server reads from a text frame or a binary frame's header.
struct request_envelope {
  json id;          // string or integer, echoed back as is
  std::string type; // route name
  json body;        // object ({} when absent or null)
};

// Checks the envelope shape. On failure the message says what is wrong; `id_out` receives the
// id whenever one could be read, so the error can still be matched to the request.
expected<request_envelope> read_envelope(const json& frame, json& id_out);

// The largest generate request the server parses for a model with `context_length` tokens of
// context: 1 MiB (sampling parameters, stop strings) plus 64 bytes per token (an id as JSON
// text takes at most 12, a text token rarely more than a few dozen). Anything larger cannot
// be served and is refused before it is parsed: a JSON document of numbers costs about 20
// times its size as a DOM.
std::size_t generate_bytes_limit(int64_t context_length);

// The "type" of a text frame without building its body (every value below the top level is
// discarded as it is read): for deciding whether a large frame may be parsed at all. Empty
// when the frame is not an object with a string "type".
std::string peek_type(std::string_view text);

// What a tolerant scan of a frame that failed to parse could still read, so that its error
// reply answers the request: the top-level "id" (and "type") read before the point where the
// text stops being valid JSON. `id` is null when none could be taken, and `why_no_id` then says
// why (no "id" before the failure point, an id that is not a string or integer, two top-level
// "id" keys, not an object), for the error message. Nothing is built below the top level. Only
// the first 64 KiB are scanned: an id after them is not read.
struct recovered_ids {
  json id;                // null, a string or an integer
  std::string type;       // empty when not read
  std::string why_no_id;  // empty when `id` was read
};
recovered_ids recover_ids(std::string_view text);

std::string reply_text(const json& id, std::string_view type, bool ok, const json& body);
std::string chunk_text(const json& id, std::string_view type, const json& body); // type + ".chunk"
std::string error_text(const json& id, std::string_view type, error_code code,
                       std::string_view message);

// ---- binary frames ----

// A received websocket message: bytes shared between the session and the actors (no copy).
struct shared_bytes {
  std::shared_ptr<const std::byte> data;
  std::size_t size = 0;
  std::span<const std::byte> bytes() const { return {data.get(), size}; }
  std::string_view text() const { return {reinterpret_cast<const char*>(data.get()), size}; }
};

// Where clients put the payload and each tensor so that the server can alias the frame
// (zero copy): payload start and every offset a multiple of this.
inline constexpr std::size_t k_binary_alignment = 64;

struct binary_request {
  request_envelope envelope;          // body without "named_tensors"
  std::vector<NamedTensor> tensors;   // alias the frame where aligned
  std::size_t tensor_bytes = 0;
  std::size_t copied_tensors = 0;     // misaligned ones, copied
};

// Parses and validates a whole binary frame. `frame` stays alive as long as any tensor.
// `id_out` as for read_envelope.
expected<binary_request> read_binary_frame(const shared_bytes& frame, json& id_out);

// The client side: a frame with the header padded with spaces so the payload starts at a
// multiple of k_binary_alignment, and every tensor at such an offset. `body` is the rest of
// the request body (weight_version, flush_cache, ...).
std::vector<std::byte> make_binary_frame(const json& id, std::string_view type, const json& body,
                                         std::span<const NamedTensor> tensors);

} // namespace rlserve::net
