// The actors between the sessions and the front door (see bridge.hpp). Everything here runs on
// CAF's worker threads; the only way back to a socket is link<...>::with(post_...).
#include "net/bridge.hpp"

#include <chrono>
#include <optional>
#include <random>
#include <unordered_map>

#include <fmt/format.h>

#include "caf/all.hpp"
#include "messages/json_codec.hpp"
#include "net/log.hpp"

namespace rlserve::net::detail {

namespace {

struct ws_text_msg {
  shared_bytes frame;
};
struct ws_binary_msg {
  shared_bytes frame;
};
struct ws_closed_msg {};
struct http_cancel_msg {};

} // namespace

} // namespace rlserve::net::detail

// Local-only messages from the sessions to their actors: they never cross a process boundary.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::net::detail::ws_text_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::net::detail::ws_binary_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::net::detail::ws_closed_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::net::detail::http_cancel_msg)

namespace rlserve::net::detail {

// ---- shared_state's session and actor registries ---------------------------------------------

void shared_state::session_opened() {
  std::lock_guard<std::mutex> guard{sessions_mtx_};
  ++sessions_;
}

void shared_state::session_closed() {
  {
    std::lock_guard<std::mutex> guard{sessions_mtx_};
    --sessions_;
  }
  sessions_cv_.notify_all();
}

uint64_t shared_state::add_dropper(std::function<void()> drop) {
  std::lock_guard<std::mutex> guard{sessions_mtx_};
  auto id = next_dropper_++;
  droppers_.emplace(id, std::move(drop));
  return id;
}

void shared_state::remove_dropper(uint64_t id) {
  std::lock_guard<std::mutex> guard{sessions_mtx_};
  droppers_.erase(id);
}

std::size_t shared_state::drop_sessions(std::chrono::milliseconds timeout) {
  std::unordered_map<uint64_t, std::function<void()>> all;
  {
    std::lock_guard<std::mutex> guard{sessions_mtx_};
    all = droppers_;
  }
  for (auto& [id, drop] : all)
    drop();
  std::unique_lock<std::mutex> lock{sessions_mtx_};
  sessions_cv_.wait_for(lock, timeout, [this] { return sessions_ == 0; });
  return sessions_;
}

uint64_t shared_state::reserve_actor() {
  std::lock_guard<std::mutex> guard{actors_mtx_};
  auto id = next_actor_++;
  actors_.emplace(id, caf::actor{});
  return id;
}

void shared_state::set_actor(uint64_t id, caf::actor handle) {
  std::lock_guard<std::mutex> guard{actors_mtx_};
  if (auto it = actors_.find(id); it != actors_.end())
    it->second = std::move(handle);
}

void shared_state::remove_actor(uint64_t id) {
  caf::actor dropped;
  {
    std::lock_guard<std::mutex> guard{actors_mtx_};
    if (auto it = actors_.find(id); it != actors_.end()) {
      dropped = std::move(it->second);
      actors_.erase(it);
    }
  }
  actors_cv_.notify_all();
}

std::size_t shared_state::wait_for_actors(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock{actors_mtx_};
  actors_cv_.wait_for(lock, timeout, [this] { return actors_.empty(); });
  return actors_.size();
}

void shared_state::kill_actors() {
  std::unordered_map<uint64_t, caf::actor> left;
  {
    std::lock_guard<std::mutex> guard{actors_mtx_};
    left.swap(actors_);
  }
  for (auto& [id, a] : left)
    if (a)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

std::string random_rid() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}{:016x}", rng(), rng());
}

// A reply body's `success`, true when it has none (GenerateReqOutput has one; every mutating
// reply has one).
bool success_of(const json& body) {
  if (!body.is_object())
    return true;
  auto it = body.find("success");
  return it == body.end() || !it->is_boolean() || it->get<bool>();
}

// The update phase a route times in /metrics, or empty.
std::string_view phase_of(std::string_view route) {
  if (route == "begin_weight_update")
    return "begin";
  if (route == "update_weights_from_tensor" || route == "update_weights_from_distributed")
    return "update";
  if (route == "end_weight_update")
    return "end";
  if (route == "post_process_weights")
    return "post_process";
  if (route == "update_weights_from_disk")
    return "disk";
  return {};
}

struct refusal {
  error_code code;
  std::string message;
};

// One request on its way: what before_send learned, for after_reply.
struct call_info {
  const codec_entry* codec = nullptr;
  std::string route;
  clock::time_point t0 = clock::now();
  bool end_abort = false;
  std::string rid; // generate
};

// Limits and bookkeeping before a request goes to the front door. `copied`: tensors of a
// binary frame that had to be copied (metrics only).
std::optional<refusal> before_send(shared_state& st, call_info& info, caf::message& req,
                                   std::size_t copied = 0) {
  if (req.match_elements<UpdateWeightsFromTensorReqInput>()) {
    uint64_t bytes = 0;
    for (const auto& t : req.get_as<UpdateWeightsFromTensorReqInput>(0).named_tensors)
      bytes += t.tensor.nbytes;
    if (!st.owners.add_tensor_bytes(bytes, st.opts.max_session_tensor_bytes))
      return refusal{error_code::too_large,
                     fmt::format("this update carries {} tensor bytes, which would pass the limit of "
                                 "{} bytes per weight-update session (server option "
                                 "max_session_tensor_bytes)",
                                 bytes, st.opts.max_session_tensor_bytes)};
    st.stats.tensor_bytes(bytes, copied);
  } else if (req.match_elements<EndWeightUpdateReqInput>()) {
    info.end_abort = req.get_as<EndWeightUpdateReqInput>(0).abort;
    st.owners.end_sent();
  } else if (req.match_elements<ContinueGenerationReqInput>()) {
    st.owners.continue_sent();
  }
  return std::nullopt;
}

// Bookkeeping after a reply: ownership of sessions and pauses, metrics.
void after_reply(shared_state& st, const call_info& info, std::string_view transport, bool answered,
                 bool ok, uint64_t owner) {
  auto secs = seconds_since(info.t0);
  const auto& r = info.route;
  if (r == "begin_weight_update" && ok)
    st.owners.begin_succeeded(owner);
  else if (r == "end_weight_update") {
    if (auto length = st.owners.end_finished()) {
      st.stats.update_phase("session", *length);
      st.stats.update_session_ended(info.end_abort ? "aborted" : ok ? "committed" : "failed");
    }
  } else if (r == "pause_generation" && ok)
    st.owners.pause_succeeded(owner);
  if (auto phase = phase_of(r); !phase.empty() && answered)
    st.stats.update_phase(phase, secs);
  st.stats.request_done(transport, r,
                        !answered ? request_result::error
                        : ok      ? request_result::ok
                                  : request_result::failed,
                        secs);
}

void note_generate(shared_state& st, const GenerateReqOutput& out) {
  st.stats.generate_done(out.prompt_tokens, out.completion_tokens,
                         out.finish_reason ? std::string_view(out.finish_reason->type)
                                           : std::string_view(out.success ? "none" : "error"));
}

std::string routes_list() {
  std::string out;
  for (const auto& c : all_codecs()) {
    if (!out.empty())
      out += ", ";
    out += c.route;
  }
  return out + ", ping, cancel";
}

// ==== websocket connection actor ===============================================================

struct pending_req {
  json id;
  call_info info;
};

struct ws_state {
  // Not an aggregate (CAF 0.17 + C++20; docs/architecture.md).
  ws_state() = default;

  std::shared_ptr<shared_state> st;
  std::shared_ptr<link<ws_outbound>> out;
  uint64_t conn = 0;
  std::vector<std::string> tokens;
  std::unordered_map<std::string, pending_req> inflight;  // dump(id) -> request
  std::unordered_map<std::string, std::string> rid_to_key; // generate rid -> dump(id)
  int cleanups = 0;                                        // requests sent for a closed client
  bool closed = false;
  static inline const char* name = "ws_connection";
};

using ws_actor = caf::stateful_actor<ws_state>;

void send_out(ws_actor* self, std::string text) {
  auto& s = self->state;
  if (s.closed || !s.out)
    return;
  auto p = std::make_shared<const std::string>(std::move(text));
  s.out->with([&](ws_outbound& o) { o.post_text(std::move(p)); });
}

void send_error(ws_actor* self, const json& id, std::string_view type, error_code code,
                std::string_view message) {
  self->state.st->stats.protocol_error(to_string(code));
  send_out(self, error_text(id, type, code, message));
}

void maybe_quit(ws_actor* self) {
  auto& s = self->state;
  if (s.closed && s.inflight.empty() && s.cleanups == 0)
    self->quit();
}

// A client that is gone may still hold the update session or the pause: give them back.
void release_holdings(ws_actor* self) {
  auto& s = self->state;
  auto st = s.st;
  if (st->owners.take_session_for_abort(s.conn)) {
    ++s.cleanups;
    st->stats.disconnect_cleanup("abort_session");
    log_warn(fmt::format("connection {} closed inside the weight-update session it opened; "
                         "aborting the session (the old weights keep serving)",
                         s.conn));
    EndWeightUpdateReqInput end;
    end.abort = true;
    auto t0 = clock::now();
    self->request(st->front, caf::infinite, end)
      .then(
        [self, st, t0](EndWeightUpdateReqOutput& out) {
          if (auto length = st->owners.end_finished()) {
            st->stats.update_phase("session", *length);
            st->stats.update_session_ended("aborted");
          }
          st->stats.update_phase("end", seconds_since(t0));
          log_info(fmt::format("connection {}: session aborted: {}", self->state.conn, out.message));
          --self->state.cleanups;
          maybe_quit(self);
        },
        [self, st](caf::error& err) {
          st->owners.end_finished();
          log_warn("aborting a session failed: " + self->system().render(err));
          --self->state.cleanups;
          maybe_quit(self);
        });
  }
  if (st->opts.resume_on_disconnect && st->owners.take_pause_for_resume(s.conn)) {
    ++s.cleanups;
    st->stats.disconnect_cleanup("continue_generation");
    log_warn(fmt::format("connection {} closed while generation was paused by it; continuing "
                         "generation",
                         s.conn));
    self->request(st->front, caf::infinite, ContinueGenerationReqInput{})
      .then(
        [self](ContinueGenerationReqOutput&) {
          --self->state.cleanups;
          maybe_quit(self);
        },
        [self](caf::error&) {
          --self->state.cleanups;
          maybe_quit(self);
        });
  }
}

void on_reply(ws_actor* self, const std::string& key, expected<json> body) {
  auto& s = self->state;
  auto it = s.inflight.find(key);
  if (it == s.inflight.end())
    return;
  auto p = std::move(it->second);
  s.inflight.erase(it);
  if (!p.info.rid.empty())
    s.rid_to_key.erase(p.info.rid);
  if (!body) {
    after_reply(*s.st, p.info, "ws", false, false, s.conn);
    send_error(self, p.id, p.info.route, error_code::engine_error, body.error());
  } else {
    bool ok = success_of(*body);
    after_reply(*s.st, p.info, "ws", true, ok, s.conn);
    send_out(self, reply_text(p.id, p.info.route, ok, *body));
  }
  if (s.closed)
    release_holdings(self);
  maybe_quit(self);
}

void local_cancel(ws_actor* self, const request_envelope& env) {
  auto& s = self->state;
  auto t0 = clock::now();
  if (auto r = authorize(s.st->opts.keys, route_auth::normal, s.tokens); r != auth_result::ok)
    return send_error(self, env.id, env.type, error_code::unauthorized,
                      refusal_message(s.st->opts.keys, route_auth::normal, r));
  auto target = env.body.find("id");
  if (target == env.body.end() || !(target->is_string() || target->is_number_integer()))
    return send_error(self, env.id, env.type, error_code::bad_request,
                      "body.id: the id of a generate request of this connection to cancel");
  auto it = s.inflight.find(dump(*target));
  json body;
  if (it == s.inflight.end() || it->second.info.rid.empty()) {
    body = {{"success", false},
            {"message", "no generate request with id " + dump(*target) + " is in flight on this connection"}};
  } else {
    caf::anon_send(s.st->front, AbortReq{it->second.info.rid, false, "aborted: cancelled by the client"});
    body = {{"success", true}, {"message", "generate request " + dump(*target) + " aborted"}};
  }
  s.st->stats.request_done("ws", "cancel", body["success"].get<bool>() ? request_result::ok : request_result::failed,
                           seconds_since(t0));
  send_out(self, reply_text(env.id, env.type, body["success"].get<bool>(), body));
}

void start_generate(ws_actor* self, const std::string& key, pending_req p, caf::message& msg) {
  auto& s = self->state;
  auto req = std::move(msg.get_mutable_as<GenerateReqInput>(0));
  if (!req.rid)
    req.rid = random_rid();
  if (s.rid_to_key.count(*req.rid))
    return send_error(self, p.id, p.info.route, error_code::bad_request,
                      "rid: a request with rid \"" + *req.rid + "\" is in flight on this connection");
  p.info.rid = *req.rid;
  bool stream = req.stream;
  s.rid_to_key[p.info.rid] = key;
  s.inflight.emplace(key, std::move(p));
  caf::actor sink = stream ? caf::actor_cast<caf::actor>(self) : caf::actor{};
  self->request(s.st->front, caf::infinite, std::move(req), sink)
    .then(
      [self, key](GenerateReqOutput& out) {
        note_generate(*self->state.st, out);
        on_reply(self, key, to_json(out));
      },
      [self, key](caf::error& err) {
        on_reply(self, key, fail("the engine did not answer: " + self->system().render(err)));
      });
}

void dispatch(ws_actor* self, request_envelope env, clock::time_point t0, binary_request* bin) {
  auto& s = self->state;
  if (s.st->stopping)
    return send_error(self, env.id, env.type, error_code::shutting_down, "the server is stopping");
  if (env.type == "ping") {
    s.st->stats.request_done("ws", "ping", request_result::ok, seconds_since(t0));
    return send_out(self, reply_text(env.id, env.type, true, env.body));
  }
  if (env.type == "cancel")
    return local_cancel(self, env);
  const codec_entry* c = find_codec(env.type);
  if (!c)
    return send_error(self, env.id, env.type, error_code::unknown_type,
                      "no route \"" + env.type + "\" (routes: " + routes_list() + ")");
  auto level = to_route_auth(c->auth);
  if (auto r = authorize(s.st->opts.keys, level, s.tokens); r != auth_result::ok)
    return send_error(self, env.id, env.type,
                      r == auth_result::forbidden ? error_code::forbidden : error_code::unauthorized,
                      refusal_message(s.st->opts.keys, level, r));
  auto key = dump(env.id);
  if (s.inflight.count(key))
    return send_error(self, env.id, env.type, error_code::duplicate_id,
                      "a request with id " + key + " is still in flight on this connection");
  if (s.inflight.size() >= s.st->opts.max_inflight_per_connection)
    return send_error(self, env.id, env.type, error_code::too_many_requests,
                      fmt::format("{} requests are in flight on this connection (the limit); wait "
                                  "for replies before sending more",
                                  s.inflight.size()));
  auto msg = c->decode(env.body);
  if (!msg)
    return send_error(self, env.id, env.type, error_code::bad_request, msg.error());
  std::size_t copied = 0;
  if (bin) {
    auto& req = msg->get_mutable_as<UpdateWeightsFromTensorReqInput>(0);
    for (const auto& t : bin->tensors) {
      for (const auto& d : req.device_tensors)
        if (d.name == t.name)
          return send_error(self, env.id, env.type, error_code::bad_request,
                            "named_tensors: \"" + t.name + "\" is also in device_tensors");
    }
    for (auto& t : bin->tensors)
      req.named_tensors.push_back(std::move(t));
    copied = bin->copied_tensors;
  }
  pending_req p{env.id, call_info{c, std::string(c->route), t0, false, {}}};
  if (auto refused = before_send(*s.st, p.info, *msg, copied))
    return send_error(self, env.id, env.type, refused->code, refused->message);
  if (c->route == "generate")
    return start_generate(self, key, std::move(p), *msg);
  s.inflight.emplace(key, std::move(p));
  c->ask(self, caf::actor_cast<caf::actor>(s.st->front), std::move(*msg),
         [self, key](expected<json> reply) { on_reply(self, key, std::move(reply)); });
}

caf::behavior ws_connection(ws_actor* self, std::shared_ptr<shared_state> st,
                            std::shared_ptr<link<ws_outbound>> out, uint64_t conn,
                            std::vector<std::string> tokens, uint64_t registry_id) {
  auto& s = self->state;
  s.st = st;
  s.out = std::move(out);
  s.conn = conn;
  s.tokens = std::move(tokens);
  self->attach_functor([st, registry_id] { st->remove_actor(registry_id); });
  return {
    [self](ws_text_msg& m) {
      if (self->state.closed)
        return;
      auto t0 = clock::now();
      auto j = parse_json(m.frame.text());
      if (!j)
        return send_error(self, nullptr, "", error_code::bad_json, j.error());
      json id;
      auto env = read_envelope(*j, id);
      if (!env)
        return send_error(self, id, "", error_code::bad_request, env.error());
      dispatch(self, std::move(*env), t0, nullptr);
    },
    [self](ws_binary_msg& m) {
      if (self->state.closed)
        return;
      auto t0 = clock::now();
      json id;
      auto bin = read_binary_frame(m.frame, id);
      if (!bin)
        return send_error(self, id, "update_weights_from_tensor", error_code::bad_frame, bin.error());
      if (bin->envelope.type != "update_weights_from_tensor")
        return send_error(self, id, bin->envelope.type, error_code::bad_frame,
                          "binary frames carry update_weights_from_tensor only; send \"" +
                            bin->envelope.type + "\" as a text frame");
      auto env = std::move(bin->envelope);
      dispatch(self, std::move(env), t0, &*bin);
    },
    [self](ws_closed_msg&) {
      auto& s = self->state;
      if (s.closed)
        return;
      s.closed = true;
      s.out.reset();
      for (auto& [key, p] : s.inflight)
        if (!p.info.rid.empty()) {
          caf::anon_send(s.st->front, AbortReq{p.info.rid, false, "aborted: the client disconnected"});
          s.st->stats.disconnect_cleanup("abort_request");
        }
      release_holdings(self);
      maybe_quit(self);
    },
    [self](GenerateReqOutput& chunk) {
      auto& s = self->state;
      if (s.closed)
        return;
      auto r = s.rid_to_key.find(chunk.rid);
      if (r == s.rid_to_key.end())
        return;
      auto it = s.inflight.find(r->second);
      if (it == s.inflight.end())
        return;
      s.st->stats.stream_chunk();
      send_out(self, chunk_text(it->second.id, "generate", to_json(chunk)));
    },
  };
}

// ==== HTTP call actor ==========================================================================

struct http_state {
  http_state() = default;

  std::shared_ptr<shared_state> st;
  std::shared_ptr<link<http_outbound>> out;
  call_info info;
  bool stream = false;
  bool events_sent = false;
  bool done = false;
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

// The reply of a route in SGLang's HTTP shape (reference §2.2).
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
  json body = json::object();
  if (!call.body.empty()) {
    auto j = parse_json(call.body);
    if (!j)
      return bad(j.error());
    body = std::move(*j);
    if (body.is_null())
      body = json::object();
    if (!body.is_object())
      return bad("the request body must be a JSON object");
  }
  for (const auto& [k, v] : call.query) {
    auto name = (c->route == "flush_cache" && k == "timeout") ? std::string("timeout_s") : k;
    if (body.contains(name))
      continue;
    auto parsed = parse_json(v);
    body[name] = parsed ? *parsed : json(v);
  }
  auto msg = c->decode(body);
  if (!msg)
    return bad(msg.error());
  if (auto refused = before_send(*s.st, s.info, *msg)) {
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
  c->ask(self, caf::actor_cast<caf::actor>(s.st->front), std::move(*msg), [self, c](expected<json> j) {
    auto& s = self->state;
    if (!j) {
      after_reply(*s.st, s.info, "http", false, false, 0);
      return reply(self, http_reply{503, "application/json", failure_body(j.error()), false});
    }
    bool ok = success_of(*j);
    after_reply(*s.st, s.info, "http", true, ok, 0);
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
        caf::anon_send(st->front, AbortReq{rid, false, "aborted: health probe timed out"});
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
  }
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
        caf::anon_send(s.st->front, AbortReq{s.info.rid, false, "aborted: the client disconnected"});
        s.st->stats.disconnect_cleanup("abort_request");
      }
    },
  };
}

} // namespace

caf::actor spawn_ws_connection(std::shared_ptr<shared_state> st,
                               std::shared_ptr<link<ws_outbound>> out, uint64_t connection_id,
                               std::vector<std::string> tokens) {
  auto id = st->reserve_actor();
  auto a = st->sys.spawn(ws_connection, st, std::move(out), connection_id, std::move(tokens), id);
  st->set_actor(id, a);
  return a;
}

void deliver_text(const caf::actor& conn, shared_bytes text) {
  caf::anon_send(conn, ws_text_msg{std::move(text)});
}

void deliver_binary(const caf::actor& conn, shared_bytes frame) {
  caf::anon_send(conn, ws_binary_msg{std::move(frame)});
}

void deliver_closed(const caf::actor& conn) { caf::anon_send(conn, ws_closed_msg{}); }

caf::actor spawn_http_call(std::shared_ptr<shared_state> st,
                           std::shared_ptr<link<http_outbound>> out, http_call call) {
  auto id = st->reserve_actor();
  auto a = st->sys.spawn(http_call_actor, st, std::move(out), std::move(call), id);
  st->set_actor(id, a);
  return a;
}

void deliver_cancel(const caf::actor& call) { caf::anon_send(call, http_cancel_msg{}); }

} // namespace rlserve::net::detail
