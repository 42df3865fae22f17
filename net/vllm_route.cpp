#include "net/vllm_route.hpp"

#include <algorithm>
#include <map>

#include "messages/json_codec.hpp"
#include "net/http_route.hpp"

namespace rlserve::net::detail {

namespace http = boost::beast::http;

namespace {

struct route_info {
  vllm_control::op_t op;
  bool get; // GET (a read); else POST
};

const std::map<std::string_view, route_info>& routes() {
  static const std::map<std::string_view, route_info> r = {
    {"/pause", {vllm_control::pause, false}},
    {"/resume", {vllm_control::resume, false}},
    {"/is_paused", {vllm_control::is_paused, true}},
    {"/abort_requests", {vllm_control::abort_requests, false}},
    {"/sleep", {vllm_control::sleep, false}},
    {"/wake_up", {vllm_control::wake_up, false}},
    {"/is_sleeping", {vllm_control::is_sleeping, true}},
    {"/reset_prefix_cache", {vllm_control::reset_prefix_cache, false}},
    {"/weight_info", {vllm_control::weight_info, true}},
  };
  return r;
}

vllm_refusal bad(std::string_view param, std::string message) {
  return {400, vllm_error_body(std::string(param) + ": " + message, param, 400)};
}

// FastAPI's bool query values (pydantic's lax bool).
std::optional<bool> parse_bool(std::string v) {
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "true" || v == "1" || v == "yes" || v == "on" || v == "t" || v == "y")
    return true;
  if (v == "false" || v == "0" || v == "no" || v == "off" || v == "f" || v == "n")
    return false;
  return std::nullopt;
}

std::optional<pause_mode> parse_mode(std::string_view v) {
  if (v == "abort")
    return pause_mode::abort;
  if (v == "wait")
    return pause_mode::drain; // running requests finish; new ones wait
  if (v == "keep")
    return pause_mode::in_place; // frozen with their KV; they go on after /resume
  return std::nullopt;
}

} // namespace

std::string vllm_error_body(std::string_view message, std::string_view param, unsigned code,
                            std::string_view type) {
  return dump(json{{"error",
                    {{"message", message},
                     {"type", type},
                     {"param", param.empty() ? json(nullptr) : json(param)},
                     {"code", code}}}});
}

bool is_vllm_control_path(std::string_view path) { return routes().contains(path); }

bool vllm_control_changes_state(vllm_control::op_t op) {
  return op != vllm_control::is_paused && op != vllm_control::is_sleeping &&
         op != vllm_control::weight_info;
}

std::vector<std::string> rlserve_memory_tags(const std::vector<std::string>& vllm_tags) {
  std::vector<std::string> out;
  for (const auto& t : vllm_tags) {
    if (t == "weights")
      out.push_back("weights");
    else if (t == "kv_cache") {
      out.push_back("kv_cache");
      out.push_back("cuda_graph");
    }
  }
  return canonical_memory_tags(out); // none: all three
}

std::variant<vllm_control, vllm_refusal> parse_vllm_control(http::verb method,
                                                            std::string_view target,
                                                            std::string_view body) {
  auto path = split_target(target).path;
  const auto& info = routes().at(path);
  const bool get = method == http::verb::get || method == http::verb::head;
  const bool post = method == http::verb::post || method == http::verb::put;
  if (info.get ? !get : !post)
    // FastAPI's answer to a method a route does not take.
    return vllm_refusal{405, dump(json{{"detail", "Method Not Allowed"}})};
  vllm_control out;
  out.op = info.op;
  for (const auto& [key, value] : query_items(target)) {
    const std::string param = "query." + key;
    if ((out.op == vllm_control::pause || out.op == vllm_control::sleep) && key == "mode") {
      auto m = parse_mode(value);
      if (!m)
        return bad(param, "expected abort, wait or keep, got \"" + value + "\"");
      out.mode = *m;
    } else if (out.op == vllm_control::pause && key == "clear_cache") {
      auto b = parse_bool(value);
      if (!b)
        return bad(param, "expected true or false, got \"" + value + "\"");
      out.clear_cache = *b;
    } else if (out.op == vllm_control::pause && key == "wait_for_inflight_requests") {
      // vLLM's older, deprecated spelling of mode=wait.
      auto b = parse_bool(value);
      if (!b)
        return bad(param, "expected true or false, got \"" + value + "\"");
      if (*b)
        out.mode = pause_mode::drain;
    } else if (out.op == vllm_control::sleep && key == "level") {
      if (value != "0" && value != "1" && value != "2")
        return bad(param, "expected 0, 1 or 2, got \"" + value + "\"");
      out.level = value[0] - '0';
    } else if ((out.op == vllm_control::sleep || out.op == vllm_control::wake_up) && key == "tags") {
      if (value != "weights" && value != "kv_cache")
        return bad(param, "expected weights or kv_cache, got \"" + value + "\"");
      if (std::find(out.tags.begin(), out.tags.end(), value) == out.tags.end())
        out.tags.push_back(value);
    } else if (out.op == vllm_control::reset_prefix_cache &&
               (key == "reset_running_requests" || key == "reset_external")) {
      if (!parse_bool(value))
        return bad(param, "expected true or false, got \"" + value + "\"");
    }
    // Other parameters change nothing, as FastAPI ignores parameters a route does not name.
  }
  if (out.op == vllm_control::abort_requests && !body.empty()) {
    auto j = parse_json(body);
    if (!j)
      return bad("body", "not JSON: " + j.error());
    if (!j->is_null() && !j->is_object())
      return bad("body", "expected a JSON object {\"request_ids\": [...]}");
    if (j->is_object()) {
      auto it = j->find("request_ids");
      if (it != j->end() && !it->is_null()) {
        if (!it->is_array())
          return bad("body.request_ids", "expected a list of request ids, got " + dump(*it));
        for (const auto& id : *it) {
          if (!id.is_string() || id.get<std::string>().empty())
            return bad("body.request_ids", "expected request ids (non-empty strings), got " + dump(id));
          out.request_ids.push_back(id.get<std::string>());
        }
      }
    }
  }
  return out;
}

} // namespace rlserve::net::detail
