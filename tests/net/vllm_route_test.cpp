// vLLM's control routes as pure functions (net/vllm_route.hpp): the call a method, path and
// query select, and every refusal: 405 for the wrong method, 400 with vLLM's error object naming
// the parameter ("query.mode", "body.request_ids") for a bad value. Also how route_http_request
// mounts them beside SGLang's routes, with their key levels.
#include <boost/test/unit_test.hpp>

#include <variant>

#include "messages/json_codec.hpp"
#include "net/http_route.hpp"
#include "net/vllm_route.hpp"

using namespace rlserve;
using namespace rlserve::net;
using namespace rlserve::net::detail;
namespace http = boost::beast::http;

namespace {

vllm_control parsed(http::verb m, std::string_view target, std::string_view body = "") {
  auto r = parse_vllm_control(m, target, body);
  if (auto* no = std::get_if<vllm_refusal>(&r))
    BOOST_FAIL("refused: " << no->body);
  return std::get<vllm_control>(r);
}

// The refusal's error object; checks its status and that it names `param`.
json refused(http::verb m, std::string_view target, std::string_view body, std::string_view param) {
  auto r = parse_vllm_control(m, target, body);
  BOOST_REQUIRE(std::holds_alternative<vllm_refusal>(r));
  const auto& no = std::get<vllm_refusal>(r);
  BOOST_TEST(no.status == 400u);
  auto j = parse_json(no.body);
  BOOST_REQUIRE(j.has_value());
  const auto& e = (*j)["error"];
  BOOST_TEST(e["param"].get<std::string>() == param);
  BOOST_TEST(e["code"].get<int>() == 400);
  BOOST_TEST(e["type"].get<std::string>() == "BadRequestError");
  BOOST_TEST(e["message"].get<std::string>().find(param) != std::string::npos, e["message"]);
  return e;
}

} // namespace

BOOST_AUTO_TEST_SUITE(vllm_route_test)

BOOST_AUTO_TEST_CASE(pause_modes_map_onto_the_engines) {
  auto c = parsed(http::verb::post, "/pause");
  BOOST_TEST(c.op == vllm_control::pause);
  BOOST_TEST((c.mode == pause_mode::abort)); // vLLM's default
  BOOST_TEST(c.clear_cache);
  BOOST_TEST((parsed(http::verb::post, "/pause?mode=wait").mode == pause_mode::drain));
  BOOST_TEST((parsed(http::verb::post, "/pause?mode=keep").mode == pause_mode::in_place));
  BOOST_TEST(!parsed(http::verb::post, "/pause?mode=keep&clear_cache=false").clear_cache);
  BOOST_TEST(!parsed(http::verb::post, "/pause?clear_cache=0").clear_cache);
  // The deprecated spelling of wait.
  BOOST_TEST((parsed(http::verb::post, "/pause?wait_for_inflight_requests=true").mode == pause_mode::drain));
  // Parameters a route does not name are ignored, as FastAPI ignores them.
  BOOST_TEST((parsed(http::verb::post, "/pause?level=9").mode == pause_mode::abort));
}

BOOST_AUTO_TEST_CASE(bad_pause_queries_name_the_parameter) {
  refused(http::verb::post, "/pause?mode=stop", "", "query.mode");
  refused(http::verb::post, "/pause?mode=", "", "query.mode");
  refused(http::verb::post, "/pause?mode=retract", "", "query.mode"); // SGLang's, not vLLM's
  refused(http::verb::post, "/pause?clear_cache=maybe", "", "query.clear_cache");
  refused(http::verb::post, "/pause?wait_for_inflight_requests=2", "", "query.wait_for_inflight_requests");
}

BOOST_AUTO_TEST_CASE(methods_are_vllms) {
  for (const char* post : {"/pause", "/resume", "/abort_requests", "/sleep", "/wake_up", "/reset_prefix_cache"}) {
    auto r = parse_vllm_control(http::verb::get, post, "");
    BOOST_REQUIRE(std::holds_alternative<vllm_refusal>(r));
    BOOST_TEST(std::get<vllm_refusal>(r).status == 405u, post);
  }
  for (const char* get : {"/is_paused", "/is_sleeping", "/weight_info"}) {
    auto r = parse_vllm_control(http::verb::post, get, "");
    BOOST_REQUIRE(std::holds_alternative<vllm_refusal>(r));
    BOOST_TEST(std::get<vllm_refusal>(r).status == 405u, get);
    BOOST_TEST(!vllm_control_changes_state(parsed(http::verb::get, get).op), get);
  }
}

BOOST_AUTO_TEST_CASE(abort_requests_reads_its_ids) {
  BOOST_TEST(parsed(http::verb::post, "/abort_requests").request_ids.empty());
  BOOST_TEST(parsed(http::verb::post, "/abort_requests", "{}").request_ids.empty());
  BOOST_TEST(parsed(http::verb::post, "/abort_requests", R"({"request_ids": null})").request_ids.empty());
  auto c = parsed(http::verb::post, "/abort_requests", R"({"request_ids": ["a", "b"]})");
  BOOST_TEST(c.request_ids.size() == 2u);
  refused(http::verb::post, "/abort_requests", "[1]", "body");
  refused(http::verb::post, "/abort_requests", "{", "body");
  refused(http::verb::post, "/abort_requests", R"({"request_ids": "a"})", "body.request_ids");
  refused(http::verb::post, "/abort_requests", R"({"request_ids": [1]})", "body.request_ids");
  refused(http::verb::post, "/abort_requests", R"({"request_ids": [""]})", "body.request_ids");
}

BOOST_AUTO_TEST_CASE(sleep_levels_and_tags) {
  auto c = parsed(http::verb::post, "/sleep");
  BOOST_TEST(c.level == 1);
  BOOST_TEST((c.mode == pause_mode::abort));
  BOOST_TEST(parsed(http::verb::post, "/sleep?level=0").level == 0);
  BOOST_TEST(parsed(http::verb::post, "/sleep?level=2").level == 2);
  BOOST_TEST((parsed(http::verb::post, "/sleep?mode=keep").mode == pause_mode::in_place));
  refused(http::verb::post, "/sleep?level=3", "", "query.level");
  refused(http::verb::post, "/sleep?level=one", "", "query.level");
  refused(http::verb::post, "/sleep?level=", "", "query.level");
  refused(http::verb::post, "/sleep?mode=nap", "", "query.mode");
  refused(http::verb::post, "/sleep?tags=cuda_graph", "", "query.tags");
  auto w = parsed(http::verb::post, "/wake_up?tags=weights&tags=kv_cache&tags=weights");
  BOOST_TEST((w.tags == std::vector<std::string>{"weights", "kv_cache"}));
  BOOST_TEST(parsed(http::verb::post, "/wake_up").tags.empty());
  refused(http::verb::post, "/wake_up?tags=kv", "", "query.tags");
  refused(http::verb::post, "/wake_up?tags=", "", "query.tags");
}

BOOST_AUTO_TEST_CASE(vllm_tags_name_rlserves_memory) {
  BOOST_TEST((rlserve_memory_tags({"weights"}) == std::vector<std::string>{"weights"}));
  BOOST_TEST((rlserve_memory_tags({"kv_cache"}) == std::vector<std::string>{"kv_cache", "cuda_graph"}));
  BOOST_TEST((rlserve_memory_tags({}) == std::vector<std::string>{"weights", "kv_cache", "cuda_graph"}));
}

BOOST_AUTO_TEST_CASE(reset_prefix_cache_checks_its_flags) {
  BOOST_TEST(parsed(http::verb::post, "/reset_prefix_cache?reset_running_requests=true").op ==
             vllm_control::reset_prefix_cache);
  refused(http::verb::post, "/reset_prefix_cache?reset_running_requests=sure", "", "query.reset_running_requests");
  refused(http::verb::post, "/reset_prefix_cache?reset_external=x", "", "query.reset_external");
}

BOOST_AUTO_TEST_CASE(route_http_request_mounts_them_beside_sglangs) {
  auto r = route_http_request(http::verb::post, "/pause/?mode=keep", "");
  BOOST_REQUIRE(std::holds_alternative<http_routed>(r));
  const auto& p = std::get<http_routed>(r);
  BOOST_TEST(p.call.kind == http_call::vllm_route);
  BOOST_TEST((p.call.vllm.mode == pause_mode::in_place));
  BOOST_TEST((p.level == route_auth::admin)); // vLLM leaves it open; rlserve keeps its admin key
  auto read = route_http_request(http::verb::get, "/is_paused", "");
  BOOST_TEST((std::get<http_routed>(read).level == route_auth::normal));
  // A bad query is vLLM's 400 before anything else.
  auto bad = route_http_request(http::verb::post, "/pause?mode=x", "");
  BOOST_REQUIRE(std::holds_alternative<http_refusal>(bad));
  BOOST_TEST(std::get<http_refusal>(bad).status == 400u);
  BOOST_TEST(std::get<http_refusal>(bad).body.find("query.mode") != std::string::npos);
  // The route shared by both dialects stays SGLang's (its reply is a superset of vLLM's).
  auto v = route_http_request(http::verb::post, "/update_weight_version", R"({"new_version": "x"})");
  BOOST_TEST(std::get<http_routed>(v).call.kind == http_call::route);
  // SGLang's own pause route is untouched.
  auto s = route_http_request(http::verb::post, "/pause_generation", "{}");
  BOOST_TEST(std::get<http_routed>(s).call.codec->route == "pause_generation");
}

BOOST_AUTO_TEST_CASE(query_items_keep_repeated_keys_in_order) {
  auto q = query_items("/wake_up?tags=a&tags=b%20c&&x");
  BOOST_REQUIRE(q.size() == 3u);
  BOOST_TEST(q[0].second == "a");
  BOOST_TEST(q[1].second == "b c");
  BOOST_TEST(q[2].first == "x");
  BOOST_TEST(query_items("/no_query").empty());
}

BOOST_AUTO_TEST_SUITE_END()
