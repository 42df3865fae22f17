// The OpenAI call actor (see openai_call_actor.hpp). Runs on CAF's worker threads; the only way
// back to the socket is link<http_outbound>::with(post_...).
#include "net/openai_call_actor.hpp"

#include <algorithm>
#include <ctime>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "actors/guard.hpp"
#include "caf/all.hpp"
#include "messages/generate_fanout.hpp"
#include "messages/json_codec.hpp"
#include "messages/openai.hpp"
#include "model/bpe_tokenizer.hpp"
#include "net/fanout_requests.hpp"
#include "net/log.hpp"
#include "net/openai.hpp"
#include "net/request_accounting.hpp"

namespace rlserve::net::detail {

namespace {

struct openai_state : call_state {
  openai_state() = default;

  http_call::kind_t kind = http_call::openai_completions;
  openai_reply_context cx;
  bool logprobs = false;
  bool include_usage = false;
  std::string echo_text;      // completions with echo: the prompt's text
  int64_t text_offset = 0;    // completions' logprobs text_offset, across chunks
  // n > 1: one engine request per choice (named and seeded as /generate's fan-out).
  std::optional<fanout_requests> fan;
  std::vector<int64_t> sample_offsets;  // streamed n > 1: each choice's text_offset
  std::vector<bool> sample_started;     // streamed n > 1: the choice's first event went out
  // Chat's SGLang extensions (messages/openai.hpp): what each choice carries besides OpenAI's.
  bool return_meta_info = false;
  bool return_token_ids = false;
  // The prompt's token ids as the engine got them, when a reply field carries them: each
  // choice's prompt_token_ids (return_prompt_token_ids, or return_token_ids: SGLang's rule) or
  // sglext.input_ids.
  std::optional<std::vector<int32_t>> prompt_ids;
  bool choice_prompt_ids = false;
  // SGLang's sglext ids (return_input_ids_in_sglext / return_output_ids_in_sglext); streamed,
  // each choice's generated ids are gathered from its chunks for the last sglext chunk.
  bool sglext_input = false;
  bool sglext_output = false;
  std::vector<std::vector<int32_t>> streamed_ids;
  // Chats with --tool-call-parser / --reasoning-parser at work: how each choice's text is split,
  // and, streamed, each choice's parser state and whether it made calls.
  chat_parsing parsing;
  std::vector<chat_output_stream> parsers;
  static inline const char* name = "openai_call";
};

using openai_actor = caf::stateful_actor<openai_state>;

void reply(openai_actor* self, http_reply r) {
  auto& s = self->state;
  if (s.done)
    return;
  s.done = true;
  post_reply_once(s, std::move(r));
  self->quit();
}

void reply_json(openai_actor* self, unsigned status, const ojson& body) {
  reply(self, http_reply{status, "application/json", body.dump(-1, ' ', false, ojson::error_handler_t::replace), false});
}

void reply_error(openai_actor* self, unsigned status, std::string_view message,
                 std::string_view type = "invalid_request_error") {
  reply(self, http_reply{status, "application/json", openai_error_body(message, type), false});
}

void event(openai_actor* self, const ojson& data) {
  post_event(self->state, data.dump(-1, ' ', false, ojson::error_handler_t::replace));
}

void end_stream(openai_actor* self) { reply(self, http_reply{200, "", "", true}); }

// The engine let the call down (it did not answer, or the front door stopped): 503, or an error
// event ending the stream once events went out.
void engine_failed(openai_actor* self, const std::string& message) {
  auto& s = self->state;
  if (s.stream && s.events_sent) {
    event(self, ojson::parse(openai_error_body(message, "server_error")));
    return end_stream(self);
  }
  reply_error(self, 503, message, "server_error");
}

// A request refused before it reached the engine.
void refuse(openai_actor* self, unsigned status, std::string_view message) {
  auto& s = self->state;
  s.st->stats.protocol_error(to_string(status == 413 ? error_code::too_large : error_code::bad_request));
  s.st->stats.request_done("http", s.info.route, request_result::error, 0);
  reply_error(self, status, message);
}

std::string_view chunk_object(http_call::kind_t kind) {
  return kind == http_call::openai_chat ? "chat.completion.chunk" : "text_completion";
}

// OpenAI's tool call ids: "call_" and 24 random hex digits (SGLang's form).
std::string new_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

void name_calls(std::vector<tool_call>& calls) {
  for (auto& c : calls)
    c.id = new_tool_call_id();
}

// The chat chunks of one streamed engine chunk of choice k (index 0 in each; the caller sets
// it): its text as it is, or split by the parsers; the finish chunk on the last.
std::vector<ojson> chat_chunks(openai_state& s, std::size_t k, const GenerateReqOutput& chunk) {
  std::vector<ojson> out;
  if (!s.parsing.any()) {
    if (!chunk.text.empty() || !chunk.output_ids.empty())
      out.push_back(chat_content_chunk(s.cx, chunk, s.logprobs, s.include_usage));
    if (chunk.finished)
      out.push_back(chat_finish_chunk(s.cx, chunk, s.include_usage));
    return out;
  }
  auto& parser = s.parsers[k];
  const std::size_t first_call = parser.calls();
  auto delta = parser.feed(chunk.text);
  if (chunk.finished) {
    auto rest = parser.finish();
    delta.reasoning += rest.reasoning;
    delta.content += rest.content;
    for (auto& c : rest.calls)
      delta.calls.push_back(std::move(c));
  }
  name_calls(delta.calls);
  ojson logprobs = s.logprobs && !chunk.output_ids.empty() ? chat_logprobs(s.cx, chunk) : ojson(nullptr);
  out = chat_delta_chunks(s.cx, delta, first_call, std::move(logprobs), s.include_usage);
  if (chunk.finished)
    out.push_back(chat_finish_chunk(s.cx, chunk, s.include_usage, parser.calls() > 0));
  return out;
}

// One streamed engine chunk of choice k of an n > 1 request: OpenAI's chunks with that index.
void on_sample_chunk(openai_actor* self, std::size_t k, const GenerateReqOutput& chunk) {
  auto& s = self->state;
  s.st->stats.stream_chunk();
  auto indexed = [&](ojson j) {
    j["choices"][0]["index"] = k;
    event(self, j);
  };
  const bool first = !s.sample_started[k];
  s.sample_started[k] = true;
  if (s.sglext_output && k < s.streamed_ids.size())
    s.streamed_ids[k].insert(s.streamed_ids[k].end(), chunk.output_ids.begin(), chunk.output_ids.end());
  if (s.kind == http_call::openai_completions) {
    indexed(completion_chunk(s.cx, chunk, s.logprobs, first ? s.echo_text : std::string(),
                             s.sample_offsets[k], s.include_usage));
    return;
  }
  if (first)
    indexed(chat_role_chunk(s.cx, s.include_usage));
  for (auto& j : chat_chunks(s, k, chunk))
    indexed(std::move(j));
}

// One streamed engine chunk, as OpenAI's chunks.
void on_chunk(openai_actor* self, const GenerateReqOutput& chunk) {
  auto& s = self->state;
  if (s.done || !s.stream)
    return;
  if (s.fan) {
    if (auto k = s.fan->index_of(chunk)) // a failure is answered by samples_done
      on_sample_chunk(self, *k, chunk);
    return;
  }
  if (!chunk.success) {
    if (s.events_sent) // refused at once: the reply answers with 400 instead
      event(self, ojson::parse(openai_error_body(chunk.message)));
    return;
  }
  s.st->stats.stream_chunk();
  if (s.sglext_output && !s.streamed_ids.empty())
    s.streamed_ids[0].insert(s.streamed_ids[0].end(), chunk.output_ids.begin(), chunk.output_ids.end());
  if (s.kind == http_call::openai_completions) {
    std::string prefix = s.events_sent ? std::string() : s.echo_text;
    event(self, completion_chunk(s.cx, chunk, s.logprobs, prefix, s.text_offset, s.include_usage));
    return;
  }
  if (!s.events_sent)
    event(self, chat_role_chunk(s.cx, s.include_usage));
  for (auto& j : chat_chunks(s, 0, chunk))
    event(self, j);
}

// A chat choice of `out`, with SGLang's extensions the request asked for: meta_info (/generate's,
// with the logprobs, weight version and routing rows), token_ids, prompt_token_ids.
ojson chat_choice(const openai_state& s, const GenerateReqOutput& out) {
  std::optional<chat_message_parts> parts;
  if (s.parsing.any()) {
    auto d = parse_chat_output(s.parsing, out.text);
    name_calls(d.calls);
    parts = chat_message_parts{s.parsing.reasoning, std::move(d.reasoning), std::move(d.content), std::move(d.calls)};
  }
  auto choice = chat_response(s.cx, out, s.logprobs, parts ? &*parts : nullptr)["choices"][0];
  if (s.return_meta_info)
    choice["meta_info"] = ojson::parse(to_json(out)["meta_info"].dump());
  if (s.return_token_ids)
    choice["token_ids"] = out.output_ids;
  if (s.choice_prompt_ids)
    choice["prompt_token_ids"] = *s.prompt_ids;
  return choice;
}

// The reply's sglext of choices that generated `outputs` (null: none asked for).
ojson reply_sglext(const openai_state& s, const std::vector<std::vector<int32_t>>& outputs) {
  if (s.kind != http_call::openai_chat)
    return nullptr;
  return sglext_ids(s.sglext_input ? &*s.prompt_ids : nullptr, s.sglext_output ? &outputs : nullptr);
}

// Streamed chat: the sglext chunk, when asked for, once every choice succeeded (SGLang leaves
// the ids out after an error).
void send_sglext_chunk(openai_actor* self) {
  auto& s = self->state;
  if (auto x = reply_sglext(s, s.streamed_ids); !x.is_null())
    event(self, sglext_chunk(s.cx, std::move(x), s.include_usage));
}

// The prompt tokens the prefix cache served, for the usage of n choices of one prompt (whose
// prompt is counted once): the most any choice got.
template <class Outputs>
int32_t most_cached(const Outputs& samples) {
  int32_t most = 0;
  for (const auto& o : samples)
    most = std::max(most, o.cached_tokens);
  return most;
}

// The last choice of an n > 1 request is in: n choices, or the first failure (the others were
// aborted).
void samples_done(openai_actor* self) {
  auto& s = self->state;
  const auto& failure = s.fan->failure();
  const auto& samples = s.fan->results();
  after_reply(*s.st, s.info, "http", true, failure.empty(), 0);
  if (s.stream) {
    if (!failure.empty()) {
      event(self, ojson::parse(openai_error_body(failure)));
      return end_stream(self);
    }
    send_sglext_chunk(self);
    if (s.include_usage) {
      int32_t completion = 0;
      for (const auto& o : samples)
        completion += o.completion_tokens;
      event(self, usage_chunk(s.cx, chunk_object(s.kind), samples[0].prompt_tokens, completion,
                              most_cached(samples)));
    }
    return end_stream(self);
  }
  if (!failure.empty())
    return reply_error(self, 400, failure);
  auto build = [&](const GenerateReqOutput& o) {
    if (s.kind != http_call::openai_chat)
      return completion_response(s.cx, o, s.logprobs, s.echo_text);
    auto body = chat_response(s.cx, o, s.logprobs);
    body["choices"][0] = chat_choice(s, o);
    return body;
  };
  auto body = build(samples[0]);
  int32_t completion = samples[0].completion_tokens;
  for (std::size_t k = 1; k < samples.size(); ++k) {
    auto choice = build(samples[k])["choices"][0];
    choice["index"] = k;
    body["choices"].push_back(std::move(choice));
    completion += samples[k].completion_tokens;
  }
  body["usage"] = usage(samples[0].prompt_tokens, completion, most_cached(samples));
  std::vector<std::vector<int32_t>> outputs;
  for (const auto& o : samples)
    outputs.push_back(o.output_ids);
  if (auto x = reply_sglext(s, outputs); !x.is_null())
    body["sglext"] = std::move(x);
  reply_json(self, 200, body);
}

// OpenAI's n > 1: n engine requests, answered as one reply with n choices, or streamed as the
// chunks of each with its choice index.
void send_samples(openai_actor* self, GenerateReqInput req) {
  auto& s = self->state;
  const auto n = static_cast<std::size_t>(req.sampling_params.n);
  s.stream = req.stream;
  s.sample_offsets.assign(n, 0);
  s.sample_started.assign(n, false);
  if (n > k_max_fanout)
    return refuse(self, 400, fmt::format("n: {} choices; at most {} per request", n, k_max_fanout));
  const std::string base = assign_rid(req); // the samples' rids are "{base}_{k}"
  s.cx.id = (s.kind == http_call::openai_chat ? "chatcmpl-" : "cmpl-") + base;
  s.cx.created = static_cast<int64_t>(std::time(nullptr));
  s.cx.tokenizer = s.st->tokenizer.get();
  std::vector<GenerateReqInput> samples;
  samples.reserve(n);
  for (std::size_t k = 0; k < n; ++k) {
    auto& one = samples.emplace_back(req);
    one.sampling_params.n = 1;
    one.rid = fanout_rid(base, k);
    if (one.sampling_params.sampling_seed)
      one.sampling_params.sampling_seed = sample_seed(*one.sampling_params.sampling_seed, k);
  }
  s.sent = true;
  s.fan.emplace(fanout_names{"choice", "request", false})
    .send(self, s.st, std::move(samples), s.stream, [self] { samples_done(self); });
}

void send_generate(openai_actor* self, GenerateReqInput req) {
  auto& s = self->state;
  if (req.sampling_params.n > 1)
    return send_samples(self, std::move(req));
  s.info.rid = assign_rid(req);
  s.cx.id = (s.kind == http_call::openai_chat ? "chatcmpl-" : "cmpl-") + s.info.rid;
  s.cx.created = static_cast<int64_t>(std::time(nullptr));
  s.cx.tokenizer = s.st->tokenizer.get();
  s.stream = req.stream;
  req.output_through_sink_only = s.stream; // each delta goes out as it comes; nobody keeps the whole
  caf::actor sink = s.stream ? caf::actor_cast<caf::actor>(self) : caf::actor{};
  s.sent = true;
  self->request(s.st->front, caf::infinite, std::move(req), sink)
    .then(
      [self](GenerateReqOutput& out) {
        auto& s = self->state;
        note_generate(*s.st, out);
        after_reply(*s.st, s.info, "http", true, out.success, 0);
        if (s.stream && s.events_sent) {
          if (out.success)
            send_sglext_chunk(self);
          if (s.include_usage && out.success)
            event(self, usage_chunk(s.cx, chunk_object(s.kind), out.prompt_tokens, out.completion_tokens,
                                    out.cached_tokens));
          return end_stream(self);
        }
        if (!out.success)
          return reply_error(self, 400, out.message);
        if (s.stream) { // nothing streamed (cannot happen: the last chunk always comes)
          on_chunk(self, out);
          return end_stream(self);
        }
        if (s.kind == http_call::openai_chat) {
          auto body = chat_response(s.cx, out, s.logprobs);
          body["choices"][0] = chat_choice(s, out);
          if (auto x = reply_sglext(s, {out.output_ids}); !x.is_null())
            body["sglext"] = std::move(x);
          return reply_json(self, 200, body);
        }
        reply_json(self, 200, completion_response(s.cx, out, s.logprobs, s.echo_text));
      },
      [self](caf::error& err) {
        auto& s = self->state;
        after_reply(*s.st, s.info, "http", false, false, 0);
        engine_failed(self, "the engine did not answer: " + self->system().render(err));
      });
}

void start_completion(openai_actor* self, const http_call& call) {
  auto& s = self->state;
  auto req = parse_openai_completion_request(call.body, s.st->max_input_ids);
  if (!req)
    return refuse(self, 400, req.error());
  s.cx.model = req->model.empty() ? s.st->model_name : req->model;
  s.logprobs = req->logprobs.has_value();
  s.include_usage = req->include_usage;
  if (req->echo) {
    if (req->generate.text) {
      s.echo_text = *req->generate.text;
    } else if (s.st->tokenizer) {
      s.echo_text = s.st->tokenizer->decode(*req->generate.input_ids, /*skip_special_tokens=*/false);
    } else {
      return refuse(self, 400, "echo: a token-id prompt is echoed as text, and this model has no tokenizer.json");
    }
  }
  send_generate(self, std::move(req->generate));
}

// The template's `tools`: the offered functions (SGLang gives templates the `function` objects),
// or null.
nlohmann::ordered_json template_tools(const OpenAIChatRequest& req) {
  if (req.tools.is_null())
    return nullptr;
  auto functions = nlohmann::ordered_json::array();
  for (const auto& t : req.tools)
    functions.push_back(t["function"]);
  return functions;
}

// Which parsers a chat's reply goes through: the server's tool-call parser when tools are
// offered (and tool_choice is not "none"); its reasoning parser unless the request sets
// separate_reasoning: false or, for qwen3 and glm45, chat_template_kwargs.enable_thinking: false
// (SGLang's gate). The output starts inside thinking when the parser is forced or the prompt
// ends with <think> (for input_ids, the prompt's last tokens decoded).
chat_parsing chat_parsing_of(const shared_state& st, const OpenAIChatRequest& req, const std::string& prompt) {
  chat_parsing p;
  if (!req.tools.is_null() && st.tool_format) {
    p.tool_format = st.tool_format;
    for (const auto& t : req.tools) {
      const auto& f = t["function"];
      p.tools.functions.emplace_back(f["name"].get<std::string>(),
                                     f.contains("parameters") ? f["parameters"] : nlohmann::ordered_json());
    }
  }
  if (st.reasoning && req.separate_reasoning) {
    const auto& kw = req.chat_template_kwargs;
    const bool thinking_off = kw.is_object() && kw.contains("enable_thinking") && kw["enable_thinking"] == false;
    if (!(st.reasoning->gated_by_enable_thinking && thinking_off)) {
      p.reasoning = true;
      std::string tail = prompt;
      if (req.generate.input_ids && st.tokenizer) {
        const auto& ids = *req.generate.input_ids;
        const std::size_t n = std::min<std::size_t>(ids.size(), 8);
        tail = st.tokenizer->decode(std::vector<int32_t>(ids.end() - static_cast<std::ptrdiff_t>(n), ids.end()),
                                    /*skip_special_tokens=*/false);
      }
      p.starts_in_reasoning = st.reasoning->forced || prompt_opens_reasoning(tail);
    }
  }
  return p;
}

void start_chat(openai_actor* self, const http_call& call) {
  auto& s = self->state;
  auto req = parse_openai_chat_request(call.body, s.st->max_input_ids);
  if (!req)
    return refuse(self, 400, req.error());
  const bool tools_offered = req->tools.is_array() && !req->tools.empty() && !req->tool_choice_none;
  // Tools the server could not read calls of back would reach the model and come back as text.
  if (tools_offered && !s.st->tool_format)
    return refuse(self, 400, "tools: this server parses no tool calls; start it with --tool-call-parser "
                             "(" + tool_call_format_names() + ")");
  if (!tools_offered)
    req->tools = nullptr;
  std::string prompt_text; // the rendered prompt (none with input_ids)
  // With input_ids (SGLang's extension) the client has rendered and tokenized the prompt
  // itself; the template is not run.
  if (!req->generate.input_ids) {
    if (!s.st->chat)
      return refuse(self, 400, s.st->chat_template_error);
    model::chat_render_options options;
    options.kwargs = req->chat_template_kwargs;
    options.tools = template_tools(*req);
    auto prompt = s.st->chat->render(req->messages, options);
    if (!prompt)
      return refuse(self, 400, "messages: rendering the chat template failed: " + prompt.error());
    prompt_text = *prompt;
    req->generate.text = std::move(*prompt);
    // The prompt's token ids are wanted back: tokenize here, as the engine would (the same
    // tokenizer, the same call), and send the ids.
    if (const char* flag = req->return_prompt_token_ids      ? "return_prompt_token_ids"
                           : req->return_token_ids           ? "return_token_ids"
                           : req->return_input_ids_in_sglext ? "return_input_ids_in_sglext"
                                                             : nullptr) {
      if (!s.st->tokenizer)
        return refuse(self, 400, std::string(flag) + ": this model has no tokenizer.json");
      req->generate.input_ids = s.st->tokenizer->encode(*req->generate.text);
      req->generate.text.reset();
    }
  }
  s.parsing = chat_parsing_of(*s.st, *req, prompt_text);
  s.parsers.assign(static_cast<std::size_t>(std::max(req->generate.sampling_params.n, 1)),
                   chat_output_stream(s.parsing));
  s.cx.model = req->model.empty() ? s.st->model_name : req->model;
  s.logprobs = req->logprobs;
  s.include_usage = req->include_usage;
  s.return_meta_info = req->return_meta_info;
  s.return_token_ids = req->return_token_ids;
  s.choice_prompt_ids = req->return_prompt_token_ids || req->return_token_ids;
  s.sglext_input = req->return_input_ids_in_sglext;
  s.sglext_output = req->return_output_ids_in_sglext;
  if (s.choice_prompt_ids || s.sglext_input)
    s.prompt_ids = req->generate.input_ids;
  s.streamed_ids.assign(static_cast<std::size_t>(std::max(req->generate.sampling_params.n, 1)), {});
  // OpenAI's chat has no default length: the reply may run to the model's context length
  // (the engine ends it there).
  if (!req->max_tokens_set)
    req->generate.sampling_params.max_new_tokens =
      static_cast<int32_t>(std::clamp<int64_t>(s.st->max_context_length, 1, INT32_MAX));
  send_generate(self, std::move(req->generate));
}

caf::behavior openai_call_actor(openai_actor* self, std::shared_ptr<shared_state> st,
                                std::shared_ptr<link<http_outbound>> out, http_call call, uint64_t registry_id) {
  auto& s = self->state;
  s.st = st;
  s.out = std::move(out);
  s.kind = call.kind;
  s.info.route = call.kind == http_call::openai_models        ? "v1/models"
                 : call.kind == http_call::openai_completions ? "v1/completions"
                                                              : "v1/chat/completions";
  self->attach_functor([st, registry_id] { st->remove_actor(registry_id); });
  answer_if_ended_early(self, s);
  watch_front_door(self, s, [self](const std::string& m) { engine_failed(self, m); });
  // This runs inside spawn, on the session's I/O thread: an exception here would end the server.
  guarded(
    [&] {
      if (call.kind == http_call::openai_models) {
        s.st->stats.request_done("http", s.info.route, request_result::ok, 0);
        return reply_json(self, 200, models_list(s.st->model_name, s.st->started_at));
      }
      if (call.body.size() > s.st->max_generate_bytes)
        return refuse(self, 413,
                      fmt::format("a request of {} bytes is larger than any this model can serve ({} bytes for "
                                  "its context length); it was not read",
                                  call.body.size(), s.st->max_generate_bytes));
      if (call.kind == http_call::openai_completions)
        start_completion(self, call);
      else
        start_chat(self, call);
    },
    [&](const std::string& what) {
      log_error("HTTP " + s.info.route + ": handling the request failed: " + what);
      reply_error(self, 500, "the server failed handling this request: " + what, "server_error");
    });
  return {
    [self](GenerateReqOutput& chunk) { on_chunk(self, chunk); },
    [self](http_cancel_msg&) {
      auto& s = self->state;
      if (s.done)
        return;
      if (!s.info.rid.empty()) {
        self->send(s.st->front, cancel_atom_v, s.info.rid, std::string("aborted: the client disconnected"));
        s.st->stats.disconnect_cleanup("abort_request");
      }
      if (s.fan) { // counted as /generate's fan-out counts it
        s.fan->abort_all("aborted: the client disconnected");
        s.st->stats.disconnect_cleanup("abort_request");
      }
    },
  };
}

} // namespace

caf::actor spawn_openai_call(std::shared_ptr<shared_state> st, std::shared_ptr<link<http_outbound>> out,
                             http_call call) {
  auto id = st->reserve_actor();
  auto a = st->sys.spawn(openai_call_actor, st, std::move(out), std::move(call), id);
  st->set_actor(id, a);
  return a;
}

} // namespace rlserve::net::detail
