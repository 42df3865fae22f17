// Private to net/: what an HTTP request asks for, decided from its method, target and body alone
// (no sockets, no actors), so http_session and http_call_actor share it and fuzz/http_fuzz.cpp
// can feed it untrusted requests.
//
//   auto r = route_http_request(req.method(), req.target(), std::move(req.body()), is_json);
//   if (auto* no = std::get_if<http_refusal>(&r)) ...answer(no->status, no->body)...
//   auto& routed = std::get<http_routed>(r);   // call + the auth level it needs
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>

#include "messages/control.hpp"
#include "messages/expected.hpp"
#include "net/auth.hpp"
#include "net/http_call_actor.hpp"

namespace rlserve::net::detail {

// {"error": <error>, "message": <message>}: the body of a refusal.
std::string json_error_body(std::string_view error, std::string_view message);

// The request target split at '?': the path without trailing slashes ("/" stays "/"), and the
// query's key=value pairs URL-decoded ('+' is a space, %XX a byte; a later key wins).
struct http_target {
  std::string path;
  std::map<std::string, std::string> query;
};
http_target split_target(std::string_view target);

// The query of `target` as its key=value pairs in order, URL-decoded, repeated keys kept
// (vLLM's /wake_up?tags=weights&tags=kv_cache).
std::vector<std::pair<std::string, std::string>> query_items(std::string_view target);

// Whether a Content-Type names JSON (application/json or application/<x>+json, any case, any
// parameters). A browser can POST text/plain or a form to any address without asking first, but
// not JSON: requiring it keeps web pages from driving the engine.
bool json_media_type(std::string_view content_type);

// Routes a GET (and HEAD) may call: those without side effects, and flush_cache, which SGLang
// serves on GET and RL trainers call that way.
bool get_allowed(std::string_view route);

// A request answered without calling the engine: 404 (no such route), 405 (wrong method: GET only
// for get_allowed routes, HEAD never for flush_cache) or 415 (a non-empty body that is not JSON).
struct http_refusal {
  unsigned status = 404;
  std::string body; // json_error_body
};

// A request for the engine, and the key level it needs.
struct http_routed {
  http_call call;
  route_auth level = route_auth::normal;
  std::string path;
};

// GET /health, /health_generate, /metrics, /model_info (and SGLang's older /get_model_info),
// /get_weight_version, /v1/loads, /get_load, /v1/models; GET or POST /start_profile, /stop_profile (admin);
// POST /v1/completions and /v1/chat/completions (OpenAI's, net/openai_call_actor.hpp); POST
// /<route> for every codec_registry route, GET too where get_allowed (/server_info is
// get_server_info). `body` moves into the call; `body_is_json` is json_media_type of the
// request's Content-Type.
std::variant<http_routed, http_refusal> route_http_request(boost::beast::http::verb method,
                                                           std::string_view target,
                                                           std::string body, bool body_is_json = true);

// The JSON body a routed call decodes: the request body (empty or null: {}), which must be an
// object, plus every query parameter the body does not set, read as JSON when it parses and as a
// string otherwise (flush_cache's "timeout" is its timeout_s). Errors are the 400 message.
// input_ids are read compactly, at most `max_input_ids` of them (parse_request_json).
expected<nlohmann::json> http_request_body(const codec_entry& codec, std::string_view body,
                                           const std::map<std::string, std::string>& query,
                                           std::size_t max_input_ids = SIZE_MAX);

// ---- SGLang's reply shapes of the reads trainers make (docs/protocol.md, 'Compatibility') -----

// The project's version, as SGLang's replies carry its own ("version").
std::string_view server_version();

// /server_info and /get_server_info over HTTP: rlserve's GetServerInfoReqOutput fields plus the
// ServerArgs and scheduler_info fields trainers read (model_path, tp_size, dp_size, pp_size,
// ep_size, dtype, context_length, disaggregation_mode, ...), with the values that describe this
// engine: one process on one device, so every parallel size is 1.
// `launch` is what the front was started with: ServerArgs the engine itself does not know.
struct launch_args {
  std::string host;
  uint16_t port = 0;
  bool enable_memory_saver = false;
  bool enable_return_routed_experts = false;
  bool enable_deterministic_inference = false;
  std::string served_model_name; // the name the server gives the model (shared_state::model_name)
  std::string tool_call_parser;  // SGLang's ServerArgs of the same names; empty: none
  std::string reasoning_parser;
};
nlohmann::json sglang_server_info(const GetServerInfoReqOutput& info, const launch_args& launch);

// /model_info: SGLang's fields (model_path, tokenizer_path, is_generation, weight_version,
// model_type, architectures, ...) plus rlserve's (device, vocab_size, max_context_length, ...).
nlohmann::json sglang_model_info(const GetServerInfoReqOutput& info);

// What GET /v1/loads asks for: SGLang's query parameters include (comma-separated sections of
// core, memory, spec, lora, disagg, queues, all), dp_rank (this engine has one: 0) and format
// (json or prometheus). Errors are the 400 message.
struct loads_query {
  bool speculative = false; // the "spec" section (or "all")
  bool prometheus = false;
};
expected<loads_query> parse_loads_query(const std::map<std::string, std::string>& query);

// /v1/loads in SGLang's shape: {timestamp, version, dp_rank_count, loads: [one per data-parallel
// rank], aggregate}, or Prometheus text; a section without data here (memory, lora, disagg,
// queues) is left out, as SGLang leaves out what it does not have. `timestamp` is ISO 8601.
http_reply sglang_loads(const GetServerInfoReqOutput& info, const loads_query& q,
                        std::string_view timestamp);

// GET /get_load, SGLang's older load report, which sglang-router 0.3 polls for its loads
// (/get_loads, power_of_two): one element per data-parallel rank, {dp_rank, num_reqs (running +
// waiting), num_waiting_reqs, num_tokens (KV tokens in use)}; the router sums num_tokens.
nlohmann::json sglang_legacy_load(const GetServerInfoReqOutput& info);

// /start_profile's body (SGLang's ProfileReqInput) with the query filling missing fields.
// Checked by type, naming the field; activities other than CPU and GPU and a start_step other
// than 0 are refused (rlserve records its steps' timings from the moment it starts);
// with_stack, record_shapes, profile_by_stage and merge_profiles change nothing and are taken.
struct profile_request {
  std::string output_dir;            // empty: the server's default
  std::optional<int32_t> num_steps;  // write the trace after that many scheduler steps
  std::string file_prefix = "rlserve"; // profile_prefix, then profile_id, joined by '-'
};
expected<profile_request> parse_profile_request(std::string_view body,
                                                const std::map<std::string, std::string>& query);

} // namespace rlserve::net::detail
