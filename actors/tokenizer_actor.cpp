#include "actors/tokenizer_actor.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <type_traits>
#include <unordered_map>

#include <fmt/format.h>

#include "actors/guard.hpp"
#include "actors/policy/update_gate.hpp"
#include "actors/watch.hpp"
#include "caf/all.hpp"
#include "messages/registration_check.hpp"
#include "messages/enums.hpp"
#include "messages/validate.hpp"
#include "model/bpe_tokenizer.hpp"

namespace rlserve {

// A large text prompt on its way to a tokenizing thread and its token ids on the way back
// (local only: they never leave the process).
struct tokenize_job {
  std::shared_ptr<std::string> text;
};
struct tokenize_result {
  std::vector<int32_t> ids;
};

} // namespace rlserve

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::tokenize_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::tokenize_result)

namespace rlserve {

// CAF 0.17 does not check type IDs: a message type missing from messages/type_ids.hpp would
// work here and fail across processes.
static_assert(interface_registered<tokenizer_actor>::value, "a message type of tokenizer_actor is not in type_ids.hpp");

namespace {

using policy::gate_op;

struct active_request {
  // What the caller is answered with: the chunks so far folded (append_chunk), with their text.
  // A request that does not stream gets one chunk, the scheduler's whole record, moved here.
  GenerateReqOutput result;
  caf::actor_addr owner;    // who sent the GenerateReqInput: only it may cancel
  caf::actor sink;
  bool stream = false;
  bool output_through_sink_only = false; // the sink keeps the output: fold the metadata only
  bool no_stop_trim = false;
  bool texts_in_logprobs = false; // return_text_in_logprobs (with return_logprob)
  caf::typed_response_promise<GenerateReqOutput> promise;
  std::optional<model::incremental_decoder> decoder;
  // Ended here (its detokenizing failed) while the scheduler still runs it: the caller has its
  // answer, and the entry stays until the scheduler's last chunk so that the rid stays taken
  // (a new request under it would otherwise receive this one's remaining chunks).
  bool answered = false;
};

struct queued_generate {
  uint64_t ticket;
  TokenizedGenerateReqInput req;
  caf::actor_addr owner;
  caf::actor sink;
  caf::typed_response_promise<GenerateReqOutput> promise;
  bool output_through_sink_only = false; // GenerateReqInput's: the front door's alone
};

struct tokenizer_state {
  // Not an aggregate: under C++20, CAF 0.17's stateful_actor would otherwise try to build the
  // state from the actor pointer (parenthesized aggregate init makes is_constructible true).
  tokenizer_state() = default;

  scheduler_actor scheduler;
  std::shared_ptr<const model::bpe_tokenizer> tokenizer;
  front_door_info info;
  policy::update_gate gate;
  uint64_t next_ticket = 1;
  std::unordered_map<uint64_t, std::function<void()>> starters; // ticket -> start it
  // Continue calls whose resume has not run yet, by ticket. Each is answered exactly once:
  // when generation resumes, when a session opens before that (then the resume is deferred to
  // the session's end and the caller is told so, never left waiting on a session), or when a
  // later pause cancels it.
  struct pending_resume {
    caf::typed_response_promise<ContinueGenerationReqOutput> promise;
    bool answered = false;
    void answer(ContinueGenerationReqOutput out) {
      if (!answered)
        promise.deliver(std::move(out));
      answered = true;
    }
  };
  std::unordered_map<uint64_t, std::shared_ptr<pending_resume>> pending_resumes;
  // A request is in exactly one of `tokenizing`, `queued` and `active`, under its rid, from the
  // moment it is accepted until it ends: together they are the rids in flight (rid_in_flight).
  std::unordered_map<std::string, queued_generate> queued;      // rid -> waiting at the gate
  std::unordered_map<std::string, active_request> active;       // rid -> running
  std::vector<caf::typed_response_promise<PauseGenerationReqOutput>> pause_abort_waiters;
  std::string pause_mode_name;
  std::mt19937_64 rng{std::random_device{}()};
  std::string scheduler_gone; // why, once the scheduler has died: every request fails at once
  // Text prompts being tokenized on a thread of their own, by rid: a cancel or abort that comes
  // meanwhile marks them, and they end as aborted when their tokens come back.
  struct tokenizing_request {
    caf::actor_addr owner;
    std::optional<std::string> aborted; // why, once aborted
  };
  std::unordered_map<std::string, tokenizing_request> tokenizing;
  pending_requests waits;     // requests to the scheduler: failed when it dies holding them
  static inline const char* name = "tokenizer";
};

using tokenizer_pointer = tokenizer_actor::stateful_pointer<tokenizer_state>;

// Whether a request under `rid` is in flight: being tokenized, waiting at the gate or running.
bool rid_in_flight(const tokenizer_state& st, const std::string& rid) {
  return st.tokenizing.count(rid) || st.queued.count(rid) || st.active.count(rid);
}

GenerateReqOutput failed_output(std::string rid, std::string message) {
  GenerateReqOutput out;
  out.success = false;
  out.rid = std::move(rid);
  out.message = std::move(message);
  out.finished = true;
  out.finish_reason = FinishReason{"abort", std::nullopt, std::nullopt, out.message};
  return out;
}

// Asks the scheduler on the caller's behalf: its reply, or an error when it fails to answer.
template <class Out, class In>
caf::result<Out> ask_scheduler(tokenizer_pointer self, In req) {
  auto rp = self->make_response_promise<Out>();
  self->state.waits.request<Out>(
    self, self->state.scheduler, std::move(req),
    [rp](Out& out) mutable { rp.deliver(std::move(out)); },
    [rp](const std::string& why) mutable {
      Out out;
      out.success = false;
      out.message = "the scheduler failed: " + why;
      rp.deliver(std::move(out));
    });
  return rp;
}

ContinueGenerationReqOutput deferred_continue() {
  return {true, "a weight-update session is open: generation continues when end_weight_update "
                "closes it"};
}

// A session opened while continue calls were waiting: their resume now waits for the session's
// end, and their callers are answered now (a trainer must not wait on its own session).
void defer_pending_resumes(tokenizer_pointer self) {
  for (auto& [ticket, pending] : self->state.pending_resumes)
    pending->answer(deferred_continue());
}

void pump(tokenizer_pointer self) {
  auto& st = self->state;
  for (auto& s : st.gate.ready()) {
    auto it = st.starters.find(s.id);
    if (it == st.starters.end())
      continue;
    auto start = std::move(it->second);
    st.starters.erase(it);
    start();
  }
}

void check_pause_abort(tokenizer_pointer self) {
  auto& st = self->state;
  if (st.gate.running_generates() != 0 || st.pause_abort_waiters.empty())
    return;
  for (auto& rp : st.pause_abort_waiters)
    rp.deliver(PauseGenerationReqOutput{true, st.pause_mode_name == "drain"
                                                ? "generation paused; running requests finished"
                                                : "generation paused; running requests aborted"});
  st.pause_abort_waiters.clear();
}

// Text prompts of at least this many bytes are tokenized on a thread of their own: a 100 MB
// prompt takes seconds to tokenize, and the front door must answer /health, aborts and other
// requests meanwhile. Smaller ones are tokenized here (a thread per request would cost more).
constexpr std::size_t k_offload_tokenize_bytes = 64 * 1024;

// What can be said about a request before it is tokenized.
status check_request(const tokenizer_state& st, const GenerateReqInput& req) {
  if (auto ok = validate(req); !ok)
    return std::move(ok).take_failure();
  const auto& p = req.sampling_params;
  if (p.n != 1)
    return fail("sampling_params.n: " + std::to_string(p.n) +
                " samples in one message: the HTTP /generate route fans n > 1 out into one "
                "request per sample; over the websocket and in process, send one request per "
                "sample (each with its own sampling_seed)");
  if (req.return_text_in_logprobs && !st.tokenizer)
    return fail("return_text_in_logprobs: this model has no tokenizer.json to give token texts "
                "with");
  if (!p.stop.empty() && !st.tokenizer)
    return fail("sampling_params.stop: stop strings need a tokenizer, and this model has no "
                "tokenizer.json (use stop_token_ids)");
  if (req.text && !st.tokenizer)
    return fail("text: this model has no tokenizer.json; send input_ids instead");
  return {};
}

// The rest, once the prompt is token ids (`ids`: the tokenized text, or null for input_ids).
expected<TokenizedGenerateReqInput> finish_prepare(tokenizer_state& st, GenerateReqInput& req,
                                                   std::vector<int32_t>* ids) {
  TokenizedGenerateReqInput out;
  if (req.text) {
    out.input_text = std::move(*req.text);
    out.input_ids = std::move(*ids);
    if (out.input_ids.empty())
      return fail("text: the prompt is empty after tokenization");
  } else {
    out.input_ids = std::move(*req.input_ids);
  }
  for (std::size_t i = 0; i < out.input_ids.size(); ++i)
    if (out.input_ids[i] >= st.info.vocab_size)
      return fail(fmt::format("input_ids[{}]: token id {} is outside the vocabulary (size {})", i,
                              out.input_ids[i], st.info.vocab_size));
  if (static_cast<int64_t>(out.input_ids.size()) >= st.info.max_context_length)
    return fail(fmt::format("the prompt has {} tokens; the model's context length is {}",
                            out.input_ids.size(), st.info.max_context_length));
  if (req.return_logprob && req.logprob_start_len >= static_cast<int32_t>(out.input_ids.size()))
    return fail(fmt::format("logprob_start_len: {} is not a position of the prompt, which has {} "
                            "tokens (use 0 .. {}, or -1 for output logprobs only)",
                            req.logprob_start_len, out.input_ids.size(), out.input_ids.size() - 1));
  if (req.return_routed_experts &&
      (req.routed_experts_start_len < 0 ||
       req.routed_experts_start_len > static_cast<int32_t>(out.input_ids.size())))
    return fail(fmt::format("routed_experts_start_len: {} is outside the prompt's 0 .. {} tokens",
                            req.routed_experts_start_len, out.input_ids.size()));
  out.rid = assign_rid(req); // checked against the rids in flight when the request came
  out.sampling_params = std::move(req.sampling_params);
  out.sampling_seed = out.sampling_params.sampling_seed ? *out.sampling_params.sampling_seed : st.rng();
  out.return_logprob = req.return_logprob;
  out.logprob_start_len = req.logprob_start_len;
  out.top_logprobs_num = req.top_logprobs_num;
  out.return_text_in_logprobs = req.return_text_in_logprobs;
  out.return_routed_experts = req.return_routed_experts;
  out.routed_experts_start_len = req.routed_experts_start_len;
  out.stream = req.stream;
  return out;
}

// Tokenization here, on the front door's thread (the request passed check_request).
expected<TokenizedGenerateReqInput> prepare(tokenizer_state& st, GenerateReqInput& req) {
  std::vector<int32_t> ids;
  if (req.text)
    ids = st.tokenizer->encode(*req.text);
  return finish_prepare(st, req, &ids);
}

void start_generate(tokenizer_pointer self, const std::string& rid) {
  auto& st = self->state;
  auto q = st.queued.find(rid);
  if (q == st.queued.end())
    return;
  active_request a;
  a.owner = q->second.owner;
  a.sink = q->second.sink;
  a.stream = q->second.req.stream;
  a.output_through_sink_only = a.stream && a.sink && q->second.output_through_sink_only;
  a.no_stop_trim = q->second.req.sampling_params.no_stop_trim;
  a.texts_in_logprobs = q->second.req.return_logprob && q->second.req.return_text_in_logprobs &&
                        st.tokenizer != nullptr;
  a.promise = q->second.promise;
  if (st.tokenizer)
    a.decoder.emplace(*st.tokenizer, q->second.req.sampling_params.skip_special_tokens);
  auto req = std::move(q->second.req);
  st.queued.erase(q);
  st.active.emplace(rid, std::move(a));
  self->send(st.scheduler, std::move(req), caf::actor_cast<caf::actor>(self));
}

// return_text_in_logprobs: the text of every token a chunk's logprob entries name, each token
// decoded alone with special tokens kept (as SGLang writes them).
void add_token_texts(const model::bpe_tokenizer& tok, GenerateReqOutput& d) {
  auto text = [&](int32_t id) { return tok.decode(std::vector<int32_t>{id}, false); };
  for (auto id : d.output_ids)
    d.output_token_texts.push_back(text(id));
  for (auto id : d.input_token_ids)
    d.input_token_texts.push_back(text(id));
  for (auto* rows : {&d.output_top_logprobs, &d.input_top_logprobs})
    for (auto& row : *rows)
      for (auto& t : row)
        t.text = text(t.token_id);
}

void on_chunk(tokenizer_pointer self, GenerateReqOutput& c) {
  auto& st = self->state;
  auto it = st.active.find(c.rid);
  if (it == st.active.end())
    return;
  auto& a = it->second;
  if (a.answered) { // its caller has its answer: the chunks only say when the rid is free
    if (c.finished)
      st.active.erase(it);
    return;
  }
  // SGLang leaves a matched stop token out of the text (not out of output_ids) unless
  // no_stop_trim; tokens after a stop are dropped, so it is the last one.
  auto decoded = c.output_ids.size();
  if (c.finished && c.finish_reason && c.finish_reason->matched_token && !a.no_stop_trim &&
      decoded > 0 && c.output_ids.back() == *c.finish_reason->matched_token)
    --decoded;
  for (std::size_t i = 0; i < decoded; ++i)
    if (a.decoder)
      c.text += a.decoder->push(c.output_ids[i]);
  if (c.finished && a.decoder)
    c.text += a.decoder->finish();
  if (a.texts_in_logprobs)
    add_token_texts(*st.tokenizer, c);
  const bool finished = c.finished;
  if (a.stream && a.sink) {
    // The caller gets the delta (a copy: the result keeps the fold), with the version spans
    // so far, which the scheduler sends only when they change.
    if (c.weight_version_spans.empty())
      c.weight_version_spans = a.result.weight_version_spans;
    caf::anon_send(a.sink, c);
    if (a.output_through_sink_only)
      drop_output(c); // the sink keeps it: held once
  }
  append_chunk(a.result, std::move(c));
  auto& r = a.result;
  if (!finished)
    return;
  // SGLang ends the text before a matched stop string, or with no_stop_trim right after it
  // (text the last token carried past the match is dropped either way).
  if (r.finish_reason && r.finish_reason->matched_str)
    if (auto pos = r.text.find(*r.finish_reason->matched_str); pos != std::string::npos)
      r.text.resize(a.no_stop_trim ? pos + r.finish_reason->matched_str->size() : pos);
  a.promise.deliver(std::move(r));
  st.active.erase(it);
  st.gate.finished(gate_op::generate);
  check_pause_abort(self);
  pump(self);
}

// Ends the requests `req` names that still wait at the gate; returns how many.
int32_t abort_queued(tokenizer_pointer self, const AbortReq& req) {
  auto& st = self->state;
  int32_t here = 0;
  std::vector<std::string> rids;
  for (auto& [rid, q] : st.queued)
    if (req.abort_all || rid == req.rid)
      rids.push_back(rid);
  for (auto& rid : rids) {
    auto q = st.queued.find(rid);
    st.gate.cancel(q->second.ticket);
    st.starters.erase(q->second.ticket);
    GenerateReqOutput out;
    out.rid = rid;
    out.finished = true;
    out.finish_reason = FinishReason{"abort", std::nullopt, std::nullopt,
                                     req.abort_message.empty() ? "aborted by request"
                                                               : req.abort_message};
    out.sampling_seed = q->second.req.sampling_seed;
    out.prompt_tokens = static_cast<int32_t>(q->second.req.input_ids.size());
    if (q->second.sink)
      caf::anon_send(q->second.sink, out);
    q->second.promise.deliver(std::move(out));
    st.queued.erase(q);
    ++here;
  }
  return here;
}

// Queues a weight operation at the gate; when it may run it goes to the scheduler, and the
// gate hears its end (a session opens on a successful begin and closes on an end that says so).
template <class In, class Out>
auto locked_update(tokenizer_pointer self, gate_op op) {
  return [self, op](In& req) -> caf::result<Out> {
    auto& st = self->state;
    if (!st.scheduler_gone.empty()) {
      Out out;
      out.success = false;
      out.message = st.scheduler_gone;
      return out;
    }
    if constexpr (requires { req.abort_all_requests; }) {
      if (req.abort_all_requests)
        caf::anon_send(st.scheduler, AbortReq{"", true, "aborted: a weight update asked for it"});
    }
    auto rp = self->make_response_promise<Out>();
    auto ticket = st.next_ticket++;
    st.starters.emplace(ticket, [self, op, rp, req = std::move(req)]() mutable {
      self->state.waits.request<Out>(
        self, self->state.scheduler, std::move(req),
        [self, op, rp](Out& out) mutable {
          if constexpr (std::is_same_v<Out, EndWeightUpdateReqOutput>)
            self->state.gate.finished(op, out.success, out.session_open);
          else
            self->state.gate.finished(op, out.success);
          if (self->state.gate.session_open())
            defer_pending_resumes(self);
          rp.deliver(std::move(out));
          pump(self);
        },
        [self, op, rp](const std::string& why) mutable {
          self->state.gate.finished(op, false);
          Out out;
          out.success = false;
          out.message = "the scheduler failed: " + why;
          rp.deliver(std::move(out));
          pump(self);
        });
    });
    st.gate.submit(ticket, op);
    pump(self);
    return rp;
  };
}

// A weight operation that takes no lock: straight to the scheduler.
template <class In, class Out>
auto unlocked(tokenizer_pointer self) {
  return [self](In& req) -> caf::result<Out> {
    if constexpr (requires { req.abort_all_requests; }) {
      if (req.abort_all_requests)
        caf::anon_send(self->state.scheduler,
                   AbortReq{"", true, "aborted: a weight-version update asked for it"});
    }
    return ask_scheduler<Out>(self, std::move(req));
  };
}

// The handler of weight operation `Op`, by its role (messages/operations.hpp).
template <class Op>
auto weight_operation_handler(tokenizer_pointer self) {
  using In = typename Op::input;
  using Out = typename Op::output;
  if constexpr (Op::role == session_role::unordered) {
    return unlocked<In, Out>(self);
  } else {
    constexpr gate_op op = Op::role == session_role::session_begin    ? gate_op::session_begin
                           : Op::role == session_role::session_update ? gate_op::session_update
                           : Op::role == session_role::session_end    ? gate_op::session_end
                                                                      : gate_op::standalone;
    return locked_update<In, Out>(self, op);
  }
}

// A prepared request waits at the gate; `rp` is answered when it ends.
void admit(tokenizer_pointer self, TokenizedGenerateReqInput prepared, caf::actor_addr owner,
           caf::actor sink, caf::typed_response_promise<GenerateReqOutput> rp, bool output_through_sink_only) {
  auto& st = self->state;
  auto ticket = st.next_ticket++;
  auto rid = prepared.rid;
  st.queued.emplace(rid, queued_generate{ticket, std::move(prepared), std::move(owner),
                                         std::move(sink), rp, output_through_sink_only});
  st.starters.emplace(ticket, [self, rid] { start_generate(self, rid); });
  st.gate.submit(ticket, gate_op::generate);
  pump(self);
}

// Tokenizes `req`'s large text on a detached actor (a thread of its own), then prepares and
// admits it here. The caller is answered in every case: refused, aborted meanwhile, or run.
// `req` has its rid, which no request in flight holds: it stays taken (in `tokenizing`) until
// the request is admitted or answered.
caf::result<GenerateReqOutput> tokenize_elsewhere(tokenizer_pointer self, GenerateReqInput& req,
                                                  caf::actor sink) {
  auto& st = self->state;
  auto owner = caf::actor_cast<caf::actor_addr>(self->current_sender());
  auto rp = self->make_response_promise<GenerateReqOutput>();
  const std::string rid = *req.rid;
  st.tokenizing.emplace(rid, tokenizer_state::tokenizing_request{owner, {}});
  auto text = std::make_shared<std::string>(std::move(*req.text));
  // The tokenizer is a spawn argument, not only a capture: CAF 0.17 dereferences a null
  // argument tuple when a function-based actor is spawned without arguments.
  auto worker = self->spawn<caf::detached>(
    [](caf::event_based_actor* worker,
       std::shared_ptr<const model::bpe_tokenizer> tokenizer) -> caf::behavior {
      return {guard_handler("tokenizer thread", [worker, tokenizer](tokenize_job& j) {
        worker->quit();
        return tokenize_result{tokenizer->encode(*j.text)};
      })};
    },
    st.tokenizer);
  auto held = std::make_shared<GenerateReqInput>(std::move(req));
  // Only this request's end removes its entry, so it is still there (and still this request's).
  auto end = [self, rid, held, text, owner, sink, rp](expected<std::vector<int32_t>> ids) mutable {
    auto& st = self->state;
    auto it = st.tokenizing.find(rid);
    auto aborted = it->second.aborted;
    st.tokenizing.erase(it); // the rid goes from here to `queued` within this message, or is free
    auto refuse = [&](std::string why) {
      auto out = failed_output(rid, std::move(why));
      if (sink)
        caf::anon_send(sink, out);
      rp.deliver(std::move(out));
    };
    if (aborted)
      return refuse(*aborted);
    if (!st.scheduler_gone.empty())
      return refuse(st.scheduler_gone);
    if (!ids)
      return refuse("text: tokenizing the prompt failed: " + ids.error());
    held->text = std::move(*text);
    auto prepared = finish_prepare(st, *held, &*ids);
    if (!prepared)
      return refuse(prepared.error());
    admit(self, std::move(*prepared), owner, sink, rp, held->output_through_sink_only);
  };
  // The handlers hold the worker: nothing else does, and CAF would destroy it unrun.
  self->request(worker, caf::infinite, tokenize_job{text})
    .then([end, worker](tokenize_result& r) mutable {
            guarded([&] { end(std::move(r.ids)); },
                    [&](const std::string& why) { end(fail("tokenizing failed: " + why)); });
          },
          [self, end, worker](caf::error& e) mutable { end(fail(self->system().render(e))); });
  return rp;
}

// Marks the requests being tokenized that `matches` (rid, request) names as aborted with `why`;
// how many.
template <class Matches>
int32_t abort_tokenizing(tokenizer_state& st, Matches matches, const std::string& why) {
  int32_t n = 0;
  for (auto& [rid, t] : st.tokenizing)
    if (!t.aborted && matches(rid, t)) {
      t.aborted = why;
      ++n;
    }
  return n;
}

tokenizer_actor::behavior_type front_door(tokenizer_pointer self, scheduler_actor scheduler,
                                          std::shared_ptr<const model::bpe_tokenizer> tokenizer,
                                          front_door_info info) {
  auto& st = self->state;
  st.scheduler = std::move(scheduler);
  st.tokenizer = std::move(tokenizer);
  st.info = std::move(info);
  // A dead scheduler answers nobody: requests waiting on it here would wait forever. Answer them
  // all with an error, and every later one at once.
  self->monitor(st.scheduler);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.scheduler.address() || !st.scheduler_gone.empty())
      return;
    st.scheduler_gone = "the engine's scheduler stopped (" + self->system().render(dm.reason) +
                        "); the engine cannot serve until it is restarted";
    const auto why = st.scheduler_gone;
    // Each gives its hold on the gate back, or a weight operation would wait for it forever.
    for (auto& [rid, a] : st.active) {
      if (a.answered)
        continue;
      auto out = failed_output(rid, why);
      if (a.sink)
        caf::anon_send(a.sink, out);
      a.promise.deliver(std::move(out));
      st.gate.finished(gate_op::generate);
    }
    st.active.clear();
    for (auto& [rid, q] : st.queued) {
      auto out = failed_output(rid, why);
      if (q.sink)
        caf::anon_send(q.sink, out);
      q.promise.deliver(std::move(out));
      st.gate.cancel(q.ticket);
      st.starters.erase(q.ticket);
    }
    st.queued.clear();
    for (auto& rp : st.pause_abort_waiters)
      rp.deliver(PauseGenerationReqOutput{false, why});
    st.pause_abort_waiters.clear();
    // Requests the scheduler had taken: their callers hear why now.
    st.waits.peer_down(dm.source, why);
    // Weight operations and resumes waiting at the gate: started now, their request to the dead
    // scheduler fails at once and answers their caller with the error.
    auto starters = std::move(st.starters);
    st.starters.clear();
    for (auto& [ticket, start] : starters)
      start();
  });
  return wrapped_with_weight_operations<tokenizer_actor::behavior_type>(
    [](auto handler) { return guard_handler(tokenizer_state::name, std::move(handler)); },
    [self]<class Op>() { return weight_operation_handler<Op>(self); },
    [self](GenerateReqInput& req, caf::actor& sink) -> caf::result<GenerateReqOutput> {
      auto& st = self->state;
      auto refuse = [&](std::string why) {
        auto out = failed_output(req.rid.value_or(""), std::move(why));
        if (sink)
          caf::anon_send(sink, out); // a streaming caller always gets a last chunk
        return out;
      };
      if (!st.scheduler_gone.empty())
        return refuse(st.scheduler_gone);
      if (auto ok = check_request(st, req); !ok)
        return refuse(ok.error());
      // The rid is taken from here until the request ends, its tokenizing included: a second
      // request under it meanwhile would take the rid's chunks, cancels and aborts.
      // In-process callers may leave the rid to the engine; this is where they get one.
      if (const auto& rid = assign_rid(req); rid_in_flight(st, rid))
        return refuse(rid_in_flight_message(rid));
      if (req.text && req.text->size() >= k_offload_tokenize_bytes)
        return tokenize_elsewhere(self, req, std::move(sink));
      auto prepared = prepare(st, req);
      if (!prepared)
        return refuse(prepared.error());
      // Before make_response_promise, which takes the sender out of the current message.
      auto owner = caf::actor_cast<caf::actor_addr>(self->current_sender());
      auto rp = self->make_response_promise<GenerateReqOutput>();
      admit(self, std::move(*prepared), std::move(owner), std::move(sink), rp, req.output_through_sink_only);
      return rp;
    },
    [self](TokenChunks& batch) {
      for (auto& c : batch.chunks)
        // No reply to carry an error: a request whose chunk cannot be handled (detokenizing
        // throws) ends here with the error, and the scheduler stops running it.
        guarded([&] { on_chunk(self, c); },
                [&](const std::string& what) {
                  auto& st = self->state;
                  auto it = st.active.find(c.rid);
                  if (it == st.active.end() || it->second.answered)
                    return;
                  auto why = "the tokenizer failed handling this request: " + what;
                  auto out = failed_output(c.rid, why);
                  if (it->second.sink)
                    caf::anon_send(it->second.sink, out);
                  it->second.promise.deliver(std::move(out));
                  st.gate.finished(gate_op::generate);
                  if (c.finished) {
                    st.active.erase(it);
                  } else { // the rid stays taken until the scheduler's last chunk
                    it->second.answered = true;
                    caf::anon_send(st.scheduler, AbortReq{c.rid, false, why});
                  }
                  check_pause_abort(self);
                  pump(self);
                });
    },
    [self](cancel_atom, std::string& rid, std::string& why) {
      auto& st = self->state;
      auto sender = caf::actor_cast<caf::actor_addr>(self->current_sender());
      if (abort_tokenizing(
            st, [&](const auto& r, const auto& t) { return r == rid && t.owner == sender; }, why) > 0)
        return;
      if (auto q = st.queued.find(rid); q != st.queued.end()) {
        if (q->second.owner == sender)
          abort_queued(self, AbortReq{rid, false, why});
        return;
      }
      auto a = st.active.find(rid);
      if (a == st.active.end() || a->second.owner != sender)
        return;
      caf::anon_send(st.scheduler, AbortReq{rid, false, why});
    },
    [self](AbortReq& req) -> caf::result<AbortReqOutput> {
      auto& st = self->state;
      if (req.rid.empty() && !req.abort_all) // SGLang's no-op (every request has a rid)
        return AbortReqOutput{true, "nothing to abort: neither rid nor abort_all was given", 0};
      // Requests being tokenized or waiting at the gate end here; running ones in the scheduler.
      int32_t here = abort_tokenizing(
        st, [&](const auto& rid, const auto&) { return req.abort_all || rid == req.rid; },
        req.abort_message.empty() ? std::string("aborted by request") : req.abort_message);
      here += abort_queued(self, req);
      if (!req.abort_all && here == 1)
        return AbortReqOutput{true, "1 request aborted", 1};
      auto rp = self->make_response_promise<AbortReqOutput>();
      st.waits.request<AbortReqOutput>(
        self, st.scheduler, req,
        [rp, here](AbortReqOutput& out) mutable {
          out.num_aborted += here;
          out.message = std::to_string(out.num_aborted) + " requests aborted";
          rp.deliver(std::move(out));
        },
        [rp](const std::string& why) mutable {
          rp.deliver(AbortReqOutput{false, "the scheduler failed: " + why, 0});
        });
      return rp;
    },
    [self](PauseGenerationReqInput& req) -> caf::result<PauseGenerationReqOutput> {
      auto& st = self->state;
      // The JSON codec only makes the three modes; an in-process caller can cast any byte.
      if (req.mode != pause_mode::abort && req.mode != pause_mode::retract &&
          req.mode != pause_mode::in_place && req.mode != pause_mode::drain)
        return PauseGenerationReqOutput{false, "mode: expected abort, retract, in_place or drain, got " +
                                                 to_string(req.mode)};
      for (auto ticket : st.gate.pause()) {
        // A continue that had not taken effect yet: this later pause wins.
        auto it = st.pending_resumes.find(ticket);
        if (it != st.pending_resumes.end()) {
          it->second->answer(ContinueGenerationReqOutput{
            false, "continue_generation was cancelled by a later pause_generation"});
          st.pending_resumes.erase(it);
        }
        st.starters.erase(ticket);
      }
      st.pause_mode_name = std::string(to_string(req.mode));
      if (req.mode == pause_mode::abort || req.mode == pause_mode::drain) {
        // SGLang handles abort mode in the front door: abort everything, then wait until no
        // request holds the lock. Requests arriving from now on wait for continue. Drain is the
        // same wait without the abort: the running requests finish on their own.
        auto rp = self->make_response_promise<PauseGenerationReqOutput>();
        st.pause_abort_waiters.push_back(rp);
        if (req.mode == pause_mode::abort)
          caf::anon_send(st.scheduler, AbortReq{"", true, "aborted: generation paused (mode abort)"});
        // The scheduler keeps running out what it holds, but holds updates for the continue.
        caf::anon_send(st.scheduler, PauseGenerationReqInput{pause_mode::abort});
        check_pause_abort(self);
        pump(self); // a writer waiting for the running requests may go now
        return rp;
      }
      auto rp = self->make_response_promise<PauseGenerationReqOutput>();
      st.waits.request<PauseGenerationReqOutput>(
        self, st.scheduler, req,
        [self, rp](PauseGenerationReqOutput& out) mutable {
          rp.deliver(std::move(out));
          pump(self);
        },
        [rp](const std::string& why) mutable {
          rp.deliver(PauseGenerationReqOutput{false, "the scheduler failed: " + why});
        });
      pump(self); // update operations waiting for the lock run under the pause now
      return rp;
    },
    [self](ContinueGenerationReqInput& req) -> caf::result<ContinueGenerationReqOutput> {
      auto& st = self->state;
      if (!st.gate.paused())
        return ContinueGenerationReqOutput{true, "generation was not paused"};
      auto pending = std::make_shared<tokenizer_state::pending_resume>();
      pending->promise = self->make_response_promise<ContinueGenerationReqOutput>();
      auto rp = pending->promise;
      auto ticket = st.next_ticket++;
      // Inside an open session the continue is deferred to the session's end and answered now;
      // otherwise it is answered when generation has resumed (or when a session opens first).
      if (st.gate.session_open())
        pending->answer(deferred_continue());
      else
        st.pending_resumes.emplace(ticket, pending);
      st.starters.emplace(ticket, [self, pending, req, ticket]() mutable {
        self->state.pending_resumes.erase(ticket);
        self->state.pause_mode_name.clear();
        self->state.waits.request<ContinueGenerationReqOutput>(
          self, self->state.scheduler, req,
          [pending](ContinueGenerationReqOutput& out) { pending->answer(std::move(out)); },
          [pending](const std::string& why) {
            pending->answer(ContinueGenerationReqOutput{false, "the scheduler failed: " + why});
          });
      });
      st.gate.submit(ticket, gate_op::resume);
      pump(self);
      return rp;
    },
    [self](FlushCacheReqInput& req) { return ask_scheduler<FlushCacheReqOutput>(self, req); },
    [self](ReleaseMemoryOccupationReqInput& req) {
      return ask_scheduler<ReleaseMemoryOccupationReqOutput>(self, req);
    },
    [self](ResumeMemoryOccupationReqInput& req) {
      return ask_scheduler<ResumeMemoryOccupationReqOutput>(self, req);
    },
    [self](GetServerInfoReqInput& req) -> caf::result<GetServerInfoReqOutput> {
      auto rp = self->make_response_promise<GetServerInfoReqOutput>();
      self->state.waits.request<GetServerInfoReqOutput>(
        self, self->state.scheduler, req,
        [self, rp](GetServerInfoReqOutput& out) mutable {
          auto& st = self->state;
          out.model_path = st.info.model_path;
          out.draft_model_path = st.info.draft_model_path;
          out.device = st.info.device;
          out.architecture = st.info.architecture;
          out.vocab_size = st.info.vocab_size;
          out.max_context_length = st.info.max_context_length;
          out.weight_transports = st.info.weight_transports;
          out.int4_modules = st.info.int4_modules;
          out.int4_update_recipe = st.info.int4_update_recipe;
          out.int4_quantized_on = st.info.int4_quantized_on;
          out.paused = st.gate.paused();
          out.pause_mode = st.pause_mode_name;
          out.weight_update_session_open = st.gate.session_open();
          out.waiting_requests += static_cast<int32_t>(st.gate.queued_generates());
          rp.deliver(std::move(out));
        },
        [rp](const std::string& why) mutable {
          GetServerInfoReqOutput out;
          out.success = false;
          out.message = "the scheduler failed: " + why;
          rp.deliver(std::move(out));
        });
      return rp;
    },
    [self](HealthCheckReqInput&) -> caf::result<HealthCheckReqOutput> {
      if (!self->state.scheduler_gone.empty())
        return HealthCheckReqOutput{false, self->state.scheduler_gone};
      auto rp = self->make_response_promise<HealthCheckReqOutput>();
      // A timed request, not a watched one: a scheduler that is alive but stuck is unhealthy too.
      self->request(self->state.scheduler, std::chrono::seconds(10), GetServerInfoReqInput{})
        .then([rp](GetServerInfoReqOutput& info) mutable {
                // The scheduler says when a part of the engine it needs has stopped.
                guarded([&] {
                          rp.deliver(info.success ? HealthCheckReqOutput{true, "ok"}
                                                  : HealthCheckReqOutput{false, info.message});
                        },
                        [&](const std::string& why) { rp.deliver(HealthCheckReqOutput{false, why}); });
              },
              [self, rp](caf::error& err) mutable {
                rp.deliver(HealthCheckReqOutput{
                  false, "the scheduler does not answer: " + self->system().render(err)});
              });
      return rp;
    });
}

} // namespace

tokenizer_actor spawn_tokenizer(caf::actor_system& sys, scheduler_actor scheduler,
                                std::shared_ptr<const model::bpe_tokenizer> tokenizer,
                                front_door_info info) {
  return sys.spawn(front_door, std::move(scheduler), std::move(tokenizer), std::move(info));
}

} // namespace rlserve
