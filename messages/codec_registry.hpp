// The public request families by route name, so the websocket server (and a generic client)
// dispatches without a hand-written route per message:
//
//   const codec_entry* c = find_codec(frame["route"]);   // "update_weights_from_disk"
//   if (!c) ...unknown route...
//   if (c->auth == auth_level::admin && !session_is_admin) ...refuse...
//   auto req = c->decode(frame["body"]);                 // expected<caf::message>
//   self->request(tokenizer, timeout, *req).then([c](caf::message& reply) {
//     auto j = c->encode_reply(reply);                   // expected<nlohmann::json>
//   });
//
// Route names are SGLang's HTTP routes without the slash, so an SGLang user finds every
// operation under the name they know. The routes and their auth levels come from the table of
// operations, messages/operations.hpp: adding one there adds its route here.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "caf/fwd.hpp"
#include "messages/expected.hpp"

namespace rlserve {

// What `codec_entry::ask` calls with the engine's reply: the reply as JSON, or a sentence when the
// engine did not answer.
using json_reply_callback = std::function<void(expected<nlohmann::json>)>;

// Who may call a route. normal: generation and read-only server state (api_key). admin:
// everything that changes or reads weights, pauses or resumes generation, flushes the cache or
// aborts requests (admin_api_key). A mutating route never falls back to normal: SGLang's first
// post_process_weights was left open by a missing level (docs/sglang-contract.md).
enum class auth_level : uint8_t { normal = 1, admin };

std::string to_string(auth_level x);

struct codec_entry {
  std::string_view route;         // "generate", "begin_weight_update", ...
  auth_level auth;
  std::string_view request_type;  // "GenerateReqInput" (for logs and docs)
  std::string_view reply_type;    // "GenerateReqOutput"
  // JSON body -> the validated request struct inside a caf::message (the message the engine's
  // front door takes). Errors are codec messages ("sampling_params.top_p: ...").
  expected<caf::message> (*decode)(const nlohmann::json& body);
  // The engine's reply (a caf::message holding reply_type) -> JSON. Errors when the message
  // holds anything else (a wiring bug worth a clear log line, not a crash).
  expected<nlohmann::json> (*encode_reply)(const caf::message& reply);
  // The client side of the same contract: a request struct in a message -> JSON body, and a
  // JSON reply -> the reply struct in a message.
  expected<nlohmann::json> (*encode_request)(const caf::message& request);
  expected<caf::message> (*decode_reply)(const nlohmann::json& body);
  // Sends `request` (a message holding request_type, as decode made it) from `self` to `dest`
  // (the engine's front door) and calls `done` once, inside `self`, with the reply encoded as
  // JSON. A front end needs no handler per reply type: CAF 0.17's event-based response handlers
  // match on the reply's type, and only the entry knows it. For generate it sends no sink (the
  // whole result comes in the reply); streaming front ends send generate themselves.
  void (*ask)(caf::event_based_actor* self, const caf::actor& dest, caf::message request,
              json_reply_callback done);
};

// The entry for `route`, or nullptr when there is none.
const codec_entry* find_codec(std::string_view route);

// Every entry, in a fixed order (for docs, listings and tests).
std::span<const codec_entry> all_codecs();

} // namespace rlserve
