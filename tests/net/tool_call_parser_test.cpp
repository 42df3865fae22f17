// Tool calls and reasoning out of recorded model outputs (net/tool_call_parser.hpp,
// net/reasoning_parser.hpp, net/chat_output.hpp): the formats of Qwen2.5/Qwen3 (qwen25),
// Qwen3-Coder (qwen3_coder) and GLM-4.5 (glm45) as SGLang's detectors read them, malformed
// blocks kept as text, and the streamed form fed at every byte boundary against the whole parse.
#include <boost/test/unit_test.hpp>

#include "net/chat_output.hpp"
#include "net/openai.hpp"

using namespace rlserve::net;
using ojson = nlohmann::ordered_json;

namespace {

tool_set weather_tools() {
  tool_set t;
  t.functions.emplace_back("get_weather", ojson::parse(R"({"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "hours": {"type": "array"}, "zip": {"type": "string"}, "ratio": {"type": "number"}}})"));
  t.functions.emplace_back("get_time", nullptr);
  return t;
}

chat_delta whole(const chat_parsing& p, std::string_view text) { return parse_chat_output(p, text); }

// The text fed in pieces of `step` bytes (1: every byte boundary), deltas concatenated.
chat_delta pieces(const chat_parsing& p, std::string_view text, std::size_t step) {
  chat_output_stream s(p);
  chat_delta all;
  auto add = [&](chat_delta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.calls)
      all.calls.push_back(std::move(c));
  };
  for (std::size_t i = 0; i < text.size(); i += step)
    add(s.feed(text.substr(i, step)));
  add(s.finish());
  return all;
}

void same(const chat_delta& a, const chat_delta& b, const std::string& what) {
  BOOST_TEST(a.reasoning == b.reasoning, what);
  BOOST_TEST(a.content == b.content, what);
  BOOST_TEST_REQUIRE(a.calls.size() == b.calls.size(), what);
  for (std::size_t i = 0; i < a.calls.size(); ++i) {
    BOOST_TEST(a.calls[i].name == b.calls[i].name, what);
    BOOST_TEST(a.calls[i].arguments == b.calls[i].arguments, what);
  }
}

// Every split: bytes, and pieces of 2..13 bytes (token-like), all equal the whole parse.
chat_delta checked(const chat_parsing& p, std::string_view text) {
  auto w = whole(p, text);
  for (std::size_t step = 1; step <= 13; ++step)
    same(pieces(p, text, step), w, "step " + std::to_string(step) + " of " + std::string(text));
  return w;
}

chat_parsing tools_only(tool_call_format f) {
  chat_parsing p;
  p.tool_format = f;
  p.tools = weather_tools();
  return p;
}

chat_parsing reasoning_and_tools(tool_call_format f, bool forced = false) {
  auto p = tools_only(f);
  p.reasoning = true;
  p.starts_in_reasoning = forced;
  return p;
}

} // namespace

BOOST_AUTO_TEST_SUITE(tool_call_parser_test)

BOOST_AUTO_TEST_CASE(names_are_sglangs) {
  BOOST_TEST((find_tool_call_format("qwen25") == tool_call_format::qwen25));
  BOOST_TEST((find_tool_call_format("qwen") == tool_call_format::qwen25));
  BOOST_TEST((find_tool_call_format("qwen3_coder") == tool_call_format::qwen3_coder));
  BOOST_TEST((find_tool_call_format("glm45") == tool_call_format::glm45));
  BOOST_TEST(!find_tool_call_format("hermes"));
  BOOST_TEST(!find_tool_call_format(""));
  BOOST_TEST(find_reasoning_format("qwen3")->forced == false);
  BOOST_TEST(find_reasoning_format("qwen3")->gated_by_enable_thinking);
  BOOST_TEST(find_reasoning_format("deepseek-r1")->forced);
  BOOST_TEST(find_reasoning_format("qwen3-thinking")->forced);
  BOOST_TEST(find_reasoning_format("glm45").has_value());
  BOOST_TEST(!find_reasoning_format("kimi"));
}

// Qwen3 (thinking on) calling two tools: recorded shape of Qwen3-8B with the Qwen chat template.
BOOST_AUTO_TEST_CASE(qwen3_thinking_then_two_calls) {
  const std::string out =
    "<think>\nThe user wants the weather in Paris and the time. I should call both tools.\n</think>\n\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>";
  auto d = checked(reasoning_and_tools(tool_call_format::qwen25), out);
  BOOST_TEST(d.reasoning == "The user wants the weather in Paris and the time. I should call both tools.");
  BOOST_TEST(d.content == "");
  BOOST_TEST_REQUIRE(d.calls.size() == 2u);
  BOOST_TEST(d.calls[0].name == "get_weather");
  BOOST_TEST(d.calls[0].arguments == R"({"city": "Paris", "days": 3})"); // json.dumps' separators
  BOOST_TEST(d.calls[1].name == "get_time");
  BOOST_TEST(d.calls[1].arguments == R"({"tz": "Europe/Paris"})");
}

BOOST_AUTO_TEST_CASE(qwen25_text_before_between_and_after_calls) {
  const std::string out = "Let me check that for you.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                          "{\"city\": \"北京\"}}\n</tool_call>\nThen I will answer.";
  auto d = checked(tools_only(tool_call_format::qwen25), out);
  BOOST_TEST(d.content == "Let me check that for you.Then I will answer.");
  BOOST_TEST_REQUIRE(d.calls.size() == 1u);
  BOOST_TEST(d.calls[0].arguments == "{\"city\": \"北京\"}"); // ensure_ascii=False
  // "parameters" is taken for "arguments", no arguments is {}.
  d = checked(tools_only(tool_call_format::qwen25),
              "<tool_call>{\"name\": \"get_time\", \"parameters\": {\"a\": [1, {\"b\": null}]}}</tool_call>");
  BOOST_TEST(d.calls.at(0).arguments == R"({"a": [1, {"b": null}]})");
  d = checked(tools_only(tool_call_format::qwen25), "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>");
  BOOST_TEST(d.calls.at(0).arguments == "{}");
}

BOOST_AUTO_TEST_CASE(plain_answers_are_untouched) {
  for (auto text : {"", "Hello!", "  spaced  \n", "a < b and <tool_ is not a tag", "ends with <tool_call",
                    "<tool_callx> not a tag </tool_call>"}) {
    auto d = checked(tools_only(tool_call_format::qwen25), text);
    BOOST_TEST(d.calls.empty());
    BOOST_TEST(d.content == text); // a partial tag held back at the end comes out at finish
  }
}

BOOST_AUTO_TEST_CASE(malformed_calls_come_back_as_text) {
  auto p = tools_only(tool_call_format::qwen25);
  // Bad JSON.
  std::string bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
  auto d = checked(p, "I will call. " + bad);
  BOOST_TEST(d.calls.empty());
  BOOST_TEST(d.content == "I will call. " + bad);
  // A function the request did not offer.
  std::string unknown = "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>";
  d = checked(p, unknown);
  BOOST_TEST(d.calls.empty());
  BOOST_TEST(d.content == unknown);
  // Never closed (cut by max_tokens).
  std::string open = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa";
  d = checked(p, open);
  BOOST_TEST(d.calls.empty());
  BOOST_TEST(d.content == open);
  // Arguments that are not an object, a name that is not a string, JSON that is not an object.
  for (auto inner : {R"({"name": "get_time", "arguments": "x"})", R"({"name": 3})", R"([1, 2])", "",
                     R"({"name": "get_time", "arguments": {}} trailing)"}) {
    std::string text = std::string("<tool_call>") + inner + "</tool_call>";
    d = checked(p, text);
    BOOST_TEST(d.calls.empty(), inner);
    BOOST_TEST(d.content == text);
  }
  // One good call after a bad one: the bad one is text, the good one a call.
  d = checked(p, bad + "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  BOOST_TEST(d.calls.size() == 1u);
  BOOST_TEST(d.content == bad);
  // Nesting deeper than a call may be is text (no deep recursion on a model's loop).
  std::string deep = "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": " + std::string(5000, '[') +
                     std::string(5000, ']') + "}}</tool_call>";
  d = whole(p, deep);
  BOOST_TEST(d.calls.empty());
  BOOST_TEST(d.content == deep);
}

// Qwen3-Coder's XML form; values converted by the declared types, as SGLang does.
BOOST_AUTO_TEST_CASE(qwen3_coder_calls) {
  const std::string out =
    "I'll look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
    "<parameter=days>\n5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=hours>\n[9, 12]\n"
    "</parameter>\n<parameter=zip>\n94103\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
    "<parameter=extra>\nnull\n</parameter>\n</function>\n</tool_call>";
  auto d = checked(tools_only(tool_call_format::qwen3_coder), out);
  BOOST_TEST(d.content == "I'll look it up.");
  BOOST_TEST_REQUIRE(d.calls.size() == 1u);
  BOOST_TEST(d.calls[0].name == "get_weather");
  BOOST_TEST(d.calls[0].arguments == R"({"city": "San Francisco", "days": 5, "metric": true, "hours": [9, 12], )"
                                     R"("zip": "94103", "ratio": 0.5, "extra": null})");
  // A multi-line value keeps its inner newlines; an undeclared parameter is a string.
  d = checked(tools_only(tool_call_format::qwen3_coder),
              "<tool_call>\n<function=get_time>\n<parameter=code>\nline 1\nline 2\n</parameter>\n</function>\n"
              "</tool_call>");
  BOOST_TEST(d.calls.at(0).arguments == R"({"code": "line 1\nline 2"})");
  // A value that does not convert stays text.
  d = checked(tools_only(tool_call_format::qwen3_coder),
              "<tool_call><function=get_weather><parameter=days>many</parameter></function></tool_call>");
  BOOST_TEST(d.calls.at(0).arguments == R"({"days": "many"})");
  // Malformed: no </function>, unknown function, stray text inside.
  for (auto text : {"<tool_call><function=get_weather><parameter=city>x</parameter></tool_call>",
                    "<tool_call><function=nope></function></tool_call>",
                    "<tool_call><function=get_time>junk</function></tool_call>",
                    "<tool_call>{\"name\": \"get_time\"}</tool_call>"}) {
    d = checked(tools_only(tool_call_format::qwen3_coder), text);
    BOOST_TEST(d.calls.empty(), text);
    BOOST_TEST(d.content == text);
  }
}

// GLM-4.5's form: the name on the first line, then key/value pairs.
BOOST_AUTO_TEST_CASE(glm45_calls) {
  const std::string out = "<think>Need weather.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                          "<arg_value>北京</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n"
                          "<arg_key>zip</arg_key>\n<arg_value>100000</arg_value>\n</tool_call>"
                          "<tool_call>get_time\n</tool_call>";
  auto d = checked(reasoning_and_tools(tool_call_format::glm45), out);
  BOOST_TEST(d.reasoning == "Need weather.");
  BOOST_TEST(d.content == "");
  BOOST_TEST_REQUIRE(d.calls.size() == 2u);
  BOOST_TEST(d.calls[0].arguments == R"({"city": "北京", "days": 2, "zip": "100000"})");
  BOOST_TEST(d.calls[1].name == "get_time");
  BOOST_TEST(d.calls[1].arguments == "{}");
  for (auto text : {"<tool_call>get_weather\n<arg_key>city</arg_key></tool_call>",
                    "<tool_call>get_weather\n<arg_value>x</arg_value></tool_call>",
                    "<tool_call>unknown_fn\n</tool_call>", "<tool_call>\n</tool_call>"}) {
    d = checked(tools_only(tool_call_format::glm45), text);
    BOOST_TEST(d.calls.empty(), text);
    BOOST_TEST(d.content == text);
  }
}

BOOST_AUTO_TEST_CASE(reasoning_rules) {
  chat_parsing p;
  p.reasoning = true;
  // Not forced: thinking only when the output opens with <think>.
  auto d = checked(p, "<think>\nstep 1\nstep 2\n</think>\n\nThe answer is 42.");
  BOOST_TEST(d.reasoning == "step 1\nstep 2");
  BOOST_TEST(d.content == "The answer is 42.");
  d = checked(p, "The answer is 42. <think>not thinking</think>");
  BOOST_TEST(d.reasoning == "");
  BOOST_TEST(d.content == "The answer is 42. <think>not thinking</think>");
  d = checked(p, "\n\n  <think>x</think>y");
  BOOST_TEST(d.reasoning == "x");
  BOOST_TEST(d.content == "y");
  // Cut inside thinking: all reasoning.
  d = checked(p, "<think>\nhmm, let me think about </thi");
  BOOST_TEST(d.reasoning == "hmm, let me think about </thi");
  BOOST_TEST(d.content == "");
  // Qwen3 with enable_thinking false writes no tags: all content.
  d = checked(p, "Hi there");
  BOOST_TEST(d.content == "Hi there");
  // Forced (deepseek-r1, or a prompt ending with <think>): up to </think> is reasoning, with
  // or without an opening tag.
  p.starts_in_reasoning = true;
  d = checked(p, "I think so.\n</think>\n\nYes.");
  BOOST_TEST(d.reasoning == "I think so.");
  BOOST_TEST(d.content == "Yes.");
  d = checked(p, "<think>I think so.</think>Yes.");
  BOOST_TEST(d.reasoning == "I think so.");
  BOOST_TEST(d.content == "Yes.");
  d = checked(p, "no end tag");
  BOOST_TEST(d.reasoning == "no end tag");
  BOOST_TEST(d.content == "");
  d = checked(p, "");
  BOOST_TEST(d.empty());
  BOOST_TEST(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  BOOST_TEST(!prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

BOOST_AUTO_TEST_CASE(a_call_inside_thinking_is_thinking) {
  const std::string out = "<think>maybe <tool_call>\n{\"name\": \"get_time\"}\n</tool_call></think>Done.";
  auto d = checked(reasoning_and_tools(tool_call_format::qwen25), out);
  BOOST_TEST(d.calls.empty());
  BOOST_TEST(d.reasoning == "maybe <tool_call>\n{\"name\": \"get_time\"}\n</tool_call>");
  BOOST_TEST(d.content == "Done.");
}

BOOST_AUTO_TEST_CASE(python_json_dumps_matches_json_dumps) {
  BOOST_TEST(python_json_dumps(ojson::parse(R"({"a":[1,2.5,true,null,"x\"y\n"],"b":{}})")) ==
             R"({"a": [1, 2.5, true, null, "x\"y\n"], "b": {}})");
  BOOST_TEST(python_json_dumps(ojson::array()) == "[]");
  BOOST_TEST(partial_marker_suffix("abc<tool", "<tool_call>") == 5u);
  BOOST_TEST(partial_marker_suffix("abc", "<tool_call>") == 0u);
  BOOST_TEST(partial_marker_suffix("<tool_call>", "<tool_call>") == 0u); // whole, not partial
}

// The reply shapes: message.tool_calls, reasoning_content, null content, finish_reason.
BOOST_AUTO_TEST_CASE(reply_shapes) {
  using namespace rlserve;
  using namespace rlserve::net::detail;
  GenerateReqOutput out;
  out.text = "ignored: parts are given";
  out.finished = true;
  out.finish_reason = FinishReason{"stop", 151645, std::nullopt, ""};
  openai_reply_context cx{"chatcmpl-r", 1, "m", nullptr};
  chat_message_parts parts{true, "why", "", {{"call_1", "get_time", "{}"}}};
  auto j = chat_response(cx, out, false, &parts);
  BOOST_TEST(j["choices"][0]["message"].dump() ==
             R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","index":0,"type":"function",)"
             R"("function":{"name":"get_time","arguments":"{}"}}],"reasoning_content":"why"})");
  BOOST_TEST(j["choices"][0]["finish_reason"] == "tool_calls");
  out.finish_reason = FinishReason{"length", std::nullopt, std::nullopt, ""};
  BOOST_TEST(chat_response(cx, out, false, &parts)["choices"][0]["finish_reason"] == "length");
  chat_message_parts text_only{false, "", "hi", {}};
  j = chat_response(cx, out, false, &text_only);
  BOOST_TEST(j["choices"][0]["message"].dump() == R"({"role":"assistant","content":"hi","tool_calls":null})");
  // Streamed: reasoning, content, then one chunk per call, with the running index.
  chat_delta d{"r", "c", {{"call_2", "get_time", "{}"}}};
  auto chunks = chat_delta_chunks(cx, d, 3, nullptr, false);
  BOOST_TEST_REQUIRE(chunks.size() == 3u);
  BOOST_TEST(chunks[0]["choices"][0]["delta"].dump() == R"({"reasoning_content":"r"})");
  BOOST_TEST(chunks[1]["choices"][0]["delta"].dump() == R"({"content":"c"})");
  BOOST_TEST(chunks[2]["choices"][0]["delta"]["tool_calls"][0]["index"] == 3);
  BOOST_TEST(chat_delta_chunks(cx, chat_delta{}, 0, nullptr, false).empty());
  BOOST_TEST(chat_delta_chunks(cx, chat_delta{}, 0, ojson{{"content", ojson::array()}}, false).size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
