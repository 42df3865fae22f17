// The websocket connection actor (see ws_connection_actor.hpp). Runs on CAF's worker threads;
// the only way back to the socket is link<ws_outbound>::with(post_...).
#include "net/ws_connection_actor.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "actors/guard.hpp"
#include "caf/all.hpp"
#include "messages/json_codec.hpp"
#include "net/log.hpp"
#include "net/request_accounting.hpp"

namespace rlserve::net::detail {

namespace {

// Local-only messages from the session: they never cross a process boundary.
struct ws_text_msg {
  shared_bytes frame;
};
struct ws_binary_msg {
  shared_bytes frame;
};
struct ws_closed_msg {};

} // namespace

} // namespace rlserve::net::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::net::detail::ws_text_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::net::detail::ws_binary_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::net::detail::ws_closed_msg)

namespace rlserve::net::detail {

namespace {

// ==== websocket connection actor ===============================================================

struct pending_req {
  json id;
  call_info info;
  std::size_t frame_bytes = 0; // a binary frame's size, consumed when the reply comes
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
  // Set with `closed`, readable after the actor is gone (release_if_ended_early).
  std::shared_ptr<std::atomic<bool>> closed_flag = std::make_shared<std::atomic<bool>>(false);
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

// A request whose handling threw (see actors/guard.hpp): the client hears it and the connection
// lives on. The id is unknown here (the request may not have been read that far).
void internal_error(ws_actor* self, const std::string& what) {
  log_error("websocket connection " + std::to_string(self->state.conn) +
            ": handling a frame failed: " + what);
  send_error(self, nullptr, "", error_code::internal_error,
             "the server failed handling this frame: " + what);
}

// The session may read on (net/ws_session.cpp, backpressure).
void consumed(ws_actor* self, std::size_t bytes) {
  auto& s = self->state;
  if (s.closed || !s.out || bytes == 0)
    return;
  s.out->with([&](ws_outbound& o) { o.post_consumed(bytes); });
}

void maybe_quit(ws_actor* self) {
  auto& s = self->state;
  if (s.closed && s.inflight.empty() && s.cleanups == 0)
    self->quit();
}

// A clean-up request was answered (or will never be: the front door is gone).
void done_cleanup(ws_actor* self) {
  if (self->state.cleanups > 0)
    --self->state.cleanups;
}

// What connection `conn`, now gone, held — the update session, the pause — given back by
// `self`'s requests (the connection's own actor, or a short-lived one when that actor ended
// first); `answered` runs once per request when its reply (or failure) comes. Returns how many.
int give_back_holdings(caf::event_based_actor* self, const std::shared_ptr<shared_state>& st, uint64_t conn,
                       std::function<void()> answered) {
  int sent = 0;
  if (st->owners.take_session_for_abort(conn)) {
    ++sent;
    st->stats.disconnect_cleanup("abort_session");
    log_warn(fmt::format("connection {} closed inside the weight-update session it opened; "
                         "aborting the session (the old weights keep serving)",
                         conn));
    EndWeightUpdateReqInput end;
    end.abort = true;
    end.requester = conn; // the session is this connection's: the engine takes its end only
    auto t0 = clock::now();
    self->request(st->front, caf::infinite, end)
      .then(
        [st, t0, conn, answered](EndWeightUpdateReqOutput& out) {
          if (auto length = st->owners.end_finished()) {
            st->stats.update_phase("session", *length);
            st->stats.update_session_ended("aborted");
          }
          st->stats.update_phase("end", seconds_since(t0));
          log_info(fmt::format("connection {}: session aborted: {}", conn, out.message));
          answered();
        },
        [self, st, answered](caf::error& err) {
          st->owners.end_finished();
          log_warn("aborting a session failed: " + self->system().render(err));
          answered();
        });
  }
  if (st->opts.resume_on_disconnect && st->owners.take_pause_for_resume(conn)) {
    ++sent;
    st->stats.disconnect_cleanup("continue_generation");
    log_warn(fmt::format("connection {} closed while generation was paused by it; continuing "
                         "generation",
                         conn));
    self->request(st->front, caf::infinite, ContinueGenerationReqInput{})
      .then([answered](ContinueGenerationReqOutput&) { answered(); },
            [answered](caf::error&) { answered(); });
  }
  return sent;
}

// A client that is gone may still hold the update session or the pause: give them back.
void release_holdings(ws_actor* self) {
  auto& s = self->state;
  s.cleanups += give_back_holdings(self, s.st, s.conn, [self] {
    done_cleanup(self);
    maybe_quit(self);
  });
}

// The short-lived actor of release_if_ended_early: gives back what connection `conn` held,
// then quits.
caf::behavior give_back_after_death(caf::event_based_actor* self, std::shared_ptr<shared_state> st,
                                    uint64_t conn) {
  auto left = std::make_shared<int>(0);
  *left = give_back_holdings(self, st, conn, [self, left] {
    if (--*left == 0)
      self->quit();
  });
  if (*left == 0)
    self->quit();
  return {[](caf::unit_t) {}}; // answers nothing else; it only waits for its replies
}

// The connection's actor ended while its client was connected (killed, or a bug that escaped
// its guards): the client is disconnected rather than left without answers, and what the
// connection held is given back by a short-lived actor, as at a disconnect.
void release_if_ended_early(ws_actor* self) {
  auto& s = self->state;
  self->attach_functor([st = s.st, out = s.out, conn = s.conn, closed = s.closed_flag,
                        sys = &self->system()](const caf::error& reason) {
    if (closed->load())
      return; // the client closed first: the actor gave everything back itself
    log_warn(fmt::format("connection {}: its actor stopped ({}); closing the connection",
                         conn, sys->render(reason)));
    if (out)
      out->with([&](ws_outbound& o) { o.post_close("the server's handler of this connection stopped"); });
    // Arguments, not captures: CAF 0.17 mishandles a function actor spawned without any.
    sys->spawn(give_back_after_death, st, conn);
  });
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
  if (p.frame_bytes)
    consumed(self, p.frame_bytes);
  if (!body) {
    after_reply(*s.st, p.info, "ws", false, false, s.conn);
    send_error(self, p.id, p.info.route, error_code::engine_error, body.error());
  } else {
    bool ok = success_of(*body);
    after_reply(*s.st, p.info, "ws", true, ok, s.conn, session_open_of(*body));
    send_out(self, reply_text(p.id, p.info.route, ok, *body));
  }
  if (s.closed)
    release_holdings(self);
  maybe_quit(self);
}

void local_cancel(ws_actor* self, const request_envelope& env) {
  auto& s = self->state;
  auto t0 = clock::now();
  if (authorize(s.st->opts.keys, route_auth::normal, s.tokens) != auth_result::ok)
    return send_error(self, env.id, env.type, error_code::unauthorized,
                      refusal_message(s.st->opts.keys, route_auth::normal));
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
    // By ownership, not by rid alone: the front door aborts it only because this connection
    // made it.
    self->send(s.st->front, cancel_atom_v, it->second.info.rid, std::string("aborted: cancelled by the client"));
    body = {{"success", true}, {"message", "generate request " + dump(*target) + " aborted"}};
  }
  s.st->stats.request_done("ws", "cancel", body["success"].get<bool>() ? request_result::ok : request_result::failed,
                           seconds_since(t0));
  send_out(self, reply_text(env.id, env.type, body["success"].get<bool>(), body));
}

void start_generate(ws_actor* self, const std::string& key, pending_req p, caf::message& msg) {
  auto& s = self->state;
  auto req = std::move(msg.get_mutable_as<GenerateReqInput>(0));
  const std::string rid = assign_rid(req);
  // This connection routes its chunks by rid, so a rid it has in flight itself is refused here
  // (bad_request); one in flight from anyone else is the front door's to refuse.
  if (s.rid_to_key.count(rid))
    return send_error(self, p.id, p.info.route, error_code::bad_request,
                      "rid: a request with rid \"" + rid + "\" is in flight on this connection");
  p.info.rid = rid;
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
  if (authorize(s.st->opts.keys, level, s.tokens) != auth_result::ok)
    return send_error(self, env.id, env.type, error_code::unauthorized,
                      refusal_message(s.st->opts.keys, level));
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
  if (auto refused = before_send(*s.st, p.info, *msg, s.conn, copied))
    return send_error(self, env.id, env.type, refused->code, refused->message);
  if (c->route == "generate")
    return start_generate(self, key, std::move(p), *msg);
  s.inflight.emplace(key, std::move(p));
  c->ask(self, caf::actor_cast<caf::actor>(s.st->front), std::move(*msg),
         [self, key](expected<json> reply) { on_reply(self, key, std::move(reply)); });
}

void on_text(ws_actor* self, const shared_bytes& frame) {
  auto t0 = clock::now();
  const auto limit = self->state.st->max_generate_bytes;
  if (frame.size > limit && peek_type(frame.text()) == "generate")
    return send_error(self, recover_ids(frame.text()).id, "generate", error_code::too_large,
                      fmt::format("a generate request of {} bytes is larger than any this model "
                                  "can serve ({} bytes for its context length); it was not read",
                                  frame.size, limit));
  auto j = parse_request_json(frame.text(), self->state.st->max_input_ids);
  if (!j) {
    // The reply answers the request whenever its id was read before the text went wrong: a
    // client waiting on that id would otherwise wait forever.
    auto ids = recover_ids(frame.text());
    return send_error(self, ids.id, ids.type, error_code::bad_json,
                      ids.id.is_null() ? j.error() + "; this reply carries no id: " + ids.why_no_id
                                       : j.error());
  }
  json id;
  auto env = read_envelope(*j, id);
  if (!env)
    return send_error(self, id, "", error_code::bad_request, env.error());
  dispatch(self, std::move(*env), t0, nullptr);
}

// Returns the in-flight key of the request the frame became, or empty when it was refused.
std::string on_binary(ws_actor* self, const shared_bytes& frame) {
  auto t0 = clock::now();
  json id;
  auto bin = read_binary_frame(frame, id);
  if (!bin) {
    send_error(self, id, "update_weights_from_tensor", error_code::bad_frame, bin.error());
    return {};
  }
  if (bin->envelope.type != "update_weights_from_tensor") {
    send_error(self, id, bin->envelope.type, error_code::bad_frame,
               "binary frames carry update_weights_from_tensor only; send \"" + bin->envelope.type +
                 "\" as a text frame");
    return {};
  }
  auto key = dump(bin->envelope.id);
  bool taken = self->state.inflight.count(key) > 0; // a duplicate id is refused, not this one's
  auto env = std::move(bin->envelope);
  dispatch(self, std::move(env), t0, &*bin);
  return taken ? std::string() : key;
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
  release_if_ended_early(self);
  // A front door that dies holding this connection's requests would never answer them (CAF 0.17
  // drops the promises of a dead actor): each gets an engine_error reply instead, and clean-ups
  // sent for a closed client are not waited for.
  self->monitor(st->front);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& s = self->state;
    auto why = "the engine's front door stopped (" + self->system().render(dm.reason) +
               "); the server cannot serve until it is restarted";
    std::vector<std::string> keys;
    for (auto& [key, p] : s.inflight)
      keys.push_back(key);
    for (auto& key : keys)
      on_reply(self, key, fail(why));
    s.cleanups = 0;
    maybe_quit(self);
  });
  return {
    [self](ws_text_msg& m) {
      if (self->state.closed)
        return;
      guarded([&] { on_text(self, m.frame); },
              [&](const std::string& what) { internal_error(self, what); });
      consumed(self, m.frame.size); // parsed: a text request holds no frame bytes
    },
    [self](ws_binary_msg& m) {
      if (self->state.closed)
        return;
      // The frame's bytes live on in the request's tensors until the engine answers it.
      std::string key;
      guarded([&] { key = on_binary(self, m.frame); },
              [&](const std::string& what) { internal_error(self, what); });
      auto it = key.empty() ? self->state.inflight.end() : self->state.inflight.find(key);
      if (it != self->state.inflight.end())
        it->second.frame_bytes = m.frame.size;
      else
        consumed(self, m.frame.size);
    },
    [self](ws_closed_msg&) {
      auto& s = self->state;
      if (s.closed)
        return;
      s.closed = true;
      *s.closed_flag = true;
      s.out.reset();
      for (auto& [key, p] : s.inflight)
        if (!p.info.rid.empty()) {
          self->send(s.st->front, cancel_atom_v, p.info.rid, std::string("aborted: the client disconnected"));
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

} // namespace rlserve::net::detail
