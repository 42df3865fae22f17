// Private to net/: the actor behind one call of an OpenAI route (http_session makes it through
// spawn_http_call): GET /v1/models, POST /v1/completions and POST /v1/chat/completions. It
// reads the request (messages/openai.hpp), renders a chat through the model's chat template,
// sends one GenerateReqInput to the front door, and answers in OpenAI's shapes (net/openai.hpp):
// one JSON reply, or server-sent events ending with `data: [DONE]`. Errors are OpenAI's
// {"error": {...}} with a 4xx status (5xx when the engine does not answer). A client that hangs
// up (deliver_cancel) has its request aborted. Never blocks.
#pragma once

#include <memory>

#include "caf/actor.hpp"
#include "net/http_call_actor.hpp"
#include "net/shared_state.hpp"

namespace rlserve::net::detail {

// `call.kind` is one of the openai_* kinds.
caf::actor spawn_openai_call(std::shared_ptr<shared_state> st, std::shared_ptr<link<http_outbound>> out,
                             http_call call);

} // namespace rlserve::net::detail
