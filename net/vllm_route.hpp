// Private to net/: vLLM's RL control routes (docs/protocol.md, "vLLM's dialect"), decided from
// the method, target and body alone, so route_http_request can answer a bad query with vLLM's
// 400 before anything reaches the engine, and tests can feed it every bad input.
//
//   if (is_vllm_control_path(path)) {
//     auto r = parse_vllm_control(method, target, body);
//     if (auto* no = std::get_if<vllm_refusal>(&r)) ...answer(no->status, no->body)...
//   }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/beast/http/verb.hpp>

#include "messages/control.hpp"

namespace rlserve::net::detail {

// One vLLM control call, its query and body read and checked.
struct vllm_control {
  enum op_t {
    pause,          // POST /pause?mode=abort|wait|keep&clear_cache=
    resume,         // POST /resume
    is_paused,      // GET /is_paused
    abort_requests, // POST /abort_requests {"request_ids": [...]}
    sleep,          // POST /sleep?level=0|1|2&mode=&tags=
    wake_up,        // POST /wake_up?tags=
    is_sleeping,    // GET /is_sleeping
    reset_prefix_cache, // POST /reset_prefix_cache
    weight_info,    // GET /weight_info
  } op = pause;
  // pause, sleep: the engine's mode (abort, drain for vLLM's wait, in_place for keep).
  pause_mode mode = pause_mode::abort;
  bool clear_cache = true; // pause (vLLM's default)
  int level = 1;           // sleep
  // sleep, wake_up: vLLM's tags ("weights", "kv_cache"), each once; empty: all (wake_up) or
  // those of the level (sleep).
  std::vector<std::string> tags;
  std::vector<std::string> request_ids; // abort_requests; empty: all
};

// A call answered without the engine: 400 with vLLM's error object, 405.
struct vllm_refusal {
  unsigned status = 400;
  std::string body;
};

// vLLM's error object: {"error": {"message", "type", "param", "code"}}; `param` as FastAPI
// names it ("query.mode", "body.request_ids"), null when empty.
std::string vllm_error_body(std::string_view message, std::string_view param, unsigned code,
                            std::string_view type = "BadRequestError");

// The paths parse_vllm_control serves.
bool is_vllm_control_path(std::string_view path);

// Whether the call changes the engine (admin key) or only reads its state (normal key).
bool vllm_control_changes_state(vllm_control::op_t op);

// The vLLM tags `tags` name in rlserve's memory tags: weights -> weights; kv_cache -> kv_cache
// and cuda_graph (vLLM's KV sleep frees the forward's memory too; rlserve names it apart).
std::vector<std::string> rlserve_memory_tags(const std::vector<std::string>& vllm_tags);

// Reads a call to an is_vllm_control_path route. Every refusal names the parameter.
std::variant<vllm_control, vllm_refusal> parse_vllm_control(boost::beast::http::verb method,
                                                            std::string_view target,
                                                            std::string_view body);

} // namespace rlserve::net::detail
