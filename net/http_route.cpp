#include "net/http_route.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "messages/base64.hpp"
#include "messages/codec_registry.hpp"
#include "messages/json_codec.hpp"
#include "net/protocol.hpp"
#include "net/vllm_route.hpp"

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
  for (auto& [k, v] : query_items(std::string("?") + std::string(q)))
    out[k] = std::move(v);
  return out;
}

} // namespace

std::vector<std::pair<std::string, std::string>> query_items(std::string_view target) {
  std::vector<std::pair<std::string, std::string>> out;
  auto qpos = target.find('?');
  if (qpos == std::string_view::npos)
    return out;
  auto q = target.substr(qpos + 1);
  while (!q.empty()) {
    auto amp = q.find('&');
    auto item = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
    if (item.empty())
      continue;
    auto eq = item.find('=');
    out.emplace_back(url_decode(item.substr(0, eq)),
                     eq == std::string_view::npos ? std::string() : url_decode(item.substr(eq + 1)));
  }
  return out;
}

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
  // Reads answered from the engine's server info (and probes): GET only.
  static const std::map<std::string_view, http_call::kind_t> reads = {
    {"/health", http_call::health},
    {"/health_generate", http_call::health_generate},
    {"/metrics", http_call::metrics},
    {"/model_info", http_call::model_info},
    {"/get_model_info", http_call::model_info},
    {"/get_weight_version", http_call::weight_version},
    {"/v1/loads", http_call::loads},
    {"/get_load", http_call::load},
  };
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
  } else if (is_vllm_control_path(path)) {
    // vLLM's control routes (net/vllm_route.hpp): a bad query is vLLM's 400, before the engine.
    auto v = parse_vllm_control(method, target, body);
    if (auto* no = std::get_if<vllm_refusal>(&v))
      return http_refusal{no->status, std::move(no->body)};
    out.call.kind = http_call::vllm_route;
    out.call.vllm = std::move(std::get<vllm_control>(v));
    out.call.body = std::move(body);
    // vLLM leaves these open; rlserve keeps its keys: changes need the admin key, reads the
    // normal one, as the SGLang routes they map onto.
    out.level = vllm_control_changes_state(out.call.vllm.op) ? route_auth::admin : route_auth::normal;
  } else if (auto read = reads.find(path); read != reads.end()) {
    if (!get)
      return http_refusal{405, json_error_body("Method Not Allowed", "use GET for " + path)};
    out.call.kind = read->second;
    out.call.query = std::move(query);
    // Probes, load balancers, Prometheus and the trainers' health monitors send no key (SGLang
    // exempts the same paths); the reads of model, version and load stay at the normal level.
    const bool probe = read->second == http_call::health || read->second == http_call::health_generate ||
                       read->second == http_call::metrics;
    out.level = probe ? route_auth::exempt : route_auth::normal;
  } else if (path == "/start_profile" || path == "/stop_profile") {
    // SGLang serves both on GET and POST. HEAD runs nothing.
    if (!(post || (get && !head)))
      return http_refusal{405, json_error_body("Method Not Allowed", "use POST or GET for " + path)};
    // Any web page the user opens can make the browser send a GET (an image, a link) without an
    // Origin header; it must not choose where the server writes.
    if (!post && query.contains("output_dir"))
      return http_refusal{400, json_error_body("Bad Request",
                                               "output_dir is taken only in a POST body (a GET can be "
                                               "sent by any web page the user opens); without it the "
                                               "trace goes to the temporary directory")};
    out.call.kind = path == "/start_profile" ? http_call::start_profile : http_call::stop_profile;
    out.call.body = std::move(body);
    out.call.query = std::move(query);
    out.level = route_auth::admin;
  } else {
    std::string name = path.size() > 1 ? path.substr(1) : "";
    if (name == "server_info")
      name = "get_server_info";
    const codec_entry* c = find_codec(name);
    if (!c) {
      std::string routes;
      for (const auto& [p, kind] : reads)
        routes += std::string(routes.empty() ? "" : ", ") + std::string(p);
      routes += ", /start_profile, /stop_profile, /server_info, /v1/models, /v1/completions, "
                "/v1/chat/completions, /pause, /resume, /is_paused, /abort_requests, /sleep, "
                "/wake_up, /is_sleeping, /reset_prefix_cache, /weight_info";
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

// ---- SGLang's reply shapes ---------------------------------------------------------------------

#ifndef RLSERVE_VERSION
#define RLSERVE_VERSION "0.0.0"
#endif

std::string_view server_version() { return RLSERVE_VERSION; }

namespace {

// The device index SGLang calls base_gpu_id: "cuda:3 (NVIDIA H200)" -> 3; the CPU -> 0.
int device_index(std::string_view device) {
  if (!device.starts_with("cuda:"))
    return 0;
  int n = 0;
  for (char c : device.substr(5)) {
    if (c < '0' || c > '9')
      break;
    n = n * 10 + (c - '0');
  }
  return n;
}

// Hugging Face's model_type from the architecture class: Qwen3MoeForCausalLM -> qwen3_moe.
std::string model_type_of(std::string_view architecture) {
  auto stem = architecture.substr(0, architecture.find("For"));
  std::string out;
  for (std::size_t i = 0; i < stem.size(); ++i) {
    char c = stem[i];
    if (c >= 'A' && c <= 'Z') {
      const char prev = i > 0 ? stem[i - 1] : 'A';
      if ((prev >= 'a' && prev <= 'z') || (prev >= '0' && prev <= '9'))
        out += '_';
      c = static_cast<char>(c - 'A' + 'a');
    }
    out += c;
  }
  return out;
}

double token_usage(const GetServerInfoReqOutput& info) {
  return info.max_total_num_tokens > 0
           ? static_cast<double>(info.num_used_tokens) / static_cast<double>(info.max_total_num_tokens)
           : 0.0;
}

} // namespace

json sglang_server_info(const GetServerInfoReqOutput& info, const launch_args& launch) {
  json j = to_json(info);
  const bool draft = !info.draft_model_path.empty();
  // ServerArgs: one engine process on one device.
  j["tokenizer_path"] = info.model_path;
  j["served_model_name"] = launch.served_model_name;
  j["dtype"] = "auto"; // the checkpoint's own, as SGLang's default
  j["context_length"] = info.max_context_length;
  for (auto key : {"tp_size", "dp_size", "pp_size", "ep_size", "moe_dp_size", "nnodes", "gpu_id_step"})
    j[key] = 1;
  j["node_rank"] = 0;
  j["base_gpu_id"] = device_index(info.device);
  j["skip_tokenizer_init"] = false;
  j["host"] = launch.host;
  j["port"] = launch.port;
  j["enable_memory_saver"] = launch.enable_memory_saver;
  j["disable_radix_cache"] = !info.prefix_cache;
  j["cache_hit_rate"] = cache_hit_rate(info);
  j["enable_return_routed_experts"] = launch.enable_return_routed_experts;
  j["enable_deterministic_inference"] = launch.enable_deterministic_inference;
  j["tool_call_parser"] = launch.tool_call_parser.empty() ? json(nullptr) : json(launch.tool_call_parser);
  j["reasoning_parser"] = launch.reasoning_parser.empty() ? json(nullptr) : json(launch.reasoning_parser);
  j["disaggregation_mode"] = "null";
  j["encoder_only"] = false;
  j["speculative_algorithm"] = draft ? json("STANDALONE") : json(nullptr);
  j["speculative_draft_model_path"] = draft ? json(info.draft_model_path) : json(nullptr);
  // scheduler_info and the per-rank internal states.
  j["max_req_input_len"] = info.max_context_length;
  json state = {{"weight_version", info.weight_version},
                {"avg_spec_accept_length", info.spec_accept_length},
                {"token_usage", token_usage(info)},
                {"cache_hit_rate", cache_hit_rate(info)}};
  j["internal_states"] = json::array({std::move(state)});
  j["version"] = server_version();
  return j;
}

json sglang_model_info(const GetServerInfoReqOutput& info) {
  return {{"model_path", info.model_path},
          {"tokenizer_path", info.model_path},
          {"is_generation", true},
          {"preferred_sampling_params", nullptr},
          {"weight_version", info.weight_version},
          {"has_image_understanding", false},
          {"has_audio_understanding", false},
          {"model_type", model_type_of(info.architecture)},
          {"architectures", json::array({info.architecture})},
          {"draft_model_path", info.draft_model_path.empty() ? json(nullptr) : json(info.draft_model_path)},
          {"architecture", info.architecture},
          {"device", info.device},
          {"vocab_size", info.vocab_size},
          {"max_context_length", info.max_context_length}};
}

expected<loads_query> parse_loads_query(const std::map<std::string, std::string>& query) {
  loads_query q;
  for (const auto& [key, value] : query) {
    if (key == "include") {
      std::string_view rest = value;
      while (true) {
        auto comma = rest.find(',');
        auto item = rest.substr(0, comma);
        while (!item.empty() && item.front() == ' ')
          item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ')
          item.remove_suffix(1);
        static const std::string_view sections[] = {"core", "memory", "spec", "lora", "disagg",
                                                    "queues", "all"};
        if (std::find(std::begin(sections), std::end(sections), item) == std::end(sections))
          return fail("include: \"" + std::string(item) +
                      "\" is not a section (sections: core, memory, spec, lora, disagg, queues, all)");
        if (item == "spec" || item == "all")
          q.speculative = true;
        if (comma == std::string_view::npos)
          break;
        rest = rest.substr(comma + 1);
      }
    } else if (key == "dp_rank") {
      if (value != "0")
        return fail("dp_rank: expected 0, the only data-parallel rank of this engine, got \"" + value + "\"");
    } else if (key == "format") {
      if (value != "json" && value != "prometheus")
        return fail("format: expected json or prometheus, got \"" + value + "\"");
      q.prometheus = value == "prometheus";
    }
    // Other parameters change nothing here, as FastAPI ignores parameters a route does not name.
  }
  return q;
}

json sglang_legacy_load(const GetServerInfoReqOutput& info) {
  return json::array({{{"dp_rank", 0},
                       {"num_reqs", info.running_requests + info.waiting_requests},
                       {"num_waiting_reqs", info.waiting_requests},
                       {"num_tokens", info.num_used_tokens}}});
}

http_reply sglang_loads(const GetServerInfoReqOutput& info, const loads_query& q,
                        std::string_view timestamp) {
  const double usage = token_usage(info);
  const bool draft = !info.draft_model_path.empty();
  if (q.prometheus) {
    std::string text;
    auto metric = [&](std::string_view name, std::string_view help, auto value) {
      text += fmt::format("# HELP sglang_{0} {1}\n# TYPE sglang_{0} gauge\nsglang_{0}{{dp_rank=\"0\"}} {2}\n",
                          name, help, value);
    };
    metric("num_running_reqs", "Number of running requests", info.running_requests);
    metric("num_waiting_reqs", "Number of waiting requests", info.waiting_requests);
    metric("num_used_tokens", "Number of tokens in use", info.num_used_tokens);
    metric("max_total_num_tokens", "Maximum token capacity", info.max_total_num_tokens);
    metric("token_usage", "Token pool usage ratio", usage);
    metric("cache_hit_rate", "Prefix cache hit rate", cache_hit_rate(info));
    metric("max_running_requests", "Maximum running requests", info.max_running_requests);
    if (q.speculative && draft) {
      metric("spec_accept_length", "Accepted tokens per verification step",
             info.spec_recent_accept_length);
      metric("spec_accept_rate", "Accepted draft tokens per proposed draft token", info.spec_accept_rate);
    }
    return http_reply{200, "text/plain; version=0.0.4; charset=utf-8", std::move(text), false};
  }
  json load = {{"dp_rank", 0},
               {"num_running_reqs", info.running_requests},
               {"num_waiting_reqs", info.waiting_requests},
               {"num_total_reqs", info.running_requests + info.waiting_requests},
               {"num_used_tokens", info.num_used_tokens},
               {"max_total_num_tokens", info.max_total_num_tokens},
               {"token_usage", usage},
               {"cache_hit_rate", cache_hit_rate(info)},
               {"max_running_requests", info.max_running_requests}};
  if (q.speculative && draft && info.speculative_num_draft_tokens > 0)
    load["speculative"] = {
      {"accept_length", info.spec_recent_accept_length},
      {"accept_rate", info.spec_accept_rate}};
  json body = {{"timestamp", timestamp},
               {"version", server_version()},
               {"dp_rank_count", 1},
               {"loads", json::array({load})},
               {"aggregate",
                {{"total_running_reqs", info.running_requests},
                 {"total_waiting_reqs", info.waiting_requests},
                 {"total_reqs", info.running_requests + info.waiting_requests},
                 {"avg_token_usage", usage}}}};
  return http_reply{200, "application/json", dump(body), false};
}

namespace {

// The fields of SGLang's ProfileReqInput, checked by type; unknown keys are ignored as SGLang's
// request structs ignore them. Empty: well-formed.
std::string profile_input_error(const json& body) {
  auto check = [&](const char* key, auto is_ok, const char* expected) -> std::string {
    auto it = body.find(key);
    if (it == body.end() || it->is_null() || is_ok(*it))
      return {};
    return std::string(key) + ": expected " + expected + ", got " + dump(*it);
  };
  auto is_string = [](const json& v) { return v.is_string(); };
  auto is_bool = [](const json& v) { return v.is_boolean(); };
  auto is_count = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0; };
  auto is_steps = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 1; };
  auto is_activities = [](const json& v) {
    if (!v.is_array())
      return false;
    for (const auto& a : v)
      if (!a.is_string() || (a != "CPU" && a != "GPU" && a != "MEM" && a != "RPD" && a != "CUDA_PROFILER"))
        return false;
    return true;
  };
  for (auto e : {check("output_dir", is_string, "a directory path"),
                 check("start_step", is_count, "an integer >= 0"),
                 check("num_steps", is_steps, "an integer >= 1"),
                 check("activities", is_activities,
                       "a list of \"CPU\", \"GPU\", \"MEM\", \"RPD\", \"CUDA_PROFILER\""),
                 check("profile_by_stage", is_bool, "true or false"),
                 check("with_stack", is_bool, "true or false"),
                 check("record_shapes", is_bool, "true or false"),
                 check("merge_profiles", is_bool, "true or false"),
                 check("profile_prefix", is_string, "a string"),
                 check("profile_id", is_string, "a string")})
    if (!e.empty())
      return e;
  if (auto it = body.find("output_dir"); it != body.end() && it->is_string() && it->get<std::string>().empty())
    return "output_dir: empty; name a directory or leave it out";
  return {};
}

} // namespace

expected<profile_request> parse_profile_request(std::string_view text,
                                                const std::map<std::string, std::string>& query) {
  json body = json::object();
  if (!text.empty()) {
    auto parsed = parse_json(text);
    if (!parsed)
      return fail(parsed.error());
    if (!parsed->is_null() && !parsed->is_object())
      return fail("the request body must be a JSON object");
    if (parsed->is_object())
      body = std::move(*parsed);
  }
  for (const auto& [k, v] : query)
    if (!body.contains(k)) {
      auto parsed = parse_json(v);
      body[k] = parsed ? *parsed : json(v);
    }
  if (auto e = profile_input_error(body); !e.empty())
    return fail(e);
  profile_request out;
  auto text_of = [&](const char* key) {
    auto it = body.find(key);
    return it != body.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  out.output_dir = text_of("output_dir");
  if (auto it = body.find("num_steps"); it != body.end() && it->is_number_integer()) {
    if (it->get<int64_t>() > INT32_MAX)
      return fail("num_steps: " + dump(*it) + " is too large");
    out.num_steps = static_cast<int32_t>(it->get<int64_t>());
  }
  if (auto it = body.find("start_step"); it != body.end() && it->is_number_integer() &&
                                         it->get<int64_t>() > 0)
    return fail("start_step: " + dump(*it) + " is not supported; a profile starts at once (leave "
                "it out or send 0)");
  if (auto it = body.find("activities"); it != body.end() && it->is_array())
    for (const auto& a : *it)
      if (a != "CPU" && a != "GPU")
        return fail("activities: " + dump(a) + " is not recorded; rlserve records the scheduler's "
                    "and runners' step timings (\"CPU\", \"GPU\")");
  for (const char* key : {"profile_prefix", "profile_id"})
    if (auto part = text_of(key); !part.empty()) {
      if (part.find('/') != std::string::npos || part.find('\0') != std::string::npos || part == "..")
        return fail(std::string(key) + ": " + dump(body[key]) + " would leave output_dir; use a plain name");
      out.file_prefix = key == std::string_view("profile_prefix") ? part : out.file_prefix + "-" + part;
    }
  return out;
}

} // namespace rlserve::net::detail
