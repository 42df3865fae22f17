// OpenAI's requests mapped onto GenerateReqInput (messages/openai.hpp): which field goes where,
// the defaults OpenAI gives, the batch forms and unimplemented fields refused naming the field,
// and unknown fields ignored and counted.
#include <boost/test/unit_test.hpp>

#include "messages/json_codec.hpp"
#include "messages/openai.hpp"

using namespace rlserve;

namespace {

std::string completion_error(std::string_view body) {
  auto r = parse_openai_completion_request(body);
  BOOST_REQUIRE_MESSAGE(!r, "accepted " << body);
  return r.error();
}

std::string chat_error(std::string_view body) {
  auto r = parse_openai_chat_request(body);
  BOOST_REQUIRE_MESSAGE(!r, "accepted " << body);
  return r.error();
}

bool starts(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

} // namespace

BOOST_AUTO_TEST_SUITE(openai_test)

BOOST_AUTO_TEST_CASE(completion_fields_map_onto_generate) {
  auto r = parse_openai_completion_request(
    R"({"model": "m", "prompt": "Hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "n": 1,
        "stop": "\n", "seed": 42, "logprobs": 2, "frequency_penalty": 0.5, "presence_penalty": -0.5,
        "stream": true, "stream_options": {"include_usage": true}, "top_k": 5, "min_p": 0.1,
        "repetition_penalty": 1.1, "min_tokens": 1, "stop_token_ids": [3], "ignore_eos": true,
        "user": "u1"})");
  BOOST_REQUIRE_MESSAGE(r, r.error());
  const auto& g = r->generate;
  const auto& s = g.sampling_params;
  BOOST_TEST(r->model == "m");
  BOOST_TEST(*g.text == "Hi");
  BOOST_TEST(!g.input_ids);
  BOOST_TEST(s.max_new_tokens == 7);
  BOOST_TEST(s.temperature == 0.5f);
  BOOST_TEST(s.top_p == 0.9f);
  BOOST_TEST(s.stop == std::vector<std::string>{"\n"});
  BOOST_TEST(*s.sampling_seed == 42u);
  BOOST_TEST(s.frequency_penalty == 0.5f);
  BOOST_TEST(s.presence_penalty == -0.5f);
  BOOST_TEST(s.top_k == 5);
  BOOST_TEST(s.min_p == 0.1f);
  BOOST_TEST(s.repetition_penalty == 1.1f);
  BOOST_TEST(s.min_new_tokens == 1);
  BOOST_TEST(s.stop_token_ids == std::vector<int32_t>{3});
  BOOST_TEST(s.ignore_eos);
  BOOST_TEST(g.return_logprob);
  BOOST_TEST(g.top_logprobs_num == 2);
  BOOST_TEST(g.logprob_start_len == -1);
  BOOST_TEST(g.stream);
  BOOST_TEST(r->include_usage);
  BOOST_TEST(*r->logprobs == 2);
}

BOOST_AUTO_TEST_CASE(completion_defaults_and_prompt_forms) {
  auto r = parse_openai_completion_request(R"({"prompt": [1, 2, 3]})");
  BOOST_REQUIRE_MESSAGE(r, r.error());
  BOOST_TEST(r->generate.sampling_params.max_new_tokens == 16); // OpenAI's default
  BOOST_TEST(*r->generate.input_ids == (std::vector<int32_t>{1, 2, 3}));
  BOOST_TEST(!r->generate.return_logprob);
  BOOST_TEST(!r->logprobs);
  BOOST_TEST(r->generate.sampling_params.n == 1);
  auto one = parse_openai_completion_request(R"({"prompt": ["text"]})");
  BOOST_REQUIRE(one);
  BOOST_TEST(*one->generate.text == "text");
  auto ids = parse_openai_completion_request(R"({"prompt": [[4, 5]], "logprobs": 0})");
  BOOST_REQUIRE(ids);
  BOOST_TEST(*ids->generate.input_ids == (std::vector<int32_t>{4, 5}));
  BOOST_TEST(ids->generate.return_logprob); // logprobs: 0 is the sampled token's only
  BOOST_TEST(ids->generate.top_logprobs_num == 0);
  // n goes to the engine, which answers for it.
  auto n = parse_openai_completion_request(R"({"prompt": "x", "n": 3})");
  BOOST_REQUIRE(n);
  BOOST_TEST(n->generate.sampling_params.n == 3);
}

BOOST_AUTO_TEST_CASE(completion_refusals_name_the_field) {
  BOOST_TEST(starts(completion_error(R"({})"), "prompt: required field is missing"));
  BOOST_TEST(starts(completion_error(R"({"prompt": ""})"), "prompt: "));
  BOOST_TEST(starts(completion_error(R"({"prompt": ["a", "b"]})"), "prompt: a list of 2 prompts is a batch"));
  BOOST_TEST(starts(completion_error(R"({"prompt": [[1], [2]]})"), "prompt: a list of 2 prompts is a batch"));
  BOOST_TEST(starts(completion_error(R"({"prompt": [-1]})"), "prompt[0]: "));
  BOOST_TEST(starts(completion_error(R"({"prompt": {"a": 1}})"), "prompt: expected a string or a list of token ids"));
  BOOST_TEST(starts(completion_error(R"({"prompt": "x", "temperature": 3})"), "temperature: "));
  BOOST_TEST(starts(completion_error(R"({"prompt": "x", "logprobs": 21})"), "logprobs: "));
  BOOST_TEST(starts(completion_error(R"({"prompt": "x", "seed": -1})"), "seed: "));
  BOOST_TEST(starts(completion_error(R"({"prompt": "x", "logit_bias": {"1": 5}})"), "logit_bias: not supported"));
  BOOST_TEST(starts(completion_error(R"({"prompt": "x", "best_of": 2})"), "best_of: not supported"));
  BOOST_TEST(starts(completion_error(R"({"prompt": "x", "echo": true, "logprobs": 1})"), "echo: "));
  BOOST_TEST(starts(completion_error(R"({"prompt": "x", "stream_options": {"bogus": 1}})"),
                    "stream_options.bogus: unknown field"));
  BOOST_TEST(starts(completion_error(R"([1])"), "the request body must be a JSON object"));
  // Inert values of unimplemented fields pass; unknown top-level fields are ignored and counted.
  auto before = ignored_request_fields();
  auto ok = parse_openai_completion_request(R"({"prompt": "x", "logit_bias": {}, "best_of": 1, "brand_new": 1})");
  BOOST_REQUIRE_MESSAGE(ok, ok.error());
  BOOST_TEST(ignored_request_fields() == before + 1);
}

BOOST_AUTO_TEST_CASE(chat_fields_and_messages) {
  auto r = parse_openai_chat_request(
    R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                      "zeta": 1, "alpha": 2},
                     {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f"}}]}],
        "max_completion_tokens": 9, "max_tokens": 3, "logprobs": true, "top_logprobs": 4,
        "chat_template_kwargs": {"enable_thinking": false}, "tool_choice": "none"})");
  BOOST_REQUIRE_MESSAGE(r, r.error());
  BOOST_TEST(r->generate.sampling_params.max_new_tokens == 9); // max_completion_tokens wins
  BOOST_TEST(r->max_tokens_set);
  BOOST_TEST(r->generate.return_logprob);
  BOOST_TEST(r->generate.top_logprobs_num == 4);
  BOOST_TEST(!r->generate.text); // rendered later, by the front
  BOOST_TEST(r->messages[0]["content"] == "a\nb");
  BOOST_TEST(r->messages[0].dump() == R"({"role":"user","content":"a\nb","zeta":1,"alpha":2})"); // order kept
  BOOST_TEST(r->messages[1]["tool_calls"][0]["function"]["name"] == "f");
  BOOST_TEST(r->chat_template_kwargs["enable_thinking"] == false);
  auto bare = parse_openai_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})");
  BOOST_REQUIRE(bare);
  BOOST_TEST(!bare->max_tokens_set);
  BOOST_TEST(bare->chat_template_kwargs.is_object());
}

BOOST_AUTO_TEST_CASE(chat_refusals_name_the_field) {
  BOOST_TEST(starts(chat_error(R"({})"), "messages: required field is missing"));
  BOOST_TEST(starts(chat_error(R"({"messages": []})"), "messages: empty"));
  BOOST_TEST(starts(chat_error(R"({"messages": "hi"})"), "messages: expected a list"));
  BOOST_TEST(starts(chat_error(R"({"messages": [5]})"), "messages[0]: expected a message object"));
  BOOST_TEST(starts(chat_error(R"({"messages": [{"content": "x"}]})"), "messages[0].role: required"));
  BOOST_TEST(starts(chat_error(R"({"messages": [{"role": 1}]})"), "messages[0].role: expected a non-empty string"));
  BOOST_TEST(starts(chat_error(R"({"messages": [{"role": "user", "content": 3}]})"), "messages[0].content: expected"));
  BOOST_TEST(starts(chat_error(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
                    "messages[0].content[0].type: \"image_url\" parts are not supported"));
  const auto hi = std::string(R"("messages": [{"role": "user", "content": "x"}])");
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "tool_choice": "required"})"), "tool_choice: \"required\" is not supported"));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "top_logprobs": 1})"), "top_logprobs: needs logprobs"));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "top_logprobs": 21, "logprobs": true})"), "top_logprobs: "));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "chat_template_kwargs": 1})"), "chat_template_kwargs: expected an object"));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "response_format": {"type": "json_object"}})"), "response_format: "));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "continue_final_message": true})"), "continue_final_message: "));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "max_tokens": "many"})"), "max_tokens: "));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "custom_params": {"return_top_p_token_ids": true}})"),
                    "custom_params.return_top_p_token_ids: not supported"));
  // SGLang's extensions for token-tracking clients: not with streaming, and routing rows only
  // inside meta_info.
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "input_ids": []})"), "input_ids: "));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "input_ids": [1, -2]})"), "input_ids[1]: "));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "return_meta_info": true, "stream": true})"),
                    "return_meta_info: not supported with stream: true"));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "return_token_ids": true, "stream": true})"),
                    "return_token_ids: not supported with stream: true"));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "return_routed_experts": true})"),
                    "return_routed_experts: needs return_meta_info: true"));
  BOOST_TEST(starts(chat_error("{" + hi + R"(, "return_indexer_topk": true})"), "return_indexer_topk: not supported"));
  BOOST_TEST(starts(completion_error(R"({"prompt": "x", "return_routed_experts": true})"),
                    "return_routed_experts: not supported"));
}

// tools: each {type: "function", function: {name, description?, parameters?, strict?}}, every
// fault named by its path; tool_choice auto / none, required and named refused (no constrained
// decoding).
BOOST_AUTO_TEST_CASE(chat_tools_are_checked) {
  const auto hi = std::string(R"({"messages": [{"role": "user", "content": "x"}], )");
  auto r = parse_openai_chat_request(hi + R"("tools": [{"type": "function", "function": {"name": "f",
      "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "g"}}], "tool_choice": "auto", "separate_reasoning": false})");
  BOOST_REQUIRE_MESSAGE(r, r.error());
  BOOST_TEST(r->tools.size() == 2u);
  BOOST_TEST(r->tools[0]["function"]["name"] == "f");
  BOOST_TEST(!r->tool_choice_none);
  BOOST_TEST(!r->separate_reasoning);
  r = parse_openai_chat_request(hi + R"("tools": [], "tool_choice": "none"})");
  BOOST_REQUIRE_MESSAGE(r, r.error());
  BOOST_TEST(r->tool_choice_none);
  auto tool = [&](std::string t) { return chat_error(hi + R"("tools": [{"type": "function", "function": {"name": "ok"}}, )" + t + "]}"); };
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {"name": ""}})"), "tools[1].function.name: expected a non-empty string"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {"name": 3}})"), "tools[1].function.name: expected a non-empty string"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {}})"), "tools[1].function.name: required field is missing"));
  BOOST_TEST(starts(tool(R"({"type": "function"})"), "tools[1].function: required field is missing"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": []})"), "tools[1].function: expected an object"));
  BOOST_TEST(starts(tool(R"({"type": "retrieval", "function": {"name": "x"}})"), "tools[1].type: expected \"function\""));
  BOOST_TEST(starts(tool(R"({"function": {"name": "x"}})"), "tools[1].type: required field is missing"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {"name": "x", "parameters": "{}"}})"),
                    "tools[1].function.parameters: expected a JSON schema object"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {"name": "x", "description": 1}})"),
                    "tools[1].function.description: expected a string"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {"name": "x", "strict": "yes"}})"),
                    "tools[1].function.strict: expected a boolean"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {"name": "x", "parametres": {}}})"),
                    "tools[1].function.parametres: unknown field"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {"name": "ok"}})"), "tools[1].function.name: \"ok\" is offered twice"));
  BOOST_TEST(starts(tool(R"({"type": "function", "function": {"name": "x"}, "extra": 1})"), "tools[1].extra: unknown field"));
  BOOST_TEST(starts(tool("7"), "tools[1]: expected a tool object"));
  BOOST_TEST(starts(chat_error(hi + R"("tools": {"type": "function"}})"), "tools: expected a list"));
  BOOST_TEST(starts(chat_error(hi + R"("tool_choice": {"type": "function", "function": {"name": "f"}}})"),
                    "tool_choice: a named function is not supported"));
  BOOST_TEST(starts(chat_error(hi + R"("tool_choice": 3})"), "tool_choice: expected \"auto\" or \"none\""));
  BOOST_TEST(starts(chat_error(hi + R"("functions": [{"name": "f"}]})"), "functions: "));
  BOOST_TEST(starts(chat_error(hi + R"("function_call": "auto"})"), "function_call: "));
  BOOST_TEST(starts(chat_error(hi + R"("separate_reasoning": 1})"), "separate_reasoning: "));
}

// miles' session server (miles/rollout/session/core.py, prepare_chat_request, at commit
// 31f1ca961a94cb860cec3b2dea34ec332bfa8f76): the prompt as input_ids, the engine's results in
// each choice's meta_info.
BOOST_AUTO_TEST_CASE(chat_with_input_ids_and_meta_info) {
  auto r = parse_openai_chat_request(
    R"({"messages": [{"role": "user", "content": "x"}], "input_ids": [7, 8, 9], "logprobs": true,
        "return_meta_info": true, "no_stop_trim": false, "return_routed_experts": true,
        "routed_experts_start_len": 2, "return_token_ids": true, "return_prompt_token_ids": true})");
  BOOST_REQUIRE_MESSAGE(r, r.error());
  BOOST_TEST(*r->generate.input_ids == (std::vector<int32_t>{7, 8, 9}));
  BOOST_TEST(!r->generate.text);
  BOOST_TEST(r->return_meta_info);
  BOOST_TEST(r->return_token_ids);
  BOOST_TEST(r->return_prompt_token_ids);
  BOOST_TEST(r->generate.return_routed_experts);
  BOOST_TEST(r->generate.routed_experts_start_len == 2);
  BOOST_TEST(r->generate.return_logprob);
  auto bare = parse_openai_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})");
  BOOST_REQUIRE(bare);
  BOOST_TEST(!bare->generate.input_ids);
  BOOST_TEST(!bare->return_meta_info);
}

// SGLang's sglext ids (serving_chat.py): streamable, booleans only, refused naming the field.
BOOST_AUTO_TEST_CASE(chat_sglext_id_flags) {
  const std::string hi = R"("messages": [{"role": "user", "content": "x"}])";
  auto r = parse_openai_chat_request("{" + hi + R"(, "stream": true, "return_input_ids_in_sglext": true,
                                          "return_output_ids_in_sglext": true})");
  BOOST_REQUIRE_MESSAGE(r, r.error());
  BOOST_TEST(r->return_input_ids_in_sglext);
  BOOST_TEST(r->return_output_ids_in_sglext);
  auto bare = parse_openai_chat_request("{" + hi + "}");
  BOOST_REQUIRE(bare);
  BOOST_TEST(!bare->return_input_ids_in_sglext);
  BOOST_TEST(!bare->return_output_ids_in_sglext);
  for (const char* key : {"return_input_ids_in_sglext", "return_output_ids_in_sglext"})
    for (const char* bad : {"1", "\"yes\"", "[true]"}) {
      auto e = parse_openai_chat_request("{" + hi + ", \"" + key + "\": " + bad + "}");
      BOOST_REQUIRE(!e);
      BOOST_TEST(e.error().rfind(std::string(key) + ": ", 0) == 0, e.error());
    }
  // The per-choice ids still refuse streaming, pointing at the sglext flags.
  auto streamed = parse_openai_chat_request("{" + hi + R"(, "stream": true, "return_token_ids": true})");
  BOOST_REQUIRE(!streamed);
  BOOST_TEST(streamed.error().find("return_output_ids_in_sglext") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
