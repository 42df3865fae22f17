// The HTTP call actor (see http_call_actor.hpp). Runs on CAF's worker threads; the only way
// back to the socket is link<http_outbound>::with(post_...).
#include "net/http_call_actor.hpp"

#include <chrono>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "actors/guard.hpp"
#include "caf/all.hpp"
#include "messages/json_codec.hpp"
#include "net/http_route.hpp"
#include "net/log.hpp"
#include "net/openai_call_actor.hpp"
#include "net/request_accounting.hpp"

namespace rlserve::net::detail {

namespace {

struct http_state {
  http_state() = default;

  std::shared_ptr<shared_state> st;
  std::shared_ptr<link<http_outbound>> out;
  call_info info;
  bool stream = false;
  bool events_sent = false;
  bool done = false;
  bool sent = false; // the route's request went to the engine: after_reply is owed
  GenerateReqOutput acc; // SSE: everything so far (SGLang streams cumulative results)
  static inline const char* name = "http_call";
};

using http_actor = caf::stateful_actor<http_state>;

std::string json_error(std::string_view message) {
  return dump(json{{"error", {{"message", message}}}});
}

std::string failure_body(std::string_view message) {
  return dump(json{{"success", false}, {"message", message}});
}

void reply(http_actor* self, http_reply r) {
  auto& s = self->state;
  if (s.done)
    return;
  s.done = true;
  s.out->with([&](http_outbound& o) { o.post_reply(std::move(r)); });
  self->quit();
}

void event(http_actor* self, std::string data) {
  auto& s = self->state;
  s.events_sent = true;
  auto p = std::make_shared<const std::string>(std::move(data));
  s.out->with([&](http_outbound& o) { o.post_event(std::move(p)); });
}

// SGLang's /generate stream: each event holds the whole result so far. A chunk carries its new
// tokens and text; everything else in it (counts, versions, finish reason, and any field added
// later) is already the state so far, so the latest chunk is taken whole and only the
// per-token parts are joined.
void accumulate(GenerateReqOutput& acc, const GenerateReqOutput& c) {
  GenerateReqOutput before = std::move(acc);
  acc = c;
  acc.text = before.text + c.text;
  auto join = [](auto& into, const auto& head, const auto& tail) {
    into = head;
    into.insert(into.end(), tail.begin(), tail.end());
  };
  join(acc.output_ids, before.output_ids, c.output_ids);
  join(acc.output_token_logprobs, before.output_token_logprobs, c.output_token_logprobs);
  join(acc.output_top_logprobs, before.output_top_logprobs, c.output_top_logprobs);
}

// The reply of a route in SGLang's HTTP shape (docs/sglang-contract.md, 'Routes and auth levels').
http_reply shape_reply(std::string_view route, bool ok, const json& body) {
  http_reply r;
  r.status = ok ? 200 : 400;
  if (!ok) {
    r.body = failure_body(body.value("message", std::string("failed")));
    return r;
  }
  if (route == "flush_cache") {
    r.content_type = "text/plain; charset=utf-8";
    r.body = "Cache flushed.\n" + body.value("message", std::string()) + "\n";
  } else if (route == "pause_generation" || route == "continue_generation") {
    r.body = dump(json{{"message", body.value("message", std::string())}, {"status", "ok"}});
  } else if (route == "get_weights_by_name") {
    r.body = dump(body.value("parameter", json::array()));
  } else {
    r.body = dump(body);
  }
  return r;
}

void start_route(http_actor* self, http_call call) {
  auto& s = self->state;
  const codec_entry* c = call.codec;
  bool is_generate = c->route == "generate";
  auto bad = [&](std::string_view message) {
    s.st->stats.protocol_error(to_string(error_code::bad_request));
    s.st->stats.request_done("http", c->route, request_result::error, 0);
    reply(self, http_reply{400, "application/json",
                           is_generate ? json_error(message) : failure_body(message), false});
  };
  if (is_generate && call.body.size() > s.st->max_generate_bytes) {
    s.st->stats.protocol_error(to_string(error_code::too_large));
    s.st->stats.request_done("http", c->route, request_result::error, 0);
    return reply(self, http_reply{413, "application/json",
                                  json_error(fmt::format("a generate request of {} bytes is larger than "
                                                         "any this model can serve ({} bytes for its "
                                                         "context length); it was not read",
                                                         call.body.size(), s.st->max_generate_bytes)),
                                  false});
  }
  auto body = http_request_body(*c, call.body, call.query, s.st->max_input_ids);
  if (!body)
    return bad(body.error());
  auto msg = c->decode(*body);
  if (!msg)
    return bad(msg.error());
  if (auto refused = before_send(*s.st, s.info, *msg, 0)) {
    s.st->stats.protocol_error(to_string(refused->code));
    s.st->stats.request_done("http", c->route, request_result::error, 0);
    return reply(self, http_reply{refused->code == error_code::too_large ? 413u : 400u,
                                  "application/json", failure_body(refused->message), false});
  }
  if (is_generate) {
    auto req = std::move(msg->get_mutable_as<GenerateReqInput>(0));
    if (!req.rid)
      req.rid = random_rid();
    s.info.rid = *req.rid;
    s.stream = req.stream;
    caf::actor sink = s.stream ? caf::actor_cast<caf::actor>(self) : caf::actor{};
    s.sent = true;
    self->request(s.st->front, caf::infinite, std::move(req), sink)
      .then(
        [self](GenerateReqOutput& out) {
          auto& s = self->state;
          note_generate(*s.st, out);
          after_reply(*s.st, s.info, "http", true, out.success, 0);
          if (s.stream && s.events_sent)
            return reply(self, http_reply{200, "", "", true});
          if (!out.success)
            return reply(self, http_reply{400, "application/json", json_error(out.message), false});
          if (s.stream) { // nothing streamed (cannot happen: the last chunk always comes)
            event(self, dump(to_json(out)));
            return reply(self, http_reply{200, "", "", true});
          }
          reply(self, http_reply{200, "application/json", dump(to_json(out)), false});
        },
        [self](caf::error& err) {
          auto& s = self->state;
          after_reply(*s.st, s.info, "http", false, false, 0);
          auto m = "the engine did not answer: " + self->system().render(err);
          if (s.stream && s.events_sent) {
            event(self, json_error(m));
            return reply(self, http_reply{200, "", "", true});
          }
          reply(self, http_reply{503, "application/json", json_error(m), false});
        });
    return;
  }
  s.sent = true;
  c->ask(self, caf::actor_cast<caf::actor>(s.st->front), std::move(*msg), [self, c](expected<json> j) {
    auto& s = self->state;
    if (!j) {
      after_reply(*s.st, s.info, "http", false, false, 0);
      return reply(self, http_reply{503, "application/json", failure_body(j.error()), false});
    }
    bool ok = success_of(*j);
    after_reply(*s.st, s.info, "http", true, ok, 0, session_open_of(*j));
    reply(self, shape_reply(c->route, ok, *j));
  });
}

void start_info(http_actor* self, http_call::kind_t kind) {
  auto& s = self->state;
  self->request(s.st->front, std::chrono::seconds(5), GetServerInfoReqInput{})
    .then(
      [self, kind](GetServerInfoReqOutput& info) {
        auto& s = self->state;
        if (kind == http_call::metrics) {
          s.st->stats.request_done("http", "metrics", request_result::ok, seconds_since(s.info.t0));
          return reply(self, http_reply{200, "text/plain; version=0.0.4; charset=utf-8",
                                        s.st->stats.render(&info), false});
        }
        s.st->stats.request_done("http", kind == http_call::model_info ? "model_info" : "get_server_info",
                                 info.success ? request_result::ok : request_result::failed,
                                 seconds_since(s.info.t0));
        if (kind == http_call::server_info)
          return reply(self, http_reply{info.success ? 200u : 400u, "application/json",
                                        dump(to_json(info)), false});
        json j = {{"model_path", info.model_path},
                  {"tokenizer_path", info.model_path},
                  {"is_generation", true},
                  {"weight_version", info.weight_version},
                  {"draft_model_path", info.draft_model_path.empty() ? json(nullptr) : json(info.draft_model_path)},
                  {"architecture", info.architecture},
                  {"device", info.device},
                  {"vocab_size", info.vocab_size},
                  {"max_context_length", info.max_context_length}};
        reply(self, http_reply{200, "application/json", dump(j), false});
      },
      [self, kind](caf::error& err) {
        auto& s = self->state;
        if (kind == http_call::metrics)
          return reply(self, http_reply{200, "text/plain; version=0.0.4; charset=utf-8",
                                        s.st->stats.render(nullptr), false});
        reply(self, http_reply{503, "application/json",
                               failure_body("the engine did not answer: " + self->system().render(err)),
                               false});
      });
}

void start_health(http_actor* self, bool generate) {
  auto& s = self->state;
  auto st = s.st;
  if (!generate) {
    self->request(st->front, std::chrono::seconds(10), HealthCheckReqInput{})
      .then(
        [self](HealthCheckReqOutput& out) {
          reply(self, http_reply{out.success ? 200u : 503u, "text/plain; charset=utf-8",
                                 out.success ? "" : out.message + "\n", false});
        },
        [self](caf::error&) {
          reply(self, http_reply{503, "text/plain; charset=utf-8", "the engine does not answer\n", false});
        });
    return;
  }
  // SGLang's /health_generate: a one-token generation must come back in time.
  GenerateReqInput probe;
  probe.rid = "health-" + random_rid();
  probe.input_ids = std::vector<int32_t>{0};
  probe.sampling_params.max_new_tokens = 1;
  probe.sampling_params.temperature = 0.0f;
  s.info.rid = *probe.rid;
  auto rid = *probe.rid;
  self->request(st->front, std::chrono::seconds(20), std::move(probe), caf::actor{})
    .then(
      [self](GenerateReqOutput& out) {
        reply(self, http_reply{out.success ? 200u : 503u, "text/plain; charset=utf-8",
                               out.success ? "" : out.message + "\n", false});
      },
      [self, st, rid](caf::error&) {
        self->send(st->front, cancel_atom_v, rid, std::string("aborted: health probe timed out"));
        reply(self, http_reply{503, "text/plain; charset=utf-8",
                               "a one-token generation did not finish in 20 s\n", false});
      });
}

caf::behavior http_call_actor(http_actor* self, std::shared_ptr<shared_state> st,
                              std::shared_ptr<link<http_outbound>> out, http_call call,
                              uint64_t registry_id) {
  auto& s = self->state;
  s.st = st;
  s.out = std::move(out);
  self->attach_functor([st, registry_id] { st->remove_actor(registry_id); });
  // A front door that dies holding this call would never answer it (CAF 0.17 drops the
  // promises of a dead actor): the client hears 503 instead of waiting forever.
  self->monitor(st->front);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.done)
      return;
    auto m = "the engine's front door stopped (" + self->system().render(dm.reason) +
             "); the server cannot serve until it is restarted";
    if (s.sent)
      after_reply(*s.st, s.info, "http", false, false, 0);
    if (s.stream && s.events_sent) {
      event(self, json_error(m));
      return reply(self, http_reply{200, "", "", true});
    }
    reply(self, http_reply{503, "application/json",
                           s.info.route == "generate" ? json_error(m) : failure_body(m), false});
  });
  // This runs inside spawn, on the session's I/O thread: an exception here would end the server.
  guarded(
    [&] {
      switch (call.kind) {
        case http_call::route:
          s.info.codec = call.codec;
          s.info.route = std::string(call.codec->route);
          start_route(self, std::move(call));
          break;
        case http_call::metrics:
        case http_call::model_info:
        case http_call::server_info: start_info(self, call.kind); break;
        case http_call::health: start_health(self, false); break;
        case http_call::health_generate: start_health(self, true); break;
        case http_call::openai_models:
        case http_call::openai_completions:
        case http_call::openai_chat: break; // spawn_http_call gives these to spawn_openai_call
      }
    },
    [&](const std::string& what) {
      log_error("HTTP " + s.info.route + ": handling the request failed: " + what);
      reply(self, http_reply{500, "application/json",
                             failure_body("the server failed handling this request: " + what), false});
    });
  return {
    [self](GenerateReqOutput& chunk) {
      auto& s = self->state;
      if (s.done || !s.stream)
        return;
      if (!chunk.success && !s.events_sent)
        return; // refused at once: the reply answers with 400
      accumulate(s.acc, chunk);
      s.st->stats.stream_chunk();
      event(self, dump(to_json(s.acc)));
    },
    [self](http_cancel_msg&) {
      auto& s = self->state;
      if (s.done)
        return;
      if (!s.info.rid.empty()) {
        self->send(s.st->front, cancel_atom_v, s.info.rid, std::string("aborted: the client disconnected"));
        s.st->stats.disconnect_cleanup("abort_request");
      }
    },
  };
}

} // namespace

caf::actor spawn_http_call(std::shared_ptr<shared_state> st,
                           std::shared_ptr<link<http_outbound>> out, http_call call) {
  if (call.kind == http_call::openai_models || call.kind == http_call::openai_completions ||
      call.kind == http_call::openai_chat)
    return spawn_openai_call(std::move(st), std::move(out), std::move(call));
  auto id = st->reserve_actor();
  auto a = st->sys.spawn(http_call_actor, st, std::move(out), std::move(call), id);
  st->set_actor(id, a);
  return a;
}

void deliver_cancel(const caf::actor& call) { caf::anon_send(call, http_cancel_msg{}); }

} // namespace rlserve::net::detail
