// Readers of OpenAI's completion and chat requests (messages/openai.hpp), mapping every field
// onto GenerateReqInput: OpenAI's names where they exist, SGLang's extensions (top_k, min_p, ...)
// as SGLang's OpenAI server takes them.
#include "messages/openai.hpp"

#include <algorithm>

#include "messages/json_codec.hpp"
#include "messages/json_codec_detail.hpp"
#include "messages/validate.hpp"

namespace rlserve {

using namespace json_codec_detail;

namespace {

const int_rule<int32_t> k_token_id{.lo = 0};
const int_rule<int32_t> k_count{.lo = 0};
constexpr int32_t k_max_top_logprobs = 20; // OpenAI's bound for chat's top_logprobs


// The fields both routes share: sampling, stop, seed, penalties, n, stream and its options,
// SGLang's sampling extensions; refusals of what would change the result and is not
// implemented; fields that change nothing rlserve returns, ignored.
void read_common(object_reader& r, std::string& model, GenerateReqInput& g, bool& include_usage) {
  auto& s = g.sampling_params;
  r.field("model", model);
  r.field("temperature", s.temperature, num_rule{.lo = 0, .hi = 2});
  r.field("top_p", s.top_p, num_rule{.lo = 0, .hi = 1, .lo_open = true});
  r.field("n", s.n, int_rule<int32_t>{.lo = 1, .hi = 128});
  read_stop(r, s.stop);
  r.field("frequency_penalty", s.frequency_penalty, num_rule{.lo = -2, .hi = 2});
  r.field("presence_penalty", s.presence_penalty, num_rule{.lo = -2, .hi = 2});
  uint64_t seed = 0;
  if (r.get("seed")) {
    r.field("seed", seed);
    if (r.ok())
      s.sampling_seed = seed;
  }
  r.field("stream", g.stream);
  r.object("stream_options", [&](object_reader& o) {
    o.field("include_usage", include_usage);
    o.ignore("continuous_usage_stats");
  });
  // SGLang's extensions of the OpenAI requests, with SamplingParams' meaning.
  r.field("top_k", s.top_k);
  if (r.ok() && (s.top_k == 0 || s.top_k < -1))
    r.fail("top_k", "expected -1 (the whole vocabulary) or an integer >= 1, got " + std::to_string(s.top_k));
  r.field("min_p", s.min_p, num_rule{.lo = 0, .hi = 1});
  r.field("repetition_penalty", s.repetition_penalty, num_rule{.lo = 0, .hi = 2, .lo_open = true});
  r.field("min_tokens", s.min_new_tokens, k_count);
  r.field("stop_token_ids", s.stop_token_ids, list_rule<int_rule<int32_t>>{.elem = k_token_id});
  r.field("ignore_eos", s.ignore_eos);
  r.field("skip_special_tokens", s.skip_special_tokens);
  r.field("no_stop_trim", s.no_stop_trim);
  r.field("rid", g.rid, text_rule{.non_empty = true});
  r.unsupported("logit_bias");
  r.unsupported("best_of", 1);
  r.unsupported("response_format", nullptr, "constrained decoding is not implemented");
  for (auto key : {"regex", "json_schema", "ebnf", "structural_tag", "stop_regex", "lora_path",
                   "custom_logit_processor", "return_hidden_states"})
    r.unsupported(key);
  // Accounting, routing and storage hints of OpenAI's and SGLang's APIs.
  for (auto key : {"user", "metadata", "store", "service_tier", "priority", "extra_key", "cache_salt",
                   "routed_dp_rank", "session_id"})
    r.ignore(key);
  read_custom_params(r);
}

// The prompt of a completion: one string or one list of token ids. A list of several prompts is
// OpenAI's batch form; one prompt per request here.
void read_prompt(object_reader& r, GenerateReqInput& g) {
  auto v = r.get("prompt");
  if (v == nullptr) {
    r.missing("prompt");
    return;
  }
  const path p = r.at("prompt");
  const json* one = v;
  if (v->is_array() && !v->empty() && (v->front().is_string() || v->front().is_array())) {
    if (v->size() != 1) {
      r.cx().fail(p, "a list of " + std::to_string(v->size()) +
                       " prompts is a batch; rlserve takes one prompt per request (send each as its own request)");
      return;
    }
    one = &v->front();
  }
  if (one->is_string()) {
    std::string text;
    if (parse(r.cx(), *one, p, text, text_rule{.non_empty = true}))
      g.text = std::move(text);
    return;
  }
  std::vector<int32_t> ids;
  if (one->is_array() || compact_ids(*one)) {
    if (parse(r.cx(), *one, p, ids, list_rule<int_rule<int32_t>>{.elem = k_token_id, .non_empty = true}))
      g.input_ids = std::move(ids);
    return;
  }
  r.cx().expected_but_got(p, "a string or a list of token ids", *one);
}

// A message's content: a string, null, or a list of text parts ({"type": "text", "text": ...}),
// which become one string joined by newlines (what templates that test `content is string`
// need). Other parts (images, audio, files) are refused.
bool read_content(context& cx, const path& p, nlohmann::ordered_json& content) {
  if (content.is_string() || content.is_null())
    return true;
  if (!content.is_array()) {
    cx.fail(p, "expected a string, null or a list of text parts, got " + describe(json::parse(content.dump())));
    return false;
  }
  std::string joined;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const path pi = p.index(i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      cx.fail(pi, "expected a content part {\"type\": \"text\", \"text\": ...}");
      return false;
    }
    auto type = part["type"].get<std::string>();
    if (type != "text") {
      cx.fail(pi.key("type"), "\"" + type + "\" parts are not supported by rlserve (text only)");
      return false;
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      cx.fail(pi.key("text"), "expected a string");
      return false;
    }
    if (i)
      joined += '\n';
    joined += part["text"].get<std::string>();
  }
  content = std::move(joined);
  return true;
}

// messages: a non-empty list of objects with a string role. Everything else a message holds
// (name, tool_calls, tool_call_id, reasoning_content) goes to the template as sent.
void read_messages(context& cx, nlohmann::ordered_json& messages) {
  const path root;
  const path p = root.key("messages");
  if (!messages.is_array()) {
    if (messages.is_null())
      cx.fail(p, "required field is missing");
    else
      cx.fail(p, "expected a list of messages");
    return;
  }
  if (messages.empty()) {
    cx.fail(p, "empty (a chat needs at least one message)");
    return;
  }
  for (std::size_t i = 0; i < messages.size() && cx.ok(); ++i) {
    auto& m = messages[i];
    const path pm = p.index(i);
    if (!m.is_object()) {
      cx.fail(pm, "expected a message object {\"role\": ..., \"content\": ...}");
      return;
    }
    if (!m.contains("role") || !m["role"].is_string() || m["role"].get_ref<const std::string&>().empty()) {
      cx.fail(pm.key("role"), m.contains("role") ? "expected a non-empty string" : "required field is missing");
      return;
    }
    if (m.contains("content")) {
      const path pc = pm.key("content");
      read_content(cx, pc, m["content"]);
    }
  }
}

// tools: a list of {"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}. Every fault names its field ("tools[1].function.name: ..."): a schema the parser
// would misread must not reach it.
void read_tools(context& cx, const nlohmann::ordered_json& tools, nlohmann::ordered_json& out) {
  const path root;
  const path p = root.key("tools");
  if (tools.is_null())
    return;
  if (!tools.is_array()) {
    cx.fail(p, "expected a list of tools [{\"type\": \"function\", \"function\": {\"name\": ...}}]");
    return;
  }
  std::vector<std::string> names;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    const path pt = p.index(i);
    if (!t.is_object()) {
      cx.fail(pt, "expected a tool object {\"type\": \"function\", \"function\": {...}}");
      return;
    }
    for (auto it = t.begin(); it != t.end(); ++it)
      if (it.key() != "type" && it.key() != "function") {
        cx.fail(pt.key(it.key()), "unknown field of a tool (expected type and function)");
        return;
      }
    if (!t.contains("type") || t["type"] != "function") {
      cx.fail(pt.key("type"), t.contains("type") ? "expected \"function\" (the only tool type)"
                                                 : "required field is missing (\"function\")");
      return;
    }
    const path pf = pt.key("function");
    if (!t.contains("function")) {
      cx.fail(pf, "required field is missing");
      return;
    }
    const auto& f = t["function"];
    if (!f.is_object()) {
      cx.fail(pf, "expected an object {\"name\": ..., \"parameters\": {...}}");
      return;
    }
    for (auto it = f.begin(); it != f.end(); ++it) {
      const auto& k = it.key();
      const auto& v = it.value();
      if (k == "name") {
        if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
          cx.fail(pf.key("name"), "expected a non-empty string");
          return;
        }
      } else if (k == "description") {
        if (!v.is_string() && !v.is_null()) {
          cx.fail(pf.key("description"), "expected a string");
          return;
        }
      } else if (k == "parameters") {
        if (!v.is_object() && !v.is_null()) {
          cx.fail(pf.key("parameters"), "expected a JSON schema object");
          return;
        }
      } else if (k == "strict") {
        if (!v.is_boolean() && !v.is_null()) {
          cx.fail(pf.key("strict"), "expected a boolean");
          return;
        }
      } else {
        cx.fail(pf.key(k), "unknown field of a function (expected name, description, parameters, strict)");
        return;
      }
    }
    if (!f.contains("name")) {
      cx.fail(pf.key("name"), "required field is missing");
      return;
    }
    auto name = f["name"].get<std::string>();
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      cx.fail(pf.key("name"), "\"" + name + "\" is offered twice (a call names its function)");
      return;
    }
    names.push_back(std::move(name));
  }
  out = tools;
}

} // namespace

expected<OpenAICompletionRequest> parse_openai_completion_request(std::string_view body,
                                                                  std::size_t max_input_ids) {
  auto j = parse_request_json(body.empty() ? std::string_view("{}") : body, max_input_ids);
  if (!j)
    return std::move(j).take_failure();
  if (!j->is_object())
    return fail("the request body must be a JSON object");
  // OpenAI's default length of a completion.
  OpenAICompletionRequest init;
  init.generate.sampling_params.max_new_tokens = 16;
  auto x = decode<OpenAICompletionRequest>(*j, strictness::request, [&](object_reader& r, OpenAICompletionRequest& x) {
    x = init;
    read_common(r, x.model, x.generate, x.include_usage);
    read_prompt(r, x.generate);
    // SGLang returns a completion's routing rows in the reply's `sglext`, and its output ids
    // with return_token_ids; neither is written here.
    r.unsupported("return_routed_experts", false, "use /generate, whose meta_info.routed_experts has them");
    r.unsupported("return_token_ids", false, "use /generate, whose output_ids are the token ids");
    r.field("max_tokens", x.generate.sampling_params.max_new_tokens, k_count);
    r.field("logprobs", x.logprobs, int_rule<int32_t>{.lo = 0, .hi = k_max_top_logprobs});
    r.field("echo", x.echo);
    r.unsupported("suffix", nullptr, "insertion is not implemented");
    if (!r.ok())
      return;
    if (x.echo && x.logprobs)
      r.fail("echo", "echo with logprobs needs the prompt's logprobs, which this route does not return; "
                     "use /generate with logprob_start_len = 0");
    if (x.generate.sampling_params.min_new_tokens > x.generate.sampling_params.max_new_tokens)
      r.fail("min_tokens", "expected at most max_tokens (" +
                             std::to_string(x.generate.sampling_params.max_new_tokens) + ")");
    x.generate.return_logprob = x.logprobs.has_value();
    x.generate.top_logprobs_num = x.logprobs.value_or(0);
  });
  if (x)
    if (auto st = validate(x->generate); !st)
      return std::move(st).take_failure();
  return x;
}

expected<OpenAIChatRequest> parse_openai_chat_request(std::string_view body, std::size_t max_input_ids) {
  auto j = parse_request_json(body.empty() ? std::string_view("{}") : body, max_input_ids);
  if (!j)
    return std::move(j).take_failure();
  if (!j->is_object())
    return fail("the request body must be a JSON object");
  auto x = decode<OpenAIChatRequest>(*j, strictness::request, [&](object_reader& r, OpenAIChatRequest& x) {
    read_common(r, x.model, x.generate, x.include_usage);
    r.ignore("messages"); // read below, in the sender's key order
    auto& max_new = x.generate.sampling_params.max_new_tokens;
    if (r.get("max_completion_tokens")) {
      r.field("max_completion_tokens", max_new, k_count);
      x.max_tokens_set = true;
    } else if (r.get("max_tokens")) {
      r.field("max_tokens", max_new, k_count);
      x.max_tokens_set = true;
    }
    r.field("logprobs", x.logprobs);
    r.field("top_logprobs", x.top_logprobs, int_rule<int32_t>{.lo = 0, .hi = k_max_top_logprobs});
    if (auto v = r.get("chat_template_kwargs")) {
      if (!v->is_object())
        r.cx().expected_but_got(r.at("chat_template_kwargs"), "an object", *v);
    }
    r.ignore("tools"); // read below, in the sender's key order
    // OpenAI's deprecated forms of tools.
    r.unsupported("functions", nullptr, "send tools instead (OpenAI's deprecated form is not taken)");
    r.unsupported("function_call", nullptr, "send tool_choice instead (OpenAI's deprecated form is not taken)");
    if (auto v = r.get("tool_choice")) {
      if (v->is_string() && (*v == "none" || *v == "auto"))
        x.tool_choice_none = *v == "none";
      else if (v->is_string() && *v == "required")
        r.fail("tool_choice", "\"required\" is not supported: rlserve has no constrained decoding to force a "
                              "call; send \"auto\" and check finish_reason == \"tool_calls\"");
      else if (v->is_object())
        r.fail("tool_choice", "a named function is not supported: rlserve has no constrained decoding to force a "
                              "call; send \"auto\" (with only that tool) and check message.tool_calls");
      else
        r.cx().expected_but_got(r.at("tool_choice"), "\"auto\" or \"none\"", *v);
    }
    r.field("separate_reasoning", x.separate_reasoning);
    // The prompt as token ids (SGLang's extension): the chat template is not rendered; messages
    // are still required and checked, as SGLang requires them.
    r.field("input_ids", x.generate.input_ids, list_rule<int_rule<int32_t>>{.elem = k_token_id, .non_empty = true});
    r.field("return_meta_info", x.return_meta_info);
    r.field("return_token_ids", x.return_token_ids);
    r.field("return_prompt_token_ids", x.return_prompt_token_ids);
    r.field("return_input_ids_in_sglext", x.return_input_ids_in_sglext);
    r.field("return_output_ids_in_sglext", x.return_output_ids_in_sglext);
    r.field("return_routed_experts", x.generate.return_routed_experts);
    r.unsupported("return_indexer_topk", false, "no model rlserve serves has a DSA indexer");
    r.field("routed_experts_start_len", x.generate.routed_experts_start_len, k_count);
    r.unsupported("continue_final_message", false);
    r.unsupported("audio");
    r.unsupported("prediction");
    for (auto key : {"stream_reasoning", "parallel_tool_calls", "reasoning_effort",
                     "modalities", "web_search_options"})
      r.ignore(key);
    if (!r.ok())
      return;
    if (x.top_logprobs > 0 && !x.logprobs)
      r.fail("top_logprobs", "needs logprobs: true");
    // The per-choice results come with the whole reply only, as SGLang refuses these three when
    // streaming; the sglext ids are its streamable form.
    if (x.generate.stream)
      for (auto [key, set] : {std::pair{"return_meta_info", x.return_meta_info},
                              std::pair{"return_token_ids", x.return_token_ids},
                              std::pair{"return_prompt_token_ids", x.return_prompt_token_ids}})
        if (set && r.ok())
          r.fail(key, std::string("not supported with stream: true; send the request without streaming") +
                        (key == std::string_view("return_meta_info")
                         ? ""
                         : ", or ask for sglext.input_ids / output_ids (return_input_ids_in_sglext, "
                           "return_output_ids_in_sglext), which stream"));
    // The routing rows come back in choices[i].meta_info.routed_experts only.
    if (x.generate.return_routed_experts && !x.return_meta_info && r.ok())
      r.fail("return_routed_experts", "needs return_meta_info: true (the rows come back in "
                                      "choices[i].meta_info.routed_experts)");
    if (x.generate.sampling_params.min_new_tokens > max_new && x.max_tokens_set)
      r.fail("min_tokens", "expected at most max_tokens (" + std::to_string(max_new) + ")");
    x.generate.return_logprob = x.logprobs;
    x.generate.top_logprobs_num = x.top_logprobs;
  });
  if (!x)
    return x;
  // The messages and kwargs again, with the sender's key order (tojson in a template keeps it).
  // The text parsed above, so this parse cannot fail nor nest deeper than parse_json allows.
  auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  x->messages = ordered.is_object() && ordered.contains("messages") ? ordered["messages"] : nullptr;
  x->chat_template_kwargs = ordered.is_object() && ordered.contains("chat_template_kwargs") &&
                                ordered["chat_template_kwargs"].is_object()
                              ? ordered["chat_template_kwargs"]
                              : nlohmann::ordered_json::object();
  context cx;
  read_messages(cx, x->messages);
  if (cx.ok() && ordered.is_object() && ordered.contains("tools"))
    read_tools(cx, ordered["tools"], x->tools);
  if (!cx.ok())
    return fail(cx.take_error());
  return x;
}

} // namespace rlserve
