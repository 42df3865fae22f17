// The HTTP call actor (see http_call_actor.hpp). Runs on CAF's worker threads; the only way
// back to the socket is link<http_outbound>::with(post_...).
#include "net/http_call_actor.hpp"

#include <chrono>
#include <filesystem>
#include <ctime>
#include <optional>

#include <fmt/format.h>

#include "actors/guard.hpp"
#include "caf/all.hpp"
#include "messages/generate_fanout.hpp"
#include "messages/json_codec.hpp"
#include "net/fanout_requests.hpp"
#include "net/http_route.hpp"
#include "net/log.hpp"
#include "net/openai_call_actor.hpp"
#include "net/vllm_call_actor.hpp"
#include "net/request_accounting.hpp"

namespace rlserve::net::detail {

namespace {

struct http_state : call_state {
  http_state() = default;

  GenerateReqOutput acc; // SSE: everything so far (SGLang streams cumulative results)
  // A /generate body with several prompts or n > 1 (messages/generate_fanout.hpp): one engine
  // request per result, answered together as a list (streamed: events with their "index").
  std::optional<fanout_requests> fan;
  static inline const char* name = "http_call";
};

using http_actor = caf::stateful_actor<http_state>;

// Now in ISO 8601, UTC, to the microsecond (Python's datetime.isoformat, as SGLang writes it).
std::string utc_timestamp() {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now - secs).count();
  std::time_t t = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, micros);
}

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
  post_reply_once(s, std::move(r));
  self->quit();
}

void event(http_actor* self, std::string data) {
  post_event(self->state, std::move(data));
}

// The reply of a route in SGLang's HTTP shape (docs/sglang-contract.md, 'Routes and auth levels').
launch_args launch_of(const shared_state& st) {
  return {st.opts.host, st.port, st.opts.enable_memory_saver, st.opts.enable_return_routed_experts,
          st.opts.enable_deterministic_inference, st.model_name, st.opts.tool_call_parser,
          st.opts.reasoning_parser};
}

http_reply shape_reply(std::string_view route, bool ok, const json& body, const launch_args& launch) {
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
  } else if (route == "get_server_info") {
    // SGLang's /server_info: ServerArgs and scheduler_info beside rlserve's state.
    auto info = from_json<GetServerInfoReqOutput>(body);
    r.body = info ? dump(sglang_server_info(*info, launch)) : dump(body);
  } else {
    r.body = dump(body);
  }
  return r;
}

// The engine let the call down (it did not answer, or the front door stopped): 503, or an error
// event ending the stream once events went out.
void engine_failed(http_actor* self, const std::string& message) {
  auto& s = self->state;
  if (s.stream && s.events_sent) {
    event(self, json_error(message));
    return reply(self, http_reply{200, "", "", true});
  }
  reply(self, http_reply{503, "application/json",
                         s.info.route == "generate" ? json_error(message) : failure_body(message),
                         false});
}

// The last result of a fan-out is in: the list, or the first failure (the others were aborted).
void fanout_done(http_actor* self) {
  auto& s = self->state;
  const auto& f = *s.fan;
  after_reply(*s.st, s.info, "http", true, f.failure().empty(), 0);
  if (s.stream) {
    if (!f.failure().empty())
      event(self, json_error(f.failure()));
    return reply(self, http_reply{200, "", "", true});
  }
  if (!f.failure().empty())
    return reply(self, http_reply{400, "application/json", json_error(f.failure()), false});
  auto list = json::array();
  for (const auto& r : f.results())
    list.push_back(to_json(r));
  reply(self, http_reply{200, "application/json", dump(list), false});
}

// SGLang's batch / parallel-sampling /generate: every expanded request is decoded before any
// is sent, so a bad one sends nothing.
void start_fanout(http_actor* self, const codec_entry& c, std::vector<json> bodies) {
  auto& s = self->state;
  std::vector<GenerateReqInput> reqs;
  reqs.reserve(bodies.size());
  for (std::size_t j = 0; j < bodies.size(); ++j) {
    auto msg = c.decode(bodies[j]);
    if (!msg) {
      s.st->stats.protocol_error(to_string(error_code::bad_request));
      s.st->stats.request_done("http", c.route, request_result::error, 0);
      return reply(self, http_reply{400, "application/json",
                                    json_error(fmt::format("request {}: {}", j, msg.error())), false});
    }
    reqs.push_back(std::move(msg->get_mutable_as<GenerateReqInput>(0)));
  }
  s.stream = !reqs.empty() && reqs.front().stream;
  s.sent = true;
  s.fan.emplace(fanout_names{"request", "batch", true})
    .send(self, s.st, std::move(reqs), s.stream, [self] { fanout_done(self); });
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
                                                         "context length; a batch of prompts counts "
                                                         "whole: send fewer per request); it was not read",
                                                         call.body.size(), s.st->max_generate_bytes)),
                                  false});
  }
  auto body = http_request_body(*c, call.body, call.query, s.st->max_input_ids);
  if (!body)
    return bad(body.error());
  if (is_generate) {
    auto fan = expand_generate_request(*body);
    if (!fan)
      return bad(fan.error());
    if (!fan->single)
      return start_fanout(self, *c, std::move(fan->requests));
  }
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
    s.info.rid = assign_rid(req);
    s.stream = req.stream;
    req.output_through_sink_only = s.stream; // s.acc holds the output; the reply, the rest
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
          engine_failed(self, "the engine did not answer: " + self->system().render(err));
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
    reply(self, shape_reply(c->route, ok, *j, launch_of(*s.st)));
  });
}

void start_info(http_actor* self, http_call call) {
  auto& s = self->state;
  const auto kind = call.kind;
  loads_query loads;
  if (kind == http_call::loads) {
    auto q = parse_loads_query(call.query);
    if (!q) {
      s.st->stats.protocol_error(to_string(error_code::bad_request));
      s.st->stats.request_done("http", "v1/loads", request_result::error, seconds_since(s.info.t0));
      return reply(self, http_reply{400, "application/json", failure_body(q.error()), false});
    }
    loads = *q;
  }
  self->request(s.st->front, std::chrono::seconds(5), GetServerInfoReqInput{})
    .then(
      [self, kind, loads](GetServerInfoReqOutput& info) {
        auto& s = self->state;
        if (kind == http_call::metrics) {
          s.st->stats.request_done("http", "metrics", request_result::ok, seconds_since(s.info.t0));
          return reply(self, http_reply{200, "text/plain; version=0.0.4; charset=utf-8",
                                        s.st->stats.render(&info), false});
        }
        const char* name = kind == http_call::model_info       ? "model_info"
                           : kind == http_call::weight_version ? "get_weight_version"
                           : kind == http_call::loads          ? "v1/loads"
                           : kind == http_call::load           ? "get_load"
                                                               : "get_server_info";
        s.st->stats.request_done("http", name, info.success ? request_result::ok : request_result::failed,
                                 seconds_since(s.info.t0));
        switch (kind) {
          case http_call::model_info:
            return reply(self, http_reply{200, "application/json", dump(sglang_model_info(info)), false});
          case http_call::weight_version:
            return reply(self, http_reply{200, "application/json",
                                          dump(json{{"weight_version", info.weight_version}}), false});
          case http_call::loads:
            return reply(self, sglang_loads(info, loads, utc_timestamp()));
          case http_call::load:
            return reply(self, http_reply{200, "application/json", dump(sglang_legacy_load(info)), false});
          default:
            return reply(self, http_reply{info.success ? 200u : 400u, "application/json",
                                          dump(sglang_server_info(info, launch_of(*s.st))), false});
        }
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

// /start_profile, /stop_profile: answered here, after the key check (docs/protocol.md).
// SGLang answers both with a line of text; refusals are rlserve's {success, message}. A trace
// with num_steps is written by the scheduler's last step; /stop_profile ends one early.
void start_profile_call(http_actor* self, const http_call& call) {
  auto& s = self->state;
  const bool start = call.kind == http_call::start_profile;
  auto done = [&](bool ok, std::string text) {
    s.st->stats.request_done("http", start ? "start_profile" : "stop_profile",
                             ok ? request_result::ok : request_result::failed, seconds_since(s.info.t0));
    reply(self, ok ? http_reply{200, "text/plain; charset=utf-8", std::move(text), false}
                   : http_reply{400, "application/json", failure_body(text), false});
  };
  if (!s.st->profile)
    return done(false, "this server has no profiler");
  if (!start) {
    auto path = s.st->profile->stop();
    if (!path)
      return done(false, path.error());
    return done(true, "Stop profiling. The trace is " + *path + "\n");
  }
  auto req = parse_profile_request(call.body, call.query);
  if (!req)
    return done(false, req.error());
  profile_options o;
  o.output_dir = !req->output_dir.empty() ? std::filesystem::path(req->output_dir)
                                          : std::filesystem::temp_directory_path();
  o.num_steps = req->num_steps;
  o.file_prefix = req->file_prefix;
  auto dir = o.output_dir.string();
  if (auto ok = s.st->profile->start(std::move(o)); !ok)
    return done(false, ok.error());
  done(true, "Start profiling. The trace will be written to " + dir +
               (req->num_steps ? " after " + std::to_string(*req->num_steps) + " steps" : " at /stop_profile") +
               ".\n");
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
  answer_if_ended_early(self, s);
  watch_front_door(self, s, [self](const std::string& m) { engine_failed(self, m); });
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
        case http_call::weight_version:
        case http_call::loads:
        case http_call::load:
        case http_call::server_info: start_info(self, std::move(call)); break;
        case http_call::start_profile:
        case http_call::stop_profile: start_profile_call(self, call); break;
        case http_call::health: start_health(self, false); break;
        case http_call::health_generate: start_health(self, true); break;
        case http_call::openai_models:
        case http_call::openai_completions:
        case http_call::openai_chat:
        case http_call::vllm_route: break; // spawn_http_call gives these to their own actors
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
      if (s.fan) {
        // SGLang streams the whole result so far; a failure is answered by fanout_done.
        auto k = s.fan->fold(std::move(chunk));
        if (!k)
          return;
        s.st->stats.stream_chunk();
        auto j = to_json(s.fan->results()[*k]);
        j["index"] = *k;
        return event(self, dump(j));
      }
      if (!chunk.success && !s.events_sent)
        return; // refused at once: the reply answers with 400
      append_chunk(s.acc, std::move(chunk)); // SGLang streams the whole result so far
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
      if (s.fan) {
        s.fan->abort_all("aborted: the client disconnected");
        s.st->stats.disconnect_cleanup("abort_request");
      }
    },
  };
}

} // namespace

void post_reply_once(call_state& s, http_reply r) {
  if (s.progress->answered.exchange(true))
    return;
  s.out->with([&](http_outbound& o) { o.post_reply(std::move(r)); });
}

void post_event(call_state& s, std::string data) {
  s.events_sent = true;
  s.progress->streaming = true;
  auto p = std::make_shared<const std::string>(std::move(data));
  s.out->with([&](http_outbound& o) { o.post_event(std::move(p)); });
}

void answer_if_ended_early(caf::scheduled_actor* self, call_state& s) {
  self->attach_functor([progress = s.progress, out = s.out,
                        sys = &self->system()](const caf::error& reason) {
    if (progress->answered.exchange(true))
      return;
    const auto why = "the server's handler of this request stopped (" + sys->render(reason) +
                     ") before it answered; the request may or may not have run";
    log_warn(why);
    out->with([&](http_outbound& o) {
      if (progress->streaming) { // the status line went out already: end the stream with an error
        o.post_event(std::make_shared<const std::string>(json_error(why)));
        o.post_reply(http_reply{200, "", "", true});
      } else {
        o.post_reply(http_reply{500, "application/json", json_error(why), false});
      }
    });
  });
}

void watch_front_door(caf::scheduled_actor* self, call_state& s,
                      std::function<void(const std::string&)> fail) {
  self->monitor(s.st->front);
  self->set_down_handler([self, &s, fail = std::move(fail)](caf::down_msg& dm) {
    if (s.done)
      return;
    if (s.sent)
      after_reply(*s.st, s.info, "http", false, false, 0);
    fail("the engine's front door stopped (" + self->system().render(dm.reason) +
         "); the server cannot serve until it is restarted");
  });
}

caf::actor spawn_http_call(std::shared_ptr<shared_state> st,
                           std::shared_ptr<link<http_outbound>> out, http_call call) {
  if (call.kind == http_call::openai_models || call.kind == http_call::openai_completions ||
      call.kind == http_call::openai_chat)
    return spawn_openai_call(std::move(st), std::move(out), std::move(call));
  if (call.kind == http_call::vllm_route)
    return spawn_vllm_call(std::move(st), std::move(out), std::move(call));
  auto id = st->reserve_actor();
  auto a = st->sys.spawn(http_call_actor, st, std::move(out), std::move(call), id);
  st->set_actor(id, a);
  return a;
}

void deliver_cancel(const caf::actor& call) { caf::anon_send(call, http_cancel_msg{}); }

} // namespace rlserve::net::detail
