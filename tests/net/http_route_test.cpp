// HTTP routing as pure functions (net/http_route.hpp): the target split into path and query,
// the route and auth level a method and path select, the refusals, the JSON body a routed
// call decodes (body plus query parameters), and SGLang's reply shapes of the HTTP-only reads
// (server info, model info, /v1/loads, the profile refusals). fuzz/http_fuzz.cpp feeds the same functions
// untrusted requests; these are the cases a reader can check by eye.
#include <boost/test/unit_test.hpp>

#include <variant>

#include "net/http_route.hpp"

using namespace rlserve;
using namespace rlserve::net;
using namespace rlserve::net::detail;
namespace http = boost::beast::http;

namespace {

const http_routed& routed(const std::variant<http_routed, http_refusal>& r) {
  if (const auto* refusal = std::get_if<http_refusal>(&r))
    BOOST_FAIL("refused: " << refusal->body);
  return std::get<http_routed>(r);
}

unsigned refusal_status(const std::variant<http_routed, http_refusal>& r) {
  BOOST_REQUIRE(std::holds_alternative<http_refusal>(r));
  return std::get<http_refusal>(r).status;
}

} // namespace

BOOST_AUTO_TEST_SUITE(http_route_test)

BOOST_AUTO_TEST_CASE(target_splits_into_path_and_url_decoded_query) {
  auto t = split_target("/flush_cache//?timeout=5&a=%41+b&&flag&bad=%4");
  BOOST_TEST(t.path == "/flush_cache");
  BOOST_TEST(t.query.at("timeout") == "5");
  BOOST_TEST(t.query.at("a") == "A b");
  BOOST_TEST(t.query.at("flag") == "");
  BOOST_TEST(t.query.at("bad") == "%4"); // an incomplete escape stays as written
  BOOST_TEST(split_target("/").path == "/");
  BOOST_TEST(split_target("").path == "");
}

BOOST_AUTO_TEST_CASE(methods_and_paths_select_a_call_and_its_level) {
  auto health = routed(route_http_request(http::verb::head, "/health/", ""));
  BOOST_TEST(health.call.kind == http_call::health);
  BOOST_TEST((health.level == route_auth::exempt));
  for (const char* open : {"/health_generate", "/metrics"})
    BOOST_TEST((routed(route_http_request(http::verb::get, open, "")).level == route_auth::exempt), open);
  BOOST_TEST((routed(route_http_request(http::verb::get, "/model_info", "")).level == route_auth::normal));

  auto gen = routed(route_http_request(http::verb::post, "/generate", R"({"text": "hi"})"));
  BOOST_TEST(gen.call.kind == http_call::route);
  BOOST_TEST(gen.call.codec->route == "generate");
  BOOST_TEST(gen.call.body == R"({"text": "hi"})");

  auto info = routed(route_http_request(http::verb::get, "/server_info?x=1", ""));
  BOOST_TEST(info.call.codec->route == "get_server_info");
  BOOST_TEST(info.call.query.at("x") == "1");

  auto flush = routed(route_http_request(http::verb::get, "/flush_cache", ""));
  BOOST_TEST((flush.level == route_auth::admin));
}

BOOST_AUTO_TEST_CASE(unknown_paths_and_wrong_methods_are_refused) {
  BOOST_TEST(refusal_status(route_http_request(http::verb::post, "/nope", "")) == 404u);
  BOOST_TEST(refusal_status(route_http_request(http::verb::get, "/", "")) == 404u);
  BOOST_TEST(refusal_status(route_http_request(http::verb::get, "/generate", "")) == 405u);
  BOOST_TEST(refusal_status(route_http_request(http::verb::post, "/metrics", "")) == 405u);
  BOOST_TEST(refusal_status(route_http_request(http::verb::delete_, "/flush_cache", "")) == 405u);
  // Side effects need POST; HEAD never flushes; a body must be JSON.
  BOOST_TEST(refusal_status(route_http_request(http::verb::get, "/pause_generation?mode=abort", "")) == 405u);
  BOOST_TEST(refusal_status(route_http_request(http::verb::head, "/flush_cache", "")) == 405u);
  BOOST_TEST(refusal_status(route_http_request(http::verb::post, "/pause_generation", "{}", false)) == 415u);
  BOOST_TEST(routed(route_http_request(http::verb::post, "/continue_generation", "", false)).call.kind ==
             http_call::route);
  BOOST_TEST(json_media_type("application/json"));
  BOOST_TEST(json_media_type("Application/JSON; charset=utf-8"));
  BOOST_TEST(json_media_type("application/vnd.api+json"));
  BOOST_TEST(!json_media_type("text/plain"));
  BOOST_TEST(!json_media_type("application/x-www-form-urlencoded"));
  BOOST_TEST(!json_media_type(""));
}

BOOST_AUTO_TEST_CASE(body_and_query_make_the_decoded_object) {
  const codec_entry& flush = *find_codec("flush_cache");
  auto b = http_request_body(flush, "", {{"timeout", "2.5"}, {"name", "not json"}});
  BOOST_REQUIRE_MESSAGE(b, b.error());
  BOOST_TEST((*b)["timeout_s"] == 2.5);
  BOOST_TEST((*b)["name"] == "not json");

  // The body wins over the query; null reads as {}.
  b = http_request_body(flush, R"({"timeout_s": 1})", {{"timeout", "9"}});
  BOOST_REQUIRE_MESSAGE(b, b.error());
  BOOST_TEST((*b)["timeout_s"] == 1);
  b = http_request_body(flush, "null", {});
  BOOST_REQUIRE_MESSAGE(b, b.error());
  BOOST_TEST(b->is_object());

  // Errors are values: a non-object, broken JSON, a number outside double's range.
  auto e = http_request_body(flush, "[1]", {});
  BOOST_REQUIRE(!e);
  BOOST_TEST(e.error() == "the request body must be a JSON object");
  BOOST_TEST(!http_request_body(flush, "{", {}));
  BOOST_TEST(!http_request_body(flush, R"({"timeout_s": 1e400})", {}));
  b = http_request_body(flush, "", {{"timeout", "1e400"}}); // not JSON: kept as a string
  BOOST_REQUIRE_MESSAGE(b, b.error());
  BOOST_TEST((*b)["timeout_s"] == "1e400");
}

BOOST_AUTO_TEST_CASE(sglang_reads_route_by_path_and_level) {
  for (const char* path : {"/get_weight_version", "/v1/loads?include=core", "/get_model_info", "/get_load"}) {
    auto r = routed(route_http_request(http::verb::get, path, ""));
    BOOST_TEST((r.level == route_auth::normal), path);
    BOOST_TEST(refusal_status(route_http_request(http::verb::post, path, "{}")) == 405u, path);
  }
  BOOST_TEST(routed(route_http_request(http::verb::get, "/get_weight_version", "")).call.kind ==
             http_call::weight_version);
  BOOST_TEST(routed(route_http_request(http::verb::get, "/get_load", "")).call.kind == http_call::load);
  auto loads = routed(route_http_request(http::verb::get, "/v1/loads?include=core", ""));
  BOOST_TEST(loads.call.kind == http_call::loads);
  BOOST_TEST(loads.call.query.at("include") == "core");
  for (const char* path : {"/start_profile", "/stop_profile"}) {
    auto post = routed(route_http_request(http::verb::post, path, R"({"num_steps": 2})"));
    BOOST_TEST((post.level == route_auth::admin), path);
    BOOST_TEST((routed(route_http_request(http::verb::get, path, "")).level == route_auth::admin), path);
    BOOST_TEST(refusal_status(route_http_request(http::verb::head, path, "")) == 405u, path);
  }
}

namespace {

GetServerInfoReqOutput sample_info() {
  GetServerInfoReqOutput info;
  info.model_path = "/models/qwen3";
  info.weight_version = "7";
  info.device = "cuda:3 (NVIDIA H200)";
  info.architecture = "Qwen3MoeForCausalLM";
  info.max_context_length = 4096;
  info.running_requests = 2;
  info.waiting_requests = 3;
  info.max_running_requests = 64;
  info.max_total_num_tokens = 1000;
  info.num_used_tokens = 250;
  return info;
}

} // namespace

BOOST_AUTO_TEST_CASE(server_info_carries_the_server_args_trainers_read) {
  auto j = sglang_server_info(sample_info(), launch_args{"10.0.0.5", 30007, false, true, false, "policy-7b"});
  // slime's external-engine discovery and sanity check, miles' get_server_info.
  for (const char* one : {"tp_size", "dp_size", "pp_size", "ep_size", "moe_dp_size", "nnodes"})
    BOOST_TEST(j[one] == 1, one);
  BOOST_TEST(j["model_path"] == "/models/qwen3");
  BOOST_TEST(j["served_model_name"] == "policy-7b");
  BOOST_TEST(j["base_gpu_id"] == 3);
  BOOST_TEST(j["disaggregation_mode"] == "null");
  BOOST_TEST(j["enable_memory_saver"] == false);
  BOOST_TEST(j["enable_return_routed_experts"] == true); // the launch flags, as given
  BOOST_TEST(j["host"] == "10.0.0.5");                  // slime compares host and port too
  BOOST_TEST(j["port"] == 30007);
  BOOST_TEST(j["encoder_only"] == false);
  BOOST_TEST(j["context_length"] == 4096);
  BOOST_TEST(j["max_total_num_tokens"] == 1000);
  BOOST_TEST(j["speculative_algorithm"].is_null());
  BOOST_TEST(j["weight_version"] == "7"); // rlserve's own fields stay
  BOOST_TEST(j["internal_states"].size() == 1u);
  BOOST_TEST(j["version"] == std::string(server_version()));
}

BOOST_AUTO_TEST_CASE(model_info_names_the_model_as_sglang_does) {
  auto j = sglang_model_info(sample_info());
  BOOST_TEST(j["weight_version"] == "7");
  BOOST_TEST(j["is_generation"] == true);
  BOOST_TEST(j["model_type"] == "qwen3_moe");
  BOOST_TEST(j["architectures"] == json::array({"Qwen3MoeForCausalLM"}));
  BOOST_TEST(j["tokenizer_path"] == "/models/qwen3");
}

BOOST_AUTO_TEST_CASE(loads_in_sglang_shape_and_bad_queries_named) {
  auto q = parse_loads_query({{"include", "core"}});
  BOOST_REQUIRE(q.has_value());
  auto r = sglang_loads(sample_info(), *q, "2026-01-02T03:04:05.000006+00:00");
  BOOST_TEST(r.status == 200u);
  auto j = json::parse(r.body);
  BOOST_TEST(j["dp_rank_count"] == 1);
  BOOST_TEST(j["timestamp"] == "2026-01-02T03:04:05.000006+00:00");
  const auto& load = j["loads"][0];
  // slime's num_requests_from_load reads num_total_reqs (or running + waiting).
  BOOST_TEST(load["num_total_reqs"] == 5);
  BOOST_TEST(load["num_running_reqs"] == 2);
  BOOST_TEST(load["num_waiting_reqs"] == 3);
  BOOST_TEST(load["token_usage"].get<double>() == 0.25);
  BOOST_TEST(j["aggregate"]["total_reqs"] == 5);
  BOOST_TEST(!load.contains("speculative")); // no draft

  // sglang-router 0.3 polls /get_load and sums num_tokens over the list.
  auto legacy = sglang_legacy_load(sample_info());
  BOOST_REQUIRE(legacy.is_array() && legacy.size() == 1u);
  BOOST_TEST(legacy[0]["dp_rank"] == 0);
  BOOST_TEST(legacy[0]["num_reqs"] == 5);
  BOOST_TEST(legacy[0]["num_waiting_reqs"] == 3);
  BOOST_TEST(legacy[0]["num_tokens"] == sample_info().num_used_tokens);

  auto prom = sglang_loads(sample_info(), *parse_loads_query({{"format", "prometheus"}}), "t");
  BOOST_TEST(prom.content_type.starts_with("text/plain"));
  BOOST_TEST(prom.body.find("sglang_num_running_reqs{dp_rank=\"0\"} 2\n") != std::string::npos);

  BOOST_TEST(parse_loads_query({{"include", "core, spec"}}).has_value());
  auto bad_section = parse_loads_query({{"include", "core,gpus"}});
  BOOST_REQUIRE(!bad_section.has_value());
  BOOST_TEST(bad_section.error().find("include: \"gpus\"") == 0u);
  BOOST_TEST(!parse_loads_query({{"dp_rank", "1"}}).has_value());
  BOOST_TEST(!parse_loads_query({{"format", "xml"}}).has_value());
}

BOOST_AUTO_TEST_CASE(profile_requests_are_read_as_sglang_sends_them) {
  auto ok = parse_profile_request(
    R"({"output_dir": "/tmp/p", "num_steps": 5, "activities": ["CPU", "GPU"],
        "profile_by_stage": false, "with_stack": null, "record_shapes": null, "start_step": 0,
        "profile_prefix": "step", "profile_id": "7"})",
    {});
  BOOST_REQUIRE(ok.has_value());
  BOOST_TEST(ok->output_dir == "/tmp/p");
  BOOST_TEST((ok->num_steps == std::optional<int32_t>(5)));
  BOOST_TEST(ok->file_prefix == "step-7");
  auto from_query = parse_profile_request("", {{"num_steps", "3"}, {"output_dir", "/x"}});
  BOOST_REQUIRE(from_query.has_value());
  BOOST_TEST((from_query->num_steps == std::optional<int32_t>(3)));
  BOOST_TEST(from_query->output_dir == "/x");
  BOOST_TEST(parse_profile_request("", {}).has_value()); // every field defaults
  auto error = [](std::string_view body) {
    auto r = parse_profile_request(body, {});
    return r ? std::string() : r.error();
  };
  BOOST_TEST(error(R"({"num_steps": 0})").starts_with("num_steps"));
  BOOST_TEST(error(R"({"activities": ["TPU"]})").starts_with("activities"));
  BOOST_TEST(error(R"({"activities": ["MEM"]})").find("is not recorded") != std::string::npos);
  BOOST_TEST(error(R"({"start_step": 4})").starts_with("start_step"));
  BOOST_TEST(error(R"({"output_dir": 7})").starts_with("output_dir"));
  BOOST_TEST(error(R"({"output_dir": ""})").starts_with("output_dir"));
  BOOST_TEST(error(R"({"profile_id": "../x"})").starts_with("profile_id"));
  BOOST_TEST(!error("[1]").empty());
  BOOST_TEST(!error("{").empty());
  BOOST_TEST(!parse_profile_request("", {{"num_steps", "x"}}).has_value());
}

BOOST_AUTO_TEST_SUITE_END()
