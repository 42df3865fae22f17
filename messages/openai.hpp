// OpenAI's /v1/completions and /v1/chat/completions requests as rlserve takes them: read from
// the request body with the codecs' rules (messages/json_codec.hpp: unknown top-level keys
// ignored and counted, parts strict, fields rlserve does not implement refused naming the
// field) and mapped onto one GenerateReqInput. They are decoded and used by the HTTP front
// (net/openai_call_actor.cpp) and never travel between actors, so they have no CAF type ID.
// Which OpenAI fields map where, and which are refused, is in docs/protocol.md ('OpenAI-compatible
// routes').
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "messages/expected.hpp"
#include "messages/generate.hpp"

namespace rlserve {

struct OpenAICompletionRequest {
  std::string model;               // echoed in the reply; not checked (one model is served)
  GenerateReqInput generate;       // text or input_ids, sampling_params, logprobs, stream
  std::optional<int32_t> logprobs; // `logprobs`: alternatives per token (0..20); none: off
  bool echo = false;               // the prompt's text comes before the completion's
  bool include_usage = false;      // stream_options.include_usage: a last chunk with usage
};

struct OpenAIChatRequest {
  std::string model;
  nlohmann::ordered_json messages;             // as sent (key order kept), content parts joined
  nlohmann::ordered_json chat_template_kwargs; // an object (enable_thinking, ...)
  GenerateReqInput generate;                   // everything but the prompt, rendered later
  bool max_tokens_set = false;                 // max_tokens or max_completion_tokens was given
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool include_usage = false;
  // SGLang's extensions of the chat request, for RL clients that track tokens themselves
  // (miles' session server): `input_ids` (in `generate`) is the prompt as token ids, sent
  // instead of rendering `messages`; the reply's choices then carry the engine's results.
  bool return_meta_info = false;        // choices[i].meta_info: /generate's meta_info
  bool return_token_ids = false;        // choices[i].token_ids: the output token ids
  bool return_prompt_token_ids = false; // choices[i].prompt_token_ids: the prompt's token ids
  // SGLang's response-level `sglext` ids, streamed or not: sglext.input_ids (the prompt's token
  // ids, once) and sglext.output_ids (one list per choice); streamed, in one last chunk with no
  // choices, before the usage chunk (SGLang's serving_chat.py).
  bool return_input_ids_in_sglext = false;
  bool return_output_ids_in_sglext = false;
  // OpenAI's tools, checked ({type: "function", function: {name, description?, parameters?,
  // strict?}} each), as sent; null when none were sent. The template is given their `function`
  // objects (SGLang's choice) and the server's --tool-call-parser reads calls of them back.
  nlohmann::ordered_json tools;
  // tool_choice: "auto" (the default with tools) or "none" (the default without; the tools are
  // then neither rendered nor parsed). "required" and a named function need constrained
  // decoding, which rlserve does not have: refused.
  bool tool_choice_none = false;
  // SGLang's separate_reasoning (default true): with --reasoning-parser, the thinking goes to
  // message.reasoning_content; false leaves it in content.
  bool separate_reasoning = true;
};

// The body of POST /v1/completions. `max_input_ids` bounds a token-id prompt as
// parse_request_json does. Errors start with the path of the faulty field ("prompt: ...").
expected<OpenAICompletionRequest> parse_openai_completion_request(std::string_view body,
                                                                  std::size_t max_input_ids = SIZE_MAX);
// The body of POST /v1/chat/completions. `max_input_ids` bounds an `input_ids` prompt as
// parse_request_json does.
expected<OpenAIChatRequest> parse_openai_chat_request(std::string_view body,
                                                      std::size_t max_input_ids = SIZE_MAX);

} // namespace rlserve
