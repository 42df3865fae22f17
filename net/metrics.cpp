#include "net/metrics.hpp"

#include <fmt/format.h>

#include "messages/json_codec.hpp"

namespace rlserve::net {

namespace {

std::string key(std::string_view a, std::string_view b) {
  std::string k(a);
  k += '\0';
  k += b;
  return k;
}

// "a\0b\0c" -> ("a\0b", "c"): the last part off.
std::pair<std::string_view, std::string_view> split(std::string_view k) {
  auto pos = k.rfind('\0');
  return {k.substr(0, pos), k.substr(pos + 1)};
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

} // namespace

std::string escape_label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void metrics::request_done(std::string_view transport, std::string_view route,
                           request_result result, double seconds) {
  std::string_view r = result == request_result::ok       ? "ok"
                       : result == request_result::failed ? "failed"
                                                          : "error";
  std::lock_guard<std::mutex> guard{mtx_};
  ++requests_[key(key(transport, route), r)];
  if (result != request_result::error) {
    auto& s = request_seconds_[key(transport, route)];
    s.sum += seconds;
    ++s.count;
    s.last = seconds;
  }
}

void metrics::protocol_error(std::string_view code) {
  std::lock_guard<std::mutex> guard{mtx_};
  ++protocol_errors_[std::string(code)];
}

void metrics::generate_done(int64_t prompt_tokens, int64_t completion_tokens,
                            std::string_view finish) {
  std::lock_guard<std::mutex> guard{mtx_};
  prompt_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, prompt_tokens));
  completion_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, completion_tokens));
  ++finished_[std::string(finish.empty() ? "none" : finish)];
}

void metrics::update_phase(std::string_view phase, double seconds) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& s = phases_[std::string(phase)];
  s.sum += seconds;
  ++s.count;
  s.last = seconds;
}

void metrics::update_session_ended(std::string_view result) {
  std::lock_guard<std::mutex> guard{mtx_};
  ++sessions_[std::string(result)];
}

void metrics::tensor_bytes(uint64_t bytes, uint64_t copied_tensors) {
  std::lock_guard<std::mutex> guard{mtx_};
  tensor_bytes_ += bytes;
  copied_tensors_ += copied_tensors;
}

void metrics::disconnect_cleanup(std::string_view action) {
  std::lock_guard<std::mutex> guard{mtx_};
  ++cleanups_[std::string(action)];
}

std::string metrics::render(const GetServerInfoReqOutput* info) const {
  std::string out;
  auto it = std::back_inserter(out);
  header(out, "rlserve_engine_up", "gauge", "1 when the engine answered this scrape");
  fmt::format_to(it, "rlserve_engine_up {}\n", info && info->success ? 1 : 0);
  if (info && info->success) {
    header(out, "rlserve_queue_depth", "gauge", "Generate requests waiting (gate and scheduler queue)");
    fmt::format_to(it, "rlserve_queue_depth {}\n", info->waiting_requests);
    header(out, "rlserve_running_requests", "gauge", "Generate requests in the running batch");
    fmt::format_to(it, "rlserve_running_requests {}\n", info->running_requests);
    header(out, "rlserve_paused", "gauge", "1 while generation is paused");
    fmt::format_to(it, "rlserve_paused{{mode=\"{}\"}} {}\n", escape_label(info->pause_mode),
                   info->paused ? 1 : 0);
    header(out, "rlserve_update_session_open", "gauge", "1 while a weight-update session is open");
    fmt::format_to(it, "rlserve_update_session_open {}\n", info->weight_update_session_open ? 1 : 0);
    header(out, "rlserve_weight_version_info", "gauge", "The weight version serving now (label)");
    fmt::format_to(it, "rlserve_weight_version_info{{version=\"{}\"}} 1\n",
                   escape_label(info->weight_version));
    header(out, "rlserve_committed_updates_total", "counter", "Weight updates committed by the engine");
    fmt::format_to(it, "rlserve_committed_updates_total {}\n", info->committed_updates);
    header(out, "rlserve_prefix_cache_tokens", "gauge", "Tokens whose KV the prefix cache holds");
    fmt::format_to(it, "rlserve_prefix_cache_tokens {}\n", info->prefix_cached_tokens);
    header(out, "rlserve_prefix_cache_query_tokens_total", "counter",
           "Prompt and output tokens of admitted requests, looked up in the prefix cache");
    fmt::format_to(it, "rlserve_prefix_cache_query_tokens_total {}\n", info->prefix_query_tokens);
    header(out, "rlserve_prefix_cache_hit_tokens_total", "counter",
           "Tokens of admitted requests served from the prefix cache");
    fmt::format_to(it, "rlserve_prefix_cache_hit_tokens_total {}\n", info->prefix_hit_tokens);
    header(out, "rlserve_prefix_cache_hit_rate", "gauge", "Prefix cache hits / lookups, since start");
    fmt::format_to(it, "rlserve_prefix_cache_hit_rate {:.6f}\n", cache_hit_rate(*info));
    header(out, "rlserve_prefill_tokens_total", "counter", "Tokens prefilled (computed, not served from the cache)");
    fmt::format_to(it, "rlserve_prefill_tokens_total {}\n", info->prefill_tokens);
    // Speculative decoding (zero without a draft): watch acceptance fall after a target-only
    // update that left the draft behind.
    header(out, "rlserve_spec_num_draft_tokens", "gauge", "Draft tokens proposed per step (0: no draft)");
    fmt::format_to(it, "rlserve_spec_num_draft_tokens {}\n", info->speculative_num_draft_tokens);
    header(out, "rlserve_spec_verify_steps_total", "counter", "Verification steps of speculative decoding");
    fmt::format_to(it, "rlserve_spec_verify_steps_total {}\n", info->spec_verify_steps);
    header(out, "rlserve_spec_accepted_tokens_total", "counter", "Draft tokens the target accepted");
    fmt::format_to(it, "rlserve_spec_accepted_tokens_total {}\n", info->spec_accepted_tokens);
    header(out, "rlserve_spec_proposed_drafts_total", "counter", "Draft tokens the target verified");
    fmt::format_to(it, "rlserve_spec_proposed_drafts_total {}\n", info->spec_proposed_drafts);
    header(out, "rlserve_spec_accept_rate", "gauge", "Accepted draft tokens per proposed draft token, since start");
    fmt::format_to(it, "rlserve_spec_accept_rate {:.6f}\n", info->spec_accept_rate);
    header(out, "rlserve_spec_accept_length", "gauge",
           "Tokens per verification step (accepted + the target's own), since start");
    fmt::format_to(it, "rlserve_spec_accept_length {:.6f}\n", info->spec_accept_length);
    header(out, "rlserve_spec_recent_accept_length", "gauge",
           "Tokens per verification step over the last 256 verification steps");
    fmt::format_to(it, "rlserve_spec_recent_accept_length {:.6f}\n", info->spec_recent_accept_length);
  }
  header(out, "rlserve_ignored_request_fields_total", "counter",
         "Top-level request keys rlserve does not know, ignored as SGLang ignores them");
  fmt::format_to(it, "rlserve_ignored_request_fields_total {}\n", ignored_request_fields());
  std::lock_guard<std::mutex> guard{mtx_};
  header(out, "rlserve_requests_total", "counter", "Requests answered, by transport, route and result");
  for (const auto& [k, n] : requests_) {
    auto [tr_route, result] = split(k);
    auto [transport, route] = split(tr_route);
    fmt::format_to(it, "rlserve_requests_total{{transport=\"{}\",route=\"{}\",result=\"{}\"}} {}\n",
                   transport, escape_label(route), result, n);
  }
  header(out, "rlserve_request_seconds", "summary", "Time from receipt to reply, by transport and route");
  for (const auto& [k, s] : request_seconds_) {
    auto [transport, route] = split(k);
    fmt::format_to(it, "rlserve_request_seconds_sum{{transport=\"{}\",route=\"{}\"}} {:.6f}\n",
                   transport, escape_label(route), s.sum);
    fmt::format_to(it, "rlserve_request_seconds_count{{transport=\"{}\",route=\"{}\"}} {}\n",
                   transport, escape_label(route), s.count);
  }
  header(out, "rlserve_prompt_tokens_total", "counter", "Prompt tokens of finished generate requests");
  fmt::format_to(it, "rlserve_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "rlserve_completion_tokens_total", "counter", "Generated tokens of finished generate requests");
  fmt::format_to(it, "rlserve_completion_tokens_total {}\n", completion_tokens_);
  header(out, "rlserve_generate_finished_total", "counter", "Finished generate requests by finish reason");
  for (const auto& [reason, n] : finished_)
    fmt::format_to(it, "rlserve_generate_finished_total{{reason=\"{}\"}} {}\n", escape_label(reason), n);
  header(out, "rlserve_stream_chunks_total", "counter", "Streamed generate chunks sent");
  fmt::format_to(it, "rlserve_stream_chunks_total {}\n", chunks_.load());
  header(out, "rlserve_update_sessions_total", "counter", "Weight-update sessions ended, by result");
  for (const auto& [result, n] : sessions_)
    fmt::format_to(it, "rlserve_update_sessions_total{{result=\"{}\"}} {}\n", escape_label(result), n);
  header(out, "rlserve_update_phase_seconds", "summary",
         "Weight-update phases as the front sees them (begin, update, end, post_process, disk; "
         "session = begin reply to end reply)");
  for (const auto& [phase, s] : phases_) {
    fmt::format_to(it, "rlserve_update_phase_seconds_sum{{phase=\"{}\"}} {:.6f}\n", escape_label(phase), s.sum);
    fmt::format_to(it, "rlserve_update_phase_seconds_count{{phase=\"{}\"}} {}\n", escape_label(phase), s.count);
  }
  header(out, "rlserve_update_phase_last_seconds", "gauge", "The latest duration of each update phase");
  for (const auto& [phase, s] : phases_)
    fmt::format_to(it, "rlserve_update_phase_last_seconds{{phase=\"{}\"}} {:.6f}\n", escape_label(phase), s.last);
  header(out, "rlserve_update_tensor_bytes_total", "counter", "Tensor payload bytes received for updates");
  fmt::format_to(it, "rlserve_update_tensor_bytes_total {}\n", tensor_bytes_);
  header(out, "rlserve_binary_tensors_copied_total", "counter",
         "Tensors of binary frames copied because they were misaligned (0 for aligned clients)");
  fmt::format_to(it, "rlserve_binary_tensors_copied_total {}\n", copied_tensors_);
  header(out, "rlserve_protocol_errors_total", "counter", "Requests refused by the front, by error code");
  for (const auto& [code, n] : protocol_errors_)
    fmt::format_to(it, "rlserve_protocol_errors_total{{code=\"{}\"}} {}\n", escape_label(code), n);
  header(out, "rlserve_disconnect_cleanups_total", "counter",
         "Actions taken for clients that disconnected (abort_request, abort_session, continue_generation)");
  for (const auto& [action, n] : cleanups_)
    fmt::format_to(it, "rlserve_disconnect_cleanups_total{{action=\"{}\"}} {}\n", escape_label(action), n);
  header(out, "rlserve_ws_connections", "gauge", "Open websocket connections");
  fmt::format_to(it, "rlserve_ws_connections {}\n", ws_open_.load());
  header(out, "rlserve_ws_connections_total", "counter", "Websocket connections accepted");
  fmt::format_to(it, "rlserve_ws_connections_total {}\n", ws_total_.load());
  header(out, "rlserve_ws_upgrades_refused_total", "counter", "Websocket upgrades refused (auth)");
  fmt::format_to(it, "rlserve_ws_upgrades_refused_total {}\n", ws_refused_.load());
  header(out, "rlserve_ws_reads_paused_total", "counter",
         "Times a connection stopped reading until its unanswered frames were answered");
  fmt::format_to(it, "rlserve_ws_reads_paused_total {}\n", reads_paused_.load());
  return out;
}

} // namespace rlserve::net
