#include "net/openai.hpp"

#include <charconv>
#include <cmath>

#include "model/bpe_tokenizer.hpp"

namespace rlserve::net::detail {

namespace {

// The shortest decimal that reads back as the same float (-0.6931472, not -0.693147182464599);
// non-finite logprobs (a token the sampler could not pick) as null.
ojson float_json(float x) {
  if (!std::isfinite(x))
    return nullptr;
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  double d = 0;
  std::from_chars(buf, r.ptr, d);
  return d;
}

int64_t code_point_count(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s)
    n += (c & 0xC0) != 0x80;
  return n;
}

ojson byte_list(const openai_reply_context& cx, int32_t id) {
  auto out = ojson::array();
  std::optional<std::string> bytes = cx.tokenizer ? cx.tokenizer->token_bytes(id) : std::nullopt;
  std::string text = bytes ? *bytes : token_string(cx, id);
  for (unsigned char c : text)
    out.push_back(int(c));
  return out;
}

ojson base(const openai_reply_context& cx, std::string_view object) {
  return {{"id", cx.id}, {"object", object}, {"created", cx.created}, {"model", cx.model}};
}

} // namespace

std::string openai_error_body(std::string_view message, std::string_view type) {
  auto param = error_param(message);
  ojson j = {{"error",
              {{"message", message},
               {"type", type},
               {"param", param.empty() ? ojson(nullptr) : ojson(param)},
               {"code", nullptr}}}};
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string error_param(std::string_view message) {
  auto colon = message.find(": ");
  if (colon == std::string_view::npos || colon == 0)
    return {};
  auto head = message.substr(0, colon);
  for (char c : head)
    if (c == ' ' || c == '"' || c == '\'')
      return {}; // a sentence, not a path
  return std::string(head);
}

std::string token_string(const openai_reply_context& cx, int32_t id) {
  if (cx.tokenizer)
    if (auto bytes = cx.tokenizer->token_bytes(id))
      return model::bpe_detail::utf8_lossy(*bytes);
  return "token_id:" + std::to_string(id);
}

ojson finish_reason(const GenerateReqOutput& out) {
  if (!out.finish_reason)
    return nullptr;
  return out.finish_reason->type;
}

ojson matched_stop(const GenerateReqOutput& out) {
  if (!out.finish_reason)
    return nullptr;
  if (out.finish_reason->matched_token)
    return *out.finish_reason->matched_token;
  if (out.finish_reason->matched_str)
    return *out.finish_reason->matched_str;
  return nullptr;
}

ojson usage(int32_t prompt_tokens, int32_t completion_tokens, int32_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", int64_t(prompt_tokens) + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

ojson completion_logprobs(const openai_reply_context& cx, const GenerateReqOutput& out, int64_t& offset) {
  auto tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(),
       offsets = ojson::array();
  for (std::size_t i = 0; i < out.output_ids.size(); ++i) {
    auto text = token_string(cx, out.output_ids[i]);
    tokens.push_back(text);
    token_logprobs.push_back(i < out.output_token_logprobs.size() ? float_json(out.output_token_logprobs[i])
                                                                  : ojson(nullptr));
    offsets.push_back(offset);
    offset += code_point_count(text);
    // OpenAI's shape: alternatives keyed by their text; two ids of one text keep the likelier.
    ojson alternatives = ojson::object();
    if (i < out.output_top_logprobs.size())
      for (const auto& t : out.output_top_logprobs[i]) {
        auto key = token_string(cx, t.token_id);
        if (!alternatives.contains(key))
          alternatives[key] = float_json(t.logprob);
      }
    top.push_back(i < out.output_top_logprobs.size() ? alternatives : ojson(nullptr));
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

ojson chat_logprobs(const openai_reply_context& cx, const GenerateReqOutput& out) {
  auto content = ojson::array();
  for (std::size_t i = 0; i < out.output_ids.size(); ++i) {
    auto top = ojson::array();
    if (i < out.output_top_logprobs.size())
      for (const auto& t : out.output_top_logprobs[i])
        top.push_back({{"token", token_string(cx, t.token_id)},
                       {"logprob", float_json(t.logprob)},
                       {"bytes", byte_list(cx, t.token_id)}});
    content.push_back({{"token", token_string(cx, out.output_ids[i])},
                       {"logprob", i < out.output_token_logprobs.size() ? float_json(out.output_token_logprobs[i])
                                                                       : ojson(nullptr)},
                       {"bytes", byte_list(cx, out.output_ids[i])},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

ojson completion_response(const openai_reply_context& cx, const GenerateReqOutput& out, bool logprobs,
                          std::string_view echo_text) {
  int64_t offset = code_point_count(echo_text);
  ojson choice = {{"index", 0},
                  {"text", std::string(echo_text) + out.text},
                  {"logprobs", logprobs ? completion_logprobs(cx, out, offset) : ojson(nullptr)},
                  {"finish_reason", finish_reason(out)},
                  {"matched_stop", matched_stop(out)}};
  auto j = base(cx, "text_completion");
  j["choices"] = ojson::array({choice});
  j["usage"] = usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens);
  j["weight_version"] = out.weight_version;
  return j;
}

ojson completion_chunk(const openai_reply_context& cx, const GenerateReqOutput& chunk, bool logprobs,
                       std::string_view prefix, int64_t& offset, bool include_usage) {
  offset += code_point_count(prefix);
  ojson choice = {{"index", 0},
                  {"text", std::string(prefix) + chunk.text},
                  {"logprobs", logprobs ? completion_logprobs(cx, chunk, offset) : ojson(nullptr)},
                  {"finish_reason", chunk.finished ? finish_reason(chunk) : ojson(nullptr)},
                  {"matched_stop", chunk.finished ? matched_stop(chunk) : ojson(nullptr)}};
  auto j = base(cx, "text_completion");
  j["choices"] = ojson::array({choice});
  if (include_usage)
    j["usage"] = nullptr;
  return j;
}

ojson tool_call_json(const tool_call& call, std::size_t index) {
  return {{"id", call.id},
          {"index", index},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

ojson chat_finish_reason(const GenerateReqOutput& out, bool made_calls) {
  auto reason = finish_reason(out);
  if (made_calls && reason == "stop")
    return "tool_calls";
  return reason;
}

ojson chat_response(const openai_reply_context& cx, const GenerateReqOutput& out, bool logprobs,
                    const chat_message_parts* parts) {
  ojson message = {{"role", "assistant"}, {"content", out.text}, {"tool_calls", nullptr}};
  if (parts) {
    // The answer was all calls: OpenAI's null content.
    message["content"] = parts->content.empty() && !parts->calls.empty() ? ojson(nullptr) : ojson(parts->content);
    if (parts->reasoning_parsed)
      message["reasoning_content"] = parts->reasoning.empty() ? ojson(nullptr) : ojson(parts->reasoning);
    if (!parts->calls.empty()) {
      auto calls = ojson::array();
      for (std::size_t i = 0; i < parts->calls.size(); ++i)
        calls.push_back(tool_call_json(parts->calls[i], i));
      message["tool_calls"] = std::move(calls);
    }
  }
  ojson choice = {{"index", 0},
                  {"message", std::move(message)},
                  {"logprobs", logprobs ? chat_logprobs(cx, out) : ojson(nullptr)},
                  {"finish_reason", chat_finish_reason(out, parts && !parts->calls.empty())},
                  {"matched_stop", matched_stop(out)}};
  auto j = base(cx, "chat.completion");
  j["choices"] = ojson::array({choice});
  j["usage"] = usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens);
  j["weight_version"] = out.weight_version;
  return j;
}

namespace {
ojson chat_chunk(const openai_reply_context& cx, ojson delta, ojson logprobs, ojson reason, ojson matched,
                 bool include_usage) {
  auto j = base(cx, "chat.completion.chunk");
  j["choices"] = ojson::array({{{"index", 0},
                                {"delta", std::move(delta)},
                                {"logprobs", std::move(logprobs)},
                                {"finish_reason", std::move(reason)},
                                {"matched_stop", std::move(matched)}}});
  if (include_usage)
    j["usage"] = nullptr;
  return j;
}
} // namespace

ojson chat_role_chunk(const openai_reply_context& cx, bool include_usage) {
  return chat_chunk(cx, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr, nullptr, include_usage);
}

ojson chat_content_chunk(const openai_reply_context& cx, const GenerateReqOutput& chunk, bool logprobs,
                         bool include_usage) {
  return chat_chunk(cx, {{"content", chunk.text}}, logprobs ? chat_logprobs(cx, chunk) : ojson(nullptr), nullptr,
                    nullptr, include_usage);
}

ojson chat_finish_chunk(const openai_reply_context& cx, const GenerateReqOutput& last, bool include_usage,
                        bool made_calls) {
  return chat_chunk(cx, ojson::object(), nullptr, chat_finish_reason(last, made_calls), matched_stop(last),
                    include_usage);
}

std::vector<ojson> chat_delta_chunks(const openai_reply_context& cx, const chat_delta& delta,
                                     std::size_t first_call, ojson logprobs, bool include_usage) {
  std::vector<ojson> chunks;
  auto add = [&](ojson d) {
    chunks.push_back(chat_chunk(cx, std::move(d), chunks.empty() ? std::move(logprobs) : ojson(nullptr), nullptr,
                                nullptr, include_usage));
  };
  if (!delta.reasoning.empty())
    add({{"reasoning_content", delta.reasoning}});
  if (!delta.content.empty())
    add({{"content", delta.content}});
  for (std::size_t k = 0; k < delta.calls.size(); ++k)
    add({{"tool_calls", ojson::array({tool_call_json(delta.calls[k], first_call + k)})}});
  if (chunks.empty() && !logprobs.is_null())
    add({{"content", ""}});
  return chunks;
}

ojson usage_chunk(const openai_reply_context& cx, std::string_view object, int32_t prompt_tokens,
                  int32_t completion_tokens, int32_t cached_tokens) {
  auto j = base(cx, object);
  j["choices"] = ojson::array();
  j["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

ojson sglext_ids(const std::vector<int32_t>* input_ids, const std::vector<std::vector<int32_t>>* output_ids) {
  if (!input_ids && !output_ids)
    return nullptr;
  ojson j = ojson::object();
  if (input_ids)
    j["input_ids"] = *input_ids;
  if (output_ids)
    j["output_ids"] = *output_ids;
  return j;
}

ojson sglext_chunk(const openai_reply_context& cx, ojson sglext, bool include_usage) {
  auto j = base(cx, "chat.completion.chunk");
  j["choices"] = ojson::array();
  j["sglext"] = std::move(sglext);
  if (include_usage)
    j["usage"] = nullptr;
  return j;
}

ojson models_list(std::string_view model, int64_t created) {
  return {{"object", "list"},
          {"data", ojson::array({{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "rlserve"},
                                  {"root", model}}})}};
}

} // namespace rlserve::net::detail
