#include "net/http_route.hpp"

#include <cctype>

#include "messages/base64.hpp"
#include "messages/codec_registry.hpp"
#include "messages/json_codec.hpp"
#include "net/protocol.hpp"

namespace rlserve::net::detail {

namespace http = boost::beast::http;

namespace {

std::string url_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex_digit_value(s[i + 1]) >= 0 && hex_digit_value(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_digit_value(s[i + 1]) * 16 + hex_digit_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::map<std::string, std::string> parse_query(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    auto amp = q.find('&');
    auto item = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
    if (item.empty())
      continue;
    auto eq = item.find('=');
    out[url_decode(item.substr(0, eq))] =
      eq == std::string_view::npos ? std::string() : url_decode(item.substr(eq + 1));
  }
  return out;
}

} // namespace

std::string json_error_body(std::string_view error, std::string_view message) {
  return dump(json{{"error", error}, {"message", message}});
}

http_target split_target(std::string_view target) {
  auto qpos = target.find('?');
  http_target out;
  out.path = std::string(target.substr(0, qpos));
  if (qpos != std::string_view::npos)
    out.query = parse_query(target.substr(qpos + 1));
  while (out.path.size() > 1 && out.path.back() == '/')
    out.path.pop_back();
  return out;
}

bool json_media_type(std::string_view content_type) {
  std::string type(content_type.substr(0, content_type.find(';')));
  for (auto& c : type)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!type.empty() && type.back() == ' ')
    type.pop_back();
  return type == "application/json" || (type.starts_with("application/") && type.ends_with("+json"));
}

bool get_allowed(std::string_view route) {
  return route == "get_server_info" || route == "flush_cache" || route == "get_weights_by_name";
}

std::variant<http_routed, http_refusal> route_http_request(http::verb method,
                                                           std::string_view target,
                                                           std::string body, bool body_is_json) {
  auto [path, query] = split_target(target);
  const bool head = method == http::verb::head;
  const bool get = method == http::verb::get || head;
  const bool post = method == http::verb::post || method == http::verb::put;
  if (post && !body.empty() && !body_is_json)
    return http_refusal{415, json_error_body("Unsupported Media Type",
                                             "a request body must be JSON, sent with Content-Type: "
                                             "application/json")};

  http_routed out;
  if (path == "/v1/models" || path == "/v1/completions" || path == "/v1/chat/completions") {
    // OpenAI's routes (net/openai_call_actor.cpp), at the level of /generate.
    const bool models = path == "/v1/models";
    if (models ? !get : !post)
      return http_refusal{405, json_error_body("Method Not Allowed",
                                               std::string("use ") + (models ? "GET" : "POST") + " for " + path)};
    out.call.kind = models ? http_call::openai_models
                    : path == "/v1/completions" ? http_call::openai_completions
                                                : http_call::openai_chat;
    out.call.body = std::move(body);
    out.level = route_auth::normal;
  } else if (path == "/health" || path == "/health_generate" || path == "/metrics" || path == "/model_info") {
    if (!get)
      return http_refusal{405, json_error_body("Method Not Allowed", "use GET for " + path)};
    out.call.kind = path == "/health"            ? http_call::health
                    : path == "/health_generate" ? http_call::health_generate
                    : path == "/metrics"         ? http_call::metrics
                                                 : http_call::model_info;
    // Probes, load balancers, Prometheus and the trainers' health monitors send no key (SGLang
    // exempts the same paths); /model_info describes the model and stays at the normal level.
    if (out.call.kind != http_call::model_info)
      out.level = route_auth::exempt;
  } else {
    std::string name = path.size() > 1 ? path.substr(1) : "";
    if (name == "server_info")
      name = "get_server_info";
    const codec_entry* c = find_codec(name);
    if (!c) {
      std::string routes = "/health, /health_generate, /metrics, /model_info, /v1/models, /v1/completions, "
                           "/v1/chat/completions";
      for (const auto& e : all_codecs())
        routes += ", /" + std::string(e.route);
      return http_refusal{404, json_error_body("Not Found",
                                               "no route " + path + " (routes: " + routes + ")")};
    }
    // GET only where it has no side effect (or SGLang trainers use it: flush_cache); HEAD
    // never runs a route with one: a HEAD answers like its GET, without the body.
    const bool get_ok = get_allowed(c->route) && !(head && c->route == "flush_cache");
    if (!(post || (get && get_ok)))
      return http_refusal{405, json_error_body("Method Not Allowed",
                                               get_ok ? "use GET or POST for " + path
                                                      : "use POST for " + path +
                                                          " (it changes the engine's state)")};
    out.call.kind = http_call::route;
    out.call.codec = c;
    out.call.body = std::move(body);
    out.call.query = std::move(query);
    out.level = to_route_auth(c->auth);
  }
  out.path = std::move(path);
  return out;
}

expected<json> http_request_body(const codec_entry& codec, std::string_view text,
                                 const std::map<std::string, std::string>& query,
                                 std::size_t max_input_ids) {
  json body = json::object();
  if (!text.empty()) {
    auto j = parse_request_json(text, max_input_ids);
    if (!j)
      return std::move(j).take_failure();
    body = std::move(*j);
    if (body.is_null())
      body = json::object();
    if (!body.is_object())
      return fail("the request body must be a JSON object");
  }
  for (const auto& [k, v] : query) {
    auto name = (codec.route == "flush_cache" && k == "timeout") ? std::string("timeout_s") : k;
    if (body.contains(name))
      continue;
    auto parsed = parse_json(v);
    body[name] = parsed ? *parsed : json(v);
  }
  return body;
}

} // namespace rlserve::net::detail
