// The vLLM control call actor (see vllm_call_actor.hpp). Each route is a short chain of front
// door requests; a failure anywhere answers at once with what the engine said.
#include "net/vllm_call_actor.hpp"

#include "actors/guard.hpp"
#include "caf/all.hpp"
#include "messages/json_codec.hpp"
#include "net/log.hpp"

namespace rlserve::net::detail {

namespace {

struct vllm_state : call_state {
  vllm_control c;
  static inline const char* name = "vllm_call";
};

using vllm_actor = caf::stateful_actor<vllm_state>;

const char* route_name(vllm_control::op_t op) {
  switch (op) {
    case vllm_control::pause: return "pause";
    case vllm_control::resume: return "resume";
    case vllm_control::is_paused: return "is_paused";
    case vllm_control::abort_requests: return "abort_requests";
    case vllm_control::sleep: return "sleep";
    case vllm_control::wake_up: return "wake_up";
    case vllm_control::is_sleeping: return "is_sleeping";
    case vllm_control::reset_prefix_cache: return "reset_prefix_cache";
    case vllm_control::weight_info: return "weight_info";
  }
  return "vllm";
}

void reply(vllm_actor* self, unsigned status, std::string body) {
  auto& s = self->state;
  if (s.done)
    return;
  s.done = true;
  s.st->stats.request_done("http", route_name(s.c.op),
                           status < 300 ? request_result::ok : request_result::failed,
                           seconds_since(s.info.t0));
  // An empty body is vLLM's plain 200 of /sleep and /wake_up.
  post_reply_once(s, http_reply{status, "application/json", std::move(body), false});
  self->quit();
}

void ok_json(vllm_actor* self, const json& j) { reply(self, 200, dump(j)); }

// vLLM's /pause and /resume catch their own errors as {"error": "..."}: ValueError 400, the
// rest 500. Everything else propagates to FastAPI's handler (500 with vLLM's error object).
void failed(vllm_actor* self, unsigned status, const std::string& message) {
  auto op = self->state.c.op;
  if (op == vllm_control::pause)
    return reply(self, status, dump(json{{"error", "Failed to pause generation: " + message}}));
  if (op == vllm_control::resume)
    return reply(self, status, dump(json{{"error", "Failed to resume generation: " + message}}));
  reply(self, status, vllm_error_body(message, "", status,
                                      status >= 500 ? "InternalServerError" : "BadRequestError"));
}

// Asks the front door; `next` gets the reply, an engine that does not answer is a 500.
template <class In, class F>
void ask(vllm_actor* self, In msg, F next) {
  using Out = typename caf::detail::tl_head<typename caf::response_type<
    tokenizer_actor::signatures, In>::type>::type;
  self->state.sent = true;
  self->request(self->state.st->front, caf::infinite, std::move(msg))
    .then([self, next](Out& out) mutable { next(out); },
          [self](caf::error& err) {
            failed(self, 500, "the engine did not answer: " + self->system().render(err));
          });
}

// pause_generation in `mode`, then `next`. A pause over an existing one: the engine's gate is
// closed already, so wait (drain) would only wait for requests frozen by the earlier pause;
// vLLM's pause is idempotent, so it answers at once.
template <class F>
void pause_then(vllm_actor* self, pause_mode mode, F next) {
  ask(self, GetServerInfoReqInput{}, [self, mode, next](GetServerInfoReqOutput& info) mutable {
    if (info.paused && mode != pause_mode::abort)
      return next();
    ask(self, PauseGenerationReqInput{mode}, [self, next](PauseGenerationReqOutput& out) mutable {
      if (!out.success)
        return failed(self, 400, out.message);
      next();
    });
  });
}

void do_pause(vllm_actor* self) {
  const auto c = self->state.c;
  pause_then(self, c.mode, [self, c] {
    // clear_cache resets the prefix cache after the drain; under keep the frozen requests hold
    // their KV and rlserve does not preempt them, so keep leaves the cache (vLLM's docstring).
    if (!c.clear_cache || c.mode == pause_mode::in_place)
      return ok_json(self, {{"status", "paused"}});
    ask(self, FlushCacheReqInput{}, [self](FlushCacheReqOutput&) {
      ok_json(self, {{"status", "paused"}});
    });
  });
}

void do_resume(vllm_actor* self) {
  ask(self, ContinueGenerationReqInput{}, [self](ContinueGenerationReqOutput& out) {
    if (!out.success)
      return failed(self, 400, out.message);
    ok_json(self, {{"status", "resumed"}});
  });
}

void abort_next(vllm_actor* self, std::size_t i, int32_t total) {
  const auto& ids = self->state.c.request_ids;
  if (i == ids.size())
    return ok_json(self, {{"status", "aborted"}, {"aborted", total}});
  ask(self, AbortReq{ids[i], false, "aborted by /abort_requests"},
      [self, i, total](AbortReqOutput& out) { abort_next(self, i + 1, total + out.num_aborted); });
}

void do_abort(vllm_actor* self) {
  if (!self->state.c.request_ids.empty())
    return abort_next(self, 0, 0);
  ask(self, AbortReq{"", true, "aborted by /abort_requests"}, [self](AbortReqOutput& out) {
    ok_json(self, {{"status", "aborted"}, {"aborted", out.num_aborted}});
  });
}

// vLLM's sleep routes fail without --enable-sleep-mode: its engine asserts (a 500).
bool sleep_enabled(vllm_actor* self) {
  if (self->state.st->opts.enable_sleep_mode)
    return true;
  failed(self, 500, "Sleep mode is not enabled: start rlserve serve with --enable-sleep-mode");
  return false;
}

void do_sleep(vllm_actor* self) {
  if (!sleep_enabled(self))
    return;
  const auto c = self->state.c;
  // Tags win over the level; level 0 sleeps no tag (a pause only).
  std::vector<std::string> tags = c.tags;
  if (tags.empty() && c.level > 0)
    tags = {"weights", "kv_cache"};
  pause_then(self, c.mode, [self, tags] {
    auto& st = *self->state.st;
    if (tags.empty()) {
      std::lock_guard lock(st.vllm_mu);
      st.vllm_sleep_paused = true;
      return reply(self, 200, "");
    }
    ask(self, ReleaseMemoryOccupationReqInput{rlserve_memory_tags(tags)},
        [self, tags](ReleaseMemoryOccupationReqOutput& out) {
          if (!out.success)
            return failed(self, 400, out.message);
          auto& st = *self->state.st;
          std::lock_guard lock(st.vllm_mu);
          st.vllm_sleep_paused = true;
          st.vllm_asleep.insert(tags.begin(), tags.end());
          reply(self, 200, "");
        });
  });
}

void do_wake(vllm_actor* self) {
  if (!sleep_enabled(self))
    return;
  auto& st = *self->state.st;
  std::vector<std::string> waking; // asleep and named (none named: all)
  {
    std::lock_guard lock(st.vllm_mu);
    for (const auto& t : st.vllm_asleep)
      if (self->state.c.tags.empty() ||
          std::find(self->state.c.tags.begin(), self->state.c.tags.end(), t) != self->state.c.tags.end())
        waking.push_back(t);
  }
  // Generation goes on only once every tag is awake (vLLM's rule).
  auto then_continue = [self] {
    auto& st = *self->state.st;
    bool go = false;
    {
      std::lock_guard lock(st.vllm_mu);
      go = st.vllm_asleep.empty() && st.vllm_sleep_paused;
      if (go)
        st.vllm_sleep_paused = false;
    }
    if (!go)
      return reply(self, 200, "");
    ask(self, ContinueGenerationReqInput{}, [self](ContinueGenerationReqOutput& out) {
      if (!out.success)
        return failed(self, 400, out.message);
      reply(self, 200, "");
    });
  };
  if (waking.empty()) // waking a tag that is not asleep is a no-op
    return then_continue();
  ask(self, ResumeMemoryOccupationReqInput{rlserve_memory_tags(waking)},
      [self, waking, then_continue](ResumeMemoryOccupationReqOutput& out) mutable {
        if (!out.success)
          return failed(self, 400, out.message);
        {
          auto& st = *self->state.st;
          std::lock_guard lock(st.vllm_mu);
          for (const auto& t : waking)
            st.vllm_asleep.erase(t);
        }
        then_continue();
      });
}

void start(vllm_actor* self) {
  auto& s = self->state;
  switch (s.c.op) {
    case vllm_control::pause: return do_pause(self);
    case vllm_control::resume: return do_resume(self);
    case vllm_control::abort_requests: return do_abort(self);
    case vllm_control::sleep: return do_sleep(self);
    case vllm_control::wake_up: return do_wake(self);
    case vllm_control::is_sleeping: {
      std::lock_guard lock(s.st->vllm_mu);
      const bool asleep = !s.st->vllm_asleep.empty() || s.st->vllm_sleep_paused;
      return ok_json(self, {{"is_sleeping", asleep}});
    }
    case vllm_control::reset_prefix_cache:
      // Refused by the engine while requests hold KV: vLLM's {"success": false}.
      return ask(self, FlushCacheReqInput{}, [self](FlushCacheReqOutput& out) {
        ok_json(self, {{"success", out.success}});
      });
    case vllm_control::is_paused:
    case vllm_control::weight_info:
      return ask(self, GetServerInfoReqInput{}, [self](GetServerInfoReqOutput& info) {
        if (self->state.c.op == vllm_control::is_paused)
          return ok_json(self, {{"is_paused", info.paused}});
        ok_json(self, {{"weight_version", info.weight_version}});
      });
  }
}

caf::behavior vllm_call_actor(vllm_actor* self, std::shared_ptr<shared_state> st,
                              std::shared_ptr<link<http_outbound>> out, http_call call,
                              uint64_t registry_id) {
  auto& s = self->state;
  s.st = st;
  s.out = std::move(out);
  s.c = std::move(call.vllm);
  s.info.route = route_name(s.c.op);
  self->attach_functor([st, registry_id] { st->remove_actor(registry_id); });
  answer_if_ended_early(self, s);
  watch_front_door(self, s, [self](const std::string& m) { failed(self, 503, m); });
  guarded([&] { start(self); },
          [&](const std::string& what) {
            log_error("HTTP /" + s.info.route + ": handling the request failed: " + what);
            failed(self, 500, "the server failed handling this request: " + what);
          });
  return {[](http_cancel_msg&) {}}; // control calls run to their end
}

} // namespace

caf::actor spawn_vllm_call(std::shared_ptr<shared_state> st, std::shared_ptr<link<http_outbound>> out,
                           http_call call) {
  auto id = st->reserve_actor();
  auto a = st->sys.spawn(vllm_call_actor, st, std::move(out), std::move(call), id);
  st->set_actor(id, a);
  return a;
}

} // namespace rlserve::net::detail
