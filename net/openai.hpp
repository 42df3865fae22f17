// Private to net/: OpenAI's reply shapes as pure functions (no actors, no sockets), so the call
// actor (net/openai_call_actor.cpp) only sequences them and tests/net/openai_test.cpp checks
// them whole. docs/protocol.md ('OpenAI-compatible routes') describes what they write.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/generate.hpp"
#include "net/chat_output.hpp"

namespace rlserve::model {
class bpe_tokenizer;
}

namespace rlserve::net::detail {

using ojson = nlohmann::ordered_json;

// {"error": {"message", "type", "param", "code"}}. `param` is the field an error names: the
// codecs' messages start with its path ("messages[0].role: ..."), which becomes `param`.
std::string openai_error_body(std::string_view message, std::string_view type = "invalid_request_error");
// The path a codec's message starts with, or "" ("prompt: empty" -> "prompt").
std::string error_param(std::string_view message);

// What every reply of one request shares.
struct openai_reply_context {
  std::string id;      // "cmpl-<rid>" / "chatcmpl-<rid>"
  int64_t created = 0; // seconds since the epoch
  std::string model;
  // Token texts for logprobs; null (a model without tokenizer.json): "token_id:<id>".
  const model::bpe_tokenizer* tokenizer = nullptr;
};

// A token as logprobs show it: its bytes decoded (broken UTF-8 as U+FFFD), special tokens by
// their text.
std::string token_string(const openai_reply_context& cx, int32_t id);

// OpenAI's finish_reason: "stop", "length", "abort" (rlserve's aborts), or null (not finished).
ojson finish_reason(const GenerateReqOutput& out);
// SGLang's matched_stop: the stop token id or stop string that ended the request, or null.
ojson matched_stop(const GenerateReqOutput& out);
// OpenAI's usage, with prompt_tokens_details.cached_tokens: prompt tokens the prefix cache served.
ojson usage(int32_t prompt_tokens, int32_t completion_tokens, int32_t cached_tokens);

// Completion logprobs of the tokens of `out`: {tokens, token_logprobs, top_logprobs,
// text_offset}. text_offset[i] is `offset` plus the length in characters (code points) of
// tokens[0..i) joined; `offset` is advanced past them (streaming continues from it).
ojson completion_logprobs(const openai_reply_context& cx, const GenerateReqOutput& out, int64_t& offset);
// Chat logprobs of the tokens of `out`: {"content": [{token, logprob, bytes, top_logprobs}]}.
ojson chat_logprobs(const openai_reply_context& cx, const GenerateReqOutput& out);

// POST /v1/completions without streaming. `echo_text` (the prompt's text, for echo) comes
// before the completion's.
ojson completion_response(const openai_reply_context& cx, const GenerateReqOutput& out, bool logprobs,
                          std::string_view echo_text);
// One streamed chunk: the new text (after `prefix`, the echo on the first chunk), its logprobs,
// and the finish reason on the last. `include_usage`: a null usage field (OpenAI's shape).
ojson completion_chunk(const openai_reply_context& cx, const GenerateReqOutput& chunk, bool logprobs,
                       std::string_view prefix, int64_t& offset, bool include_usage);

// A chat message split by the server's parsers (net/chat_output.hpp): written as
// message.reasoning_content (when a reasoning parser ran: the text, or null when there was none),
// message.content (null when calls took the whole answer) and message.tool_calls.
struct chat_message_parts {
  bool reasoning_parsed = false;
  std::string reasoning;
  std::string content;
  std::vector<tool_call> calls; // ids set
};

// OpenAI's tool call: {id, index, type: "function", function: {name, arguments}}.
ojson tool_call_json(const tool_call& call, std::size_t index);
// finish_reason "tool_calls" when calls were made and the model stopped by itself (SGLang's
// rule: a reply cut by max_tokens keeps "length").
ojson chat_finish_reason(const GenerateReqOutput& out, bool made_calls);

// POST /v1/chat/completions without streaming. `parts`: the parsed message, or null (the text
// as it is).
ojson chat_response(const openai_reply_context& cx, const GenerateReqOutput& out, bool logprobs,
                    const chat_message_parts* parts = nullptr);
// Streamed chat chunks: the first (role "assistant", empty content), one per engine chunk with
// new content, and the last (empty delta, finish reason).
ojson chat_role_chunk(const openai_reply_context& cx, bool include_usage);
ojson chat_content_chunk(const openai_reply_context& cx, const GenerateReqOutput& chunk, bool logprobs,
                         bool include_usage);
ojson chat_finish_chunk(const openai_reply_context& cx, const GenerateReqOutput& last, bool include_usage,
                        bool made_calls = false);
// The chunks of one parsed delta, as SGLang sends them: the reasoning ({reasoning_content}),
// the content ({content}), then one chunk per call ({tool_calls: [call]}), call k having index
// `first_call + k`. `logprobs` (the engine chunk's, or null) goes on the first; when the delta
// is empty and logprobs are not null, one {content: ""} chunk carries them.
std::vector<ojson> chat_delta_chunks(const openai_reply_context& cx, const chat_delta& delta,
                                     std::size_t first_call, ojson logprobs, bool include_usage);
// The chunk after the last when stream_options.include_usage: no choices, the usage.
ojson usage_chunk(const openai_reply_context& cx, std::string_view object, int32_t prompt_tokens,
                  int32_t completion_tokens, int32_t cached_tokens);

// SGLang's response-level `sglext` with token ids (serving_chat.py): `input_ids` (the prompt's
// ids, once: n choices share the prompt) and `output_ids` (one list of generated token ids per
// choice, the raw tokens whatever the parsers made of their text); a null pointer leaves its
// field out, and with both out the result is null (SGLang then writes no sglext).
ojson sglext_ids(const std::vector<int32_t>* input_ids, const std::vector<std::vector<int32_t>>* output_ids);
// A streamed chat's sglext chunk: no choices, `sglext` (SGLang sends it once, after the finish
// chunks and before the usage chunk). `include_usage`: a null usage field, as other chunks.
ojson sglext_chunk(const openai_reply_context& cx, ojson sglext, bool include_usage);

// GET /v1/models: the one served model.
ojson models_list(std::string_view model, int64_t created);

} // namespace rlserve::net::detail
