// HTTP routing as pure functions (net/http_route.hpp): the target split into path and query,
// the route and auth level a method and path select, the refusals, and the JSON body a routed
// call decodes (body plus query parameters). fuzz/http_fuzz.cpp feeds the same functions
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

BOOST_AUTO_TEST_SUITE_END()
