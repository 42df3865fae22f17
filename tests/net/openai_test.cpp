// OpenAI's reply shapes (net/openai.hpp) built from engine results, whole, and the routing of the
// /v1 paths (net/http_route.hpp): methods, auth level, refusals.
#include <boost/test/unit_test.hpp>

#include <variant>

#include "model/bpe_tokenizer.hpp"
#include "model/tiny_tokenizer.hpp"
#include "net/http_route.hpp"
#include "net/openai.hpp"

using namespace rlserve;
using namespace rlserve::net;
using namespace rlserve::net::detail;
namespace http = boost::beast::http;

namespace {

GenerateReqOutput finished_output() {
  GenerateReqOutput out;
  out.rid = "r1";
  out.text = "ab";
  out.output_ids = {97, 98}; // the tiny tokenizer's first 256 ids are the bytes
  out.output_token_logprobs = {-0.5f, -1.25f};
  out.output_top_logprobs = {{{97, -0.5f}, {99, -2.0f}}, {{98, -1.25f}, {98, -1.25f}}};
  out.finished = true;
  out.finish_reason = FinishReason{"stop", std::nullopt, std::string("\n"), ""};
  out.prompt_tokens = 5;
  out.completion_tokens = 2;
  out.weight_version = "7";
  return out;
}

openai_reply_context context_without_tokenizer() { return {"cmpl-r1", 1700000000, "m", nullptr}; }

} // namespace

BOOST_AUTO_TEST_SUITE(openai_test)

BOOST_AUTO_TEST_CASE(errors_are_openai_shaped_and_name_the_param) {
  auto j = ojson::parse(openai_error_body("messages[0].role: required field is missing"));
  BOOST_TEST(j.dump() == R"({"error":{"message":"messages[0].role: required field is missing",)"
                         R"("type":"invalid_request_error","param":"messages[0].role","code":null}})");
  BOOST_TEST(error_param("invalid JSON at byte 3: syntax error") == "");
  BOOST_TEST(error_param("no colon here") == "");
  BOOST_TEST(error_param("prompt: empty") == "prompt");
}

BOOST_AUTO_TEST_CASE(completion_response_whole) {
  auto cx = context_without_tokenizer();
  auto j = completion_response(cx, finished_output(), /*logprobs=*/true, "P");
  BOOST_TEST(j.dump() ==
             R"({"id":"cmpl-r1","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,)"
             R"("text":"Pab","logprobs":{"tokens":["token_id:97","token_id:98"],"token_logprobs":[-0.5,-1.25],)"
             R"("top_logprobs":[{"token_id:97":-0.5,"token_id:99":-2.0},{"token_id:98":-1.25}],)"
             R"("text_offset":[1,12]},"finish_reason":"stop","matched_stop":"\n"}],)"
             R"("usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}},)"
             R"("weight_version":"7"})");
}

BOOST_AUTO_TEST_CASE(chat_response_and_token_texts_from_the_tokenizer) {
  auto text = model::tiny_tokenizer_json(1024);
  BOOST_REQUIRE_MESSAGE(text, text.error());
  auto tok = model::bpe_tokenizer::from_json(nlohmann::json::parse(*text));
  BOOST_REQUIRE_MESSAGE(tok, tok.error());
  openai_reply_context cx{"chatcmpl-r1", 1, "m", &*tok};
  auto j = chat_response(cx, finished_output(), true);
  BOOST_TEST(j["object"] == "chat.completion");
  BOOST_TEST(j["choices"][0]["message"].dump() == R"({"role":"assistant","content":"ab","tool_calls":null})");
  auto content = j["choices"][0]["logprobs"]["content"];
  BOOST_TEST(content.dump() ==
             R"([{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[{"token":"a","logprob":-0.5,"bytes":[97]},)"
             R"({"token":"c","logprob":-2.0,"bytes":[99]}]},{"token":"b","logprob":-1.25,"bytes":[98],)"
             R"("top_logprobs":[{"token":"b","logprob":-1.25,"bytes":[98]},{"token":"b","logprob":-1.25,"bytes":[98]}]}])");
  BOOST_TEST(j["usage"]["total_tokens"] == 7);
}

BOOST_AUTO_TEST_CASE(stream_chunks) {
  auto cx = context_without_tokenizer();
  GenerateReqOutput first;
  first.text = "a";
  first.output_ids = {97};
  first.output_token_logprobs = {-0.5f};
  int64_t offset = 0;
  auto c1 = completion_chunk(cx, first, true, "P", offset, /*include_usage=*/true);
  BOOST_TEST(c1["choices"][0]["text"] == "Pa");
  BOOST_TEST(c1["choices"][0]["finish_reason"].is_null());
  BOOST_TEST(c1["choices"][0]["logprobs"]["text_offset"].dump() == "[1]");
  BOOST_TEST(c1["usage"].is_null());
  BOOST_TEST(offset == 1 + 11); // "P" then "token_id:97"
  auto last = finished_output();
  auto c2 = completion_chunk(cx, last, false, "", offset, false);
  BOOST_TEST(c2["choices"][0]["finish_reason"] == "stop");
  BOOST_TEST(!c2.contains("usage"));

  BOOST_TEST(chat_role_chunk(cx, false)["choices"][0]["delta"].dump() == R"({"role":"assistant","content":""})");
  BOOST_TEST(chat_content_chunk(cx, first, false, false)["choices"][0]["delta"].dump() == R"({"content":"a"})");
  auto fin = chat_finish_chunk(cx, last, false);
  BOOST_TEST(fin["object"] == "chat.completion.chunk");
  BOOST_TEST(fin["choices"][0]["delta"].dump() == "{}");
  BOOST_TEST(fin["choices"][0]["finish_reason"] == "stop");
  auto u = usage_chunk(cx, "chat.completion.chunk", 5, 2, 4);
  BOOST_TEST(u["choices"].dump() == "[]");
  BOOST_TEST(u["usage"]["total_tokens"] == 7);
  BOOST_TEST(u["usage"]["prompt_tokens_details"]["cached_tokens"] == 4);
  BOOST_TEST(models_list("/models/q", 3).dump() ==
             R"({"object":"list","data":[{"id":"/models/q","object":"model","created":3,"owned_by":"rlserve","root":"/models/q"}]})");
}

BOOST_AUTO_TEST_CASE(v1_routes) {
  auto get = [](std::string_view target) { return route_http_request(http::verb::get, target, ""); };
  auto post = [](std::string_view target) { return route_http_request(http::verb::post, target, "{}"); };
  auto kind = [](const std::variant<http_routed, http_refusal>& r) {
    BOOST_REQUIRE(std::holds_alternative<http_routed>(r));
    BOOST_TEST((std::get<http_routed>(r).level == route_auth::normal));
    return std::get<http_routed>(r).call.kind;
  };
  BOOST_TEST(kind(get("/v1/models")) == http_call::openai_models);
  BOOST_TEST(kind(get("/v1/models/")) == http_call::openai_models);
  BOOST_TEST(kind(post("/v1/completions")) == http_call::openai_completions);
  BOOST_TEST(kind(post("/v1/chat/completions")) == http_call::openai_chat);
  auto refused = [](const std::variant<http_routed, http_refusal>& r) {
    BOOST_REQUIRE(std::holds_alternative<http_refusal>(r));
    return std::get<http_refusal>(r).status;
  };
  BOOST_TEST(refused(get("/v1/completions")) == 405u);
  BOOST_TEST(refused(post("/v1/models")) == 405u);
  BOOST_TEST(refused(post("/v1/embeddings")) == 404u);
  BOOST_TEST(refused(route_http_request(http::verb::post, "/v1/completions", "x", /*body_is_json=*/false)) == 415u);
}

// SGLang's sglext ids (serving_chat.py): only the fields asked for, none at all → null; n
// choices → n output lists; the streamed form is a chunk with no choices.
BOOST_AUTO_TEST_CASE(sglext_ids_shapes) {
  const std::vector<int32_t> prompt{1, 2, 3};
  const std::vector<std::vector<int32_t>> outputs{{97, 98}, {99}};
  BOOST_TEST(sglext_ids(nullptr, nullptr).is_null());
  BOOST_TEST(sglext_ids(&prompt, nullptr).dump() == R"({"input_ids":[1,2,3]})");
  BOOST_TEST(sglext_ids(nullptr, &outputs).dump() == R"({"output_ids":[[97,98],[99]]})");
  BOOST_TEST(sglext_ids(&prompt, &outputs).dump() == R"({"input_ids":[1,2,3],"output_ids":[[97,98],[99]]})");
  const std::vector<std::vector<int32_t>> nothing_generated{{}};
  BOOST_TEST(sglext_ids(nullptr, &nothing_generated).dump() == R"({"output_ids":[[]]})");
  openai_reply_context cx{"chatcmpl-r1", 1700000000, "m", nullptr};
  BOOST_TEST(sglext_chunk(cx, sglext_ids(&prompt, nullptr), false).dump() ==
             R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1700000000,"model":"m",)"
             R"("choices":[],"sglext":{"input_ids":[1,2,3]}})");
  BOOST_TEST(sglext_chunk(cx, sglext_ids(nullptr, &outputs), true)["usage"].is_null());
  BOOST_TEST(sglext_chunk(cx, sglext_ids(nullptr, &outputs), true).contains("usage"));
}

BOOST_AUTO_TEST_SUITE_END()
