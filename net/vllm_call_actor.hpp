// Private to net/: the actor behind one call of vLLM's control routes (net/vllm_route.hpp),
// which maps each onto the engine's operations through the front door: /pause onto
// pause_generation (abort; wait = drain; keep = in_place), /resume onto continue_generation,
// /sleep and /wake_up onto a pause plus release / resume of memory by tag, /reset_prefix_cache
// onto flush_cache, the reads onto get_server_info. Answers in vLLM's shapes. Never blocks.
#pragma once

#include <memory>

#include "caf/actor.hpp"
#include "net/http_call_actor.hpp"
#include "net/shared_state.hpp"

namespace rlserve::net::detail {

// `call.kind` is http_call::vllm_route.
caf::actor spawn_vllm_call(std::shared_ptr<shared_state> st, std::shared_ptr<link<http_outbound>> out,
                           http_call call);

} // namespace rlserve::net::detail
