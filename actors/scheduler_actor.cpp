#include "actors/scheduler_actor.hpp"

#include <algorithm>
#include <set>
#include <array>
#include <ctime>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "actors/guard.hpp"
#include "actors/policy/batch_planner.hpp"
#include "actors/policy/prefix_cache.hpp"
#include "actors/watch.hpp"
#include "caf/all.hpp"
#include "messages/validate.hpp"
#include "messages/registration_check.hpp"
#include "model/bpe_tokenizer.hpp"

namespace rlserve {

// CAF 0.17 does not check type IDs: a message type missing from messages/type_ids.hpp would
// work here and fail across processes.
static_assert(interface_registered<scheduler_actor>::value, "a message type of scheduler_actor is not in type_ids.hpp");

namespace {

struct request_state {
  TokenizedGenerateReqInput req;
  caf::actor sink;
  uint64_t seq_id = 0;
  std::vector<int32_t> blocks; // KV blocks it holds (the runner holds its KV iff non-empty or kv_tokens > 0)
  int64_t kv_tokens = 0;       // positions of prompt + outputs whose KV the runner holds
  int64_t prefill_left = 0;    // tokens to run before the next sample (0: decoding)
  bool on_runner = false;      // the runner has a sequence for it
  int64_t in_batch_tokens = 0; // > 0: part of the batch in flight, with that many tokens
  bool in_batch_samples = false;
  bool abort_requested = false;
  std::string abort_message;
  // Speculative decoding. The draft runner mirrors the target's block table for this request
  // (same block ids in a pool of the same size) and holds KV for the first draft_kv positions of
  // prompt + outputs; it catches up on the rest when it next proposes.
  bool on_draft = false;
  int64_t draft_kv = 0;
  std::size_t draft_blocks = 0; // how many of `blocks` the draft has been given
  bool draft_failed = false;    // the draft could not run it: plain decoding from now on
  int64_t in_batch_proposals = 0; // this step verifies that many proposals
  // Prompt logprobs (return_logprob): positions logprob_start .. prompt length - 2 each score the
  // prompt token after them, into out.input_token_logprobs (after the first prompt token's
  // entry, which has none). scored_upto is the next position to score (kept across retracts:
  // nothing is scored twice); in_batch_scored how many the batch in flight scores.
  int64_t logprob_start = 0;
  int64_t scored_upto = 0;
  int64_t in_batch_scored = 0;
  bool input_logprobs_sent = false;
  // Routing replay (return_routed_experts): the routing of every position run so far, rows of
  // routed_row ids (layers x top_k); a position run again (after a retract) takes its new row.
  // The last chunk takes the rows it reports (out.routed_experts) from here, moved.
  std::vector<int32_t> routed;
  std::size_t routed_row = 0;
  // Prefix cache: cached_path[i] is the cache node of its block i, pinned by it. Usually that
  // node holds blocks[i] itself (shared, never written by it); when another request cached the
  // same tokens first, the node holds that request's copy and blocks[i] stays its own (equal
  // KV). Blocks past the path are its own. Its full blocks join the cache as they fill while
  // `caching`: its KV is all of the cache's epoch kv_epoch (no weight change since it was
  // admitted). The draft marks the nodes whose KV its pool holds too (the first draft_marked).
  // copy_pin: the node its first own block copied a partly shared prefix from, pinned until
  // the batch that copied has run.
  std::vector<policy::prefix_cache::node*> cached_path;
  policy::prefix_cache::node* copy_pin = nullptr;
  uint64_t kv_epoch = 0;
  bool caching = false;
  std::size_t draft_marked = 0;
  int64_t computed_before = 0; // most positions it had KV for before a retract or preemption
  // The request's output, held here only: output_ids are every token it has generated (the
  // scheduler runs them, checks stops on them, prefills them again after a retract); the
  // other per-token lists (logprobs, top logprobs, prompt logprobs) hold what no chunk has
  // carried yet, which for a request that does not stream is all of it until its one chunk;
  // its rid, prompt count, seed, first version, cached tokens and speculation figures are the
  // state so far (the token count and newest version are read off the lists when a chunk is
  // built). The request's last chunk is this record itself, moved (last_chunk). The text is
  // the front door's to add.
  // Last in the struct: the fields every step reads above stay on few cache lines.
  GenerateReqOutput out;
  std::size_t streamed = 0;   // output tokens already sent in chunks
  std::size_t spans_sent = 0; // how many of out.weight_version_spans the front door has
};

int64_t prompt_length(const request_state& r) {
  return static_cast<int64_t>(r.req.input_ids.size());
}

int64_t sequence_length(const request_state& r) {
  return static_cast<int64_t>(r.req.input_ids.size() + r.out.output_ids.size());
}

// Token `i` of prompt + outputs.
int32_t token_at(const request_state& r, int64_t i) {
  auto prompt = static_cast<int64_t>(r.req.input_ids.size());
  return i < prompt ? r.req.input_ids[static_cast<std::size_t>(i)]
                    : r.out.output_ids[static_cast<std::size_t>(i - prompt)];
}

// Prompt + outputs as one span (a copy into `scratch` once there are outputs).
std::span<const int32_t> all_tokens(const request_state& r, std::vector<int32_t>& scratch) {
  if (r.out.output_ids.empty())
    return r.req.input_ids;
  scratch.assign(r.req.input_ids.begin(), r.req.input_ids.end());
  scratch.insert(scratch.end(), r.out.output_ids.begin(), r.out.output_ids.end());
  return scratch;
}

// How much of its prompt + outputs a request being admitted may take from the prefix cache: all
// but the last token (whose logits it samples from), and none of the prompt positions it still
// has to score. (Routing replay takes only blocks that kept the router's choices.)
int64_t cacheable_prefix(const request_state& r) {
  int64_t n = sequence_length(r) - 1;
  if (r.req.return_logprob)
    n = std::min(n, r.scored_upto);
  return std::max<int64_t>(n, 0);
}

// Adds the CPU time of the current thread between construction and destruction to `total_ns`:
// what the scheduler's own handlers cost, without the runner's forward and without the time a
// worker thread spends polling for work.
struct thread_cpu_meter {
  explicit thread_cpu_meter(uint64_t& total) : total_ns(total), start(now()) {}
  ~thread_cpu_meter() { total_ns += now() - start; }
  static uint64_t now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  }
  uint64_t& total_ns;
  uint64_t start;
};

struct scheduler_state {
  // Not an aggregate: under C++20, CAF 0.17's stateful_actor would otherwise try to build the
  // state from the actor pointer (parenthesized aggregate init makes is_constructible true).
  scheduler_state() = default;

  scheduler_options options;
  runner_actor target;
  runner_actor draft; // null without a draft model
  RunnerManifest manifest;
  weight_updater_actor updater;
  std::shared_ptr<const model::bpe_tokenizer> tokenizer;
  std::string version;
  uint64_t committed_updates = 0;
  // The target pool's blocks: the free ones and the prefix cache (its tree is used only when
  // options.prefix_cache is set).
  std::optional<policy::prefix_cache> blocks;
  std::vector<policy::prefix_cache::match> waiting_matches; // step()'s scratch, one per waiting view
  std::vector<int32_t> token_scratch;
  // Prefix-cache counters: prompt tokens looked up and found at admission, tokens prefilled.
  uint64_t prefix_query_tokens = 0;
  uint64_t prefix_hit_tokens = 0;
  uint64_t prefill_tokens = 0;

  std::unordered_map<std::string, request_state> requests; // by rid
  std::unordered_map<uint64_t, request_state*> by_seq; // into `requests` (node-stable)
  std::deque<request_state*> waiting;  // FCFS; preempted and retracted requests rejoin at the front
  std::vector<request_state*> running; // admission order
  uint64_t next_seq = 1;
  uint64_t next_step = 1;

  bool forward_in_flight = false;
  profiler::clock::time_point forward_sent; // when the batch in flight went out (profiles)
  std::vector<policy::running_view> running_views; // step()'s scratch
  std::vector<policy::waiting_view> waiting_views;
  // The batch in flight: the sequence at each of its positions, and how many of them (the first)
  // are work entries (the rest are plain decodes).
  std::vector<uint64_t> in_flight;
  std::size_t work_in_flight = 0;
  std::vector<uint64_t> decode_scratch; // step()'s: the plain decodes' sequences
  bool step_scheduled = false;
  bool paused = false;
  pause_mode mode = pause_mode::abort;
  // Paused in abort mode: the front door aborts and holds the requests, and batches of those
  // already here run out (paused stays false); updates outside begin/end still wait for
  // continue_generation, as in the other modes, so a bucket's weight_version is not published
  // before the last bucket has landed.
  bool updates_wait = false;
  // Control operations (weight ops, pause) run one at a time, only between batches.
  std::deque<std::function<void()>> control_queue;
  bool control_busy = false;
  struct pending_flush {
    caf::typed_response_promise<FlushCacheReqOutput> promise;
    caf::timestamp deadline;
  };
  std::vector<pending_flush> pending_flushes;
  // Chunks produced while handling one batch, sent as one TokenChunks message per sink.
  std::vector<std::pair<caf::actor, GenerateReqOutput>> outbox;
  // Acceptance: totals since start and tokens per verification of the most recent steps.
  uint64_t busy_ns = 0; // CPU time in step() and on_batch_done() (thread_cpu_meter)
  uint64_t spec_verify_steps = 0;
  uint64_t spec_accepted_tokens = 0;
  uint64_t spec_proposed_drafts = 0;
  std::deque<int32_t> spec_recent; // emitted tokens per verification, newest at the back
  static constexpr std::size_t spec_recent_window = 256;
  // Requests to the runners and the updater: failed when one dies holding them.
  pending_requests waits;
  // Why each part this scheduler needs has stopped (empty while it runs). Without the target
  // every request fails; without the draft decoding goes on unspeculated; without the updater
  // weight operations fail. Any of them makes the engine unhealthy: it needs a restart.
  std::string target_gone, draft_gone, updater_gone;
  // release_memory_occupation's tags now released: no batch runs and new requests are refused.
  std::set<std::string> memory_released;
  static inline const char* name = "scheduler";
};

using scheduler_pointer = scheduler_actor::stateful_pointer<scheduler_state>;

std::string released_tags(const scheduler_state& st) {
  std::string out;
  for (const auto& t : st.memory_released)
    out += (out.empty() ? "" : ", ") + t;
  return out;
}

void schedule_step(scheduler_pointer self) {
  auto& st = self->state;
  if (st.step_scheduled)
    return;
  st.step_scheduled = true;
  self->send(self, step_atom_v);
}

void run_controls(scheduler_pointer self);

// Called by a control operation when it is done: the next one runs, or batches resume.
void control_done(scheduler_pointer self) {
  self->state.control_busy = false;
  run_controls(self);
}

void run_controls(scheduler_pointer self) {
  auto& st = self->state;
  if (st.control_busy || st.forward_in_flight)
    return;
  if (st.control_queue.empty()) {
    schedule_step(self);
    return;
  }
  auto op = std::move(st.control_queue.front());
  st.control_queue.pop_front();
  st.control_busy = true;
  op();
}

void enqueue_control(scheduler_pointer self, std::function<void()> op) {
  self->state.control_queue.push_back(std::move(op));
  run_controls(self);
}

// Sends every chunk collected since the last flush, one TokenChunks message per sink (in the
// order sinks first appear). One pass: the front door is usually the only sink.
void flush_outbox(scheduler_pointer self) {
  auto& out = self->state.outbox;
  if (out.empty())
    return;
  std::vector<std::pair<caf::actor, TokenChunks>> per_sink;
  for (auto& sink_and_chunk : out) {
    // Not a structured binding: clang 14 (the fuzzing build) cannot capture one in a lambda.
    const caf::actor& sink = sink_and_chunk.first;
    auto it = std::find_if(per_sink.begin(), per_sink.end(),
                           [&](const auto& entry) { return entry.first == sink; });
    if (it == per_sink.end()) {
      per_sink.emplace_back(sink, TokenChunks{});
      it = std::prev(per_sink.end());
    }
    it->second.chunks.push_back(std::move(sink_and_chunk.second));
  }
  out.clear();
  for (auto& [sink, batch] : per_sink)
    caf::anon_send(sink, std::move(batch));
}

// The version the request's newest token was computed with (the serving one before any).
const std::string& newest_version(const scheduler_state& st, const request_state& r) {
  const auto& spans = r.out.weight_version_spans;
  return spans.empty() ? st.version : spans.back().weight_version;
}

// Whether the prompt logprobs go with the chunk being built, and if so their token ids, into the
// record: they travel once, with the first chunk after the last is scored (the prefill is done
// before anything is sampled), or with the last chunk when the request ends before.
bool prompt_logprobs_due(request_state& r, bool last) {
  if (!r.req.return_logprob || r.input_logprobs_sent ||
      !(last || r.scored_upto >= prompt_length(r) - 1))
    return false;
  r.input_logprobs_sent = true;
  auto first = r.req.input_ids.begin() + static_cast<std::ptrdiff_t>(r.logprob_start);
  r.out.input_token_ids.assign(first,
                               first + static_cast<std::ptrdiff_t>(r.out.input_token_logprobs.size()));
  return true;
}

// A streaming request's chunk after a step: the tokens new since its last chunk (copied: the
// record keeps every token, the scheduler runs them), their logprobs and, once, the prompt's
// (moved: from now on only the chunk holds them), and the state so far. Version spans travel
// when they changed; the front door keeps the last it got.
void stream_progress(scheduler_pointer self, request_state& r) {
  auto& st = self->state;
  if (!r.req.stream)
    return;
  // Every stream_interval tokens, as SGLang's (a multi-token verification step may pass the mark:
  // then the chunk carries what came since the last one). The last chunk goes at the end anyway.
  // Both are at least 1: the front door validates the request's, Engine::start the server's.
  const auto interval =
    static_cast<std::size_t>(r.req.sampling_params.stream_interval.value_or(st.options.stream_interval));
  if (r.out.output_ids.size() - r.streamed < interval)
    return;
  const bool prompt_logprobs = prompt_logprobs_due(r, false);
  auto& out = r.out;
  GenerateReqOutput c;
  c.rid = out.rid;
  c.output_ids.assign(out.output_ids.begin() + static_cast<std::ptrdiff_t>(r.streamed),
                      out.output_ids.end());
  r.streamed = out.output_ids.size();
  if (r.req.return_logprob) { // kept only when asked for
    c.output_token_logprobs = std::exchange(out.output_token_logprobs, {});
    c.output_top_logprobs = std::exchange(out.output_top_logprobs, {});
  }
  if (out.top_p_token_counts) { // each chunk the kept sets of its own tokens
    c.top_p_token_ids = std::exchange(out.top_p_token_ids, {});
    c.top_p_token_counts = std::exchange(*out.top_p_token_counts, {});
  }
  if (prompt_logprobs) {
    c.input_token_ids = std::exchange(out.input_token_ids, {});
    c.input_token_logprobs = std::exchange(out.input_token_logprobs, {});
    c.input_top_logprobs = std::exchange(out.input_top_logprobs, {});
  }
  if (out.weight_version_spans.size() != r.spans_sent) {
    c.weight_version_spans = out.weight_version_spans;
    r.spans_sent = out.weight_version_spans.size();
  }
  c.prompt_tokens = out.prompt_tokens;
  c.completion_tokens = static_cast<int32_t>(out.output_ids.size());
  c.cached_tokens = out.cached_tokens;
  c.weight_version_start = out.weight_version_start.empty() ? st.version : out.weight_version_start;
  c.weight_version = newest_version(st, r);
  c.sampling_seed = out.sampling_seed;
  c.spec_verify_ct = out.spec_verify_ct;
  c.spec_accepted_tokens = out.spec_accepted_tokens;
  c.spec_proposed_drafts = out.spec_proposed_drafts;
  st.outbox.emplace_back(r.sink, std::move(c));
}

// A request's last chunk: its record, moved, with the finish and, for routing replay, the rows
// of every position that ran but the last token (never run), from routed_experts_start_len on.
// `ran`: the positions whose KV it held (release_kv has forgotten them by now). A streaming
// request's earlier tokens went with its earlier chunks.
GenerateReqOutput last_chunk(const scheduler_state& st, request_state& r,
                             std::optional<FinishReason> finish, bool success, std::string message,
                             int64_t ran) {
  prompt_logprobs_due(r, true);
  auto& out = r.out;
  out.completion_tokens = static_cast<int32_t>(out.output_ids.size());
  out.weight_version = newest_version(st, r);
  if (r.req.return_routed_experts) {
    const auto row = static_cast<int64_t>(r.routed_row);
    auto rows = std::min<int64_t>(ran, sequence_length(r) - 1);
    const auto from = std::min<int64_t>(r.req.routed_experts_start_len, rows);
    rows = std::min<int64_t>(rows, static_cast<int64_t>(r.routed.size()) / std::max<int64_t>(row, 1));
    auto& ids = r.routed;
    ids.resize(static_cast<std::size_t>(std::max(rows, from) * row));
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(from * row));
    out.routed_experts = std::move(ids);
    out.routed_experts_start_len = static_cast<int32_t>(from);
  }
  if (out.weight_version_start.empty())
    out.weight_version_start = st.version;
  out.output_ids.erase(out.output_ids.begin(),
                       out.output_ids.begin() + static_cast<std::ptrdiff_t>(r.streamed));
  out.finished = true;
  out.finish_reason = std::move(finish);
  out.success = success;
  out.message = std::move(message);
  return std::move(out);
}

// Forgets the request's sequence on the draft runner; it starts afresh when it next proposes.
void release_draft(scheduler_pointer self, request_state& r) {
  if (r.on_draft)
    self->send(self->state.draft, ReleaseSequences{{r.seq_id}});
  r.on_draft = false;
  r.draft_kv = 0;
  r.draft_blocks = 0;
}

// Puts the request's newly filled blocks into the prefix cache (while its KV is all of the
// current weights), and marks those whose KV the draft's pool holds too.
void cache_full_blocks(scheduler_state& st, request_state& r) {
  auto& cache = *st.blocks;
  if (!r.caching || r.kv_epoch != cache.epoch())
    return;
  const auto bs = cache.block_size();
  auto& path = r.cached_path;
  // Positions whose token is known: a verification's accepted proposals are in the KV before
  // they join output_ids, and those after a stop never do.
  const auto known = std::min(r.kv_tokens, sequence_length(r));
  while (static_cast<int64_t>(path.size() + 1) * bs <= known && path.size() < r.blocks.size()) {
    const auto first = static_cast<int64_t>(path.size()) * bs;
    st.token_scratch.clear();
    for (int64_t i = first; i < first + bs; ++i)
      st.token_scratch.push_back(token_at(r, i));
    auto* parent = path.empty() ? nullptr : path.back();
    const auto index = path.size();
    auto* n = cache.insert(parent, st.token_scratch, r.blocks[index]);
    if (!n) { // another request cached these tokens first: r goes on along its node
      n = cache.child(parent, st.token_scratch);
      if (!n) {
        r.caching = false;
        break;
      }
      std::array<policy::prefix_cache::node*, 1> one{n};
      cache.pin(one);
    }
    // Routing replay: the block keeps the router's choices of its positions.
    const auto row = r.routed_row, rows = static_cast<std::size_t>(bs) * row;
    if (r.req.return_routed_experts && row > 0 && r.routed.size() >= (index + 1) * rows)
      policy::prefix_cache::set_routing(
        n, std::span<const int32_t>(r.routed).subspan(index * rows, rows));
    path.push_back(n);
  }
  // Only nodes holding r's own blocks: r's draft filled those in the draft's pool.
  if (r.on_draft && !r.draft_failed)
    while (r.draft_marked < path.size() &&
           static_cast<int64_t>(r.draft_marked + 1) * bs <= r.draft_kv &&
           policy::prefix_cache::block_of(path[r.draft_marked]) == r.blocks[r.draft_marked])
      policy::prefix_cache::set_draft_ready(path[r.draft_marked++]);
}

// The blocks only `r` holds: past its cache path, or its own copies of cached blocks.
template <class Visit>
void for_each_own_block(const request_state& r, Visit visit) {
  for (std::size_t i = 0; i < r.blocks.size(); ++i)
    if (i >= r.cached_path.size() || policy::prefix_cache::block_of(r.cached_path[i]) != r.blocks[i])
      visit(r.blocks[i]);
}

// The batch that copied `r`'s partly shared block has run: the source may go.
void drop_copy_pin(scheduler_state& st, request_state& r) {
  if (!r.copy_pin)
    return;
  std::array<policy::prefix_cache::node*, 1> one{r.copy_pin};
  st.blocks->unpin(one);
  r.copy_pin = nullptr;
}

// Gives a request's KV back: its full blocks to the prefix cache, the rest to the free list, its
// sequences on the runners.
void release_kv(scheduler_pointer self, request_state& r) {
  auto& st = self->state;
  if (r.on_runner)
    self->send(st.target, ReleaseSequences{{r.seq_id}});
  if (st.options.prefix_cache)
    cache_full_blocks(st, r);
  release_draft(self, r);
  drop_copy_pin(st, r);
  std::vector<int32_t> own;
  for_each_own_block(r, [&](int32_t b) { own.push_back(b); });
  st.blocks->unpin(r.cached_path);
  st.blocks->release(own);
  r.cached_path.clear();
  r.caching = false;
  r.draft_marked = 0;
  r.blocks.clear();
  r.computed_before = std::max(r.computed_before, r.kv_tokens);
  r.kv_tokens = 0;
  r.on_runner = false;
}

void check_flushes(scheduler_pointer self);

// Ends a request: last chunk to its sink, KV released, bookkeeping dropped.
void finish(scheduler_pointer self, const std::string& rid, std::optional<FinishReason> reason,
            bool success = true, std::string message = {}) {
  auto& st = self->state;
  auto it = st.requests.find(rid);
  if (it == st.requests.end())
    return;
  auto& r = it->second;
  const auto ran = r.kv_tokens; // release_kv forgets it
  release_kv(self, r);          // reads the record's tokens and routing: before they move
  st.outbox.emplace_back(r.sink, last_chunk(st, r, std::move(reason), success, std::move(message), ran));
  st.by_seq.erase(r.seq_id);
  st.running.erase(std::remove(st.running.begin(), st.running.end(), &r), st.running.end());
  st.waiting.erase(std::remove(st.waiting.begin(), st.waiting.end(), &r), st.waiting.end());
  st.requests.erase(it);
  if (!st.pending_flushes.empty() && st.running.empty())
    schedule_step(self); // a flush may be waiting for exactly this
}

FinishReason abort_reason(const request_state& r) {
  FinishReason f;
  f.type = "abort";
  f.message = r.abort_message.empty() ? "aborted" : r.abort_message;
  return f;
}

// Why `r` stops after its newest token, or nullopt to go on (SGLang's check order: EOS and stop
// tokens, length, then stop strings).
std::optional<FinishReason> stop_check(const scheduler_state& st, const request_state& r) {
  const auto& p = r.req.sampling_params;
  int32_t last = r.out.output_ids.back();
  auto out_len = static_cast<int64_t>(r.out.output_ids.size());
  if (out_len >= p.min_new_tokens) {
    bool eos = std::find(st.manifest.eos_token_ids.begin(), st.manifest.eos_token_ids.end(),
                         last) != st.manifest.eos_token_ids.end();
    bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) !=
                   p.stop_token_ids.end();
    if ((eos && !p.ignore_eos) || stop_id)
      return FinishReason{"stop", last, std::nullopt, {}};
  }
  if (out_len >= p.max_new_tokens)
    return FinishReason{"length", std::nullopt, std::nullopt, {}};
  if (static_cast<int64_t>(r.req.input_ids.size()) + out_len >= st.manifest.max_context_length)
    return FinishReason{"length", std::nullopt, std::nullopt,
                        "reached the model's context length (" +
                          std::to_string(st.manifest.max_context_length) + " tokens)"};
  if (!p.stop.empty() && st.tokenizer && out_len >= p.min_new_tokens) {
    auto text = st.tokenizer->decode(r.out.output_ids, p.skip_special_tokens);
    for (const auto& s : p.stop)
      if (!s.empty() && text.find(s) != std::string::npos)
        return FinishReason{"stop", std::nullopt, s, {}};
  }
  return std::nullopt;
}

// Takes a running request off the runner: its KV is freed and it goes back to the queue, keeping
// the tokens it has; when admitted again it prefills prompt + outputs (retract semantics).
void requeue(scheduler_pointer self, request_state& r) {
  auto& st = self->state;
  release_kv(self, r);
  r.prefill_left = 0;
  st.running.erase(std::remove(st.running.begin(), st.running.end(), &r), st.running.end());
}

void record_acceptance(scheduler_state& st, request_state& r, int32_t proposals, int32_t accepted) {
  ++r.out.spec_verify_ct;
  r.out.spec_accepted_tokens += accepted;
  r.out.spec_proposed_drafts += proposals;
  ++st.spec_verify_steps;
  st.spec_accepted_tokens += static_cast<uint64_t>(accepted);
  st.spec_proposed_drafts += static_cast<uint64_t>(proposals);
  st.spec_recent.push_back(accepted + 1);
  if (st.spec_recent.size() > scheduler_state::spec_recent_window)
    st.spec_recent.pop_front();
}

// What a work position's details add to its request: the routing of the positions it ran and
// its prompt logprobs. False (and the request ended, failed) when the runner returned another
// number of either than was asked for.
bool apply_scores(scheduler_pointer self, request_state& r, WorkResult& res) {
  // Routing replay: the rows of the positions this batch ran (from kv_tokens on; apply_result
  // advances kv_tokens after this).
  if (r.req.return_routed_experts && r.in_batch_tokens > 0 && r.in_batch_proposals == 0 &&
      !res.routed_experts.empty()) {
    auto ran = static_cast<std::size_t>(r.in_batch_tokens);
    if (res.routed_experts.size() % ran != 0 ||
        (r.routed_row != 0 && res.routed_experts.size() / ran != r.routed_row)) {
      auto m = "internal error: the runner returned " + std::to_string(res.routed_experts.size()) +
               " routed expert ids for " + std::to_string(ran) + " positions";
      finish(self, std::string(r.req.rid), FinishReason{"abort", std::nullopt, std::nullopt, m},
             false, m);
      return false;
    }
    r.routed_row = res.routed_experts.size() / ran;
    auto first = static_cast<std::size_t>(r.kv_tokens) * r.routed_row;
    r.routed.resize(std::max(r.routed.size(), first + res.routed_experts.size()));
    std::copy(res.routed_experts.begin(), res.routed_experts.end(),
              r.routed.begin() + static_cast<std::ptrdiff_t>(first));
  }
  auto asked = r.in_batch_scored;
  if (asked == 0)
    return true;
  if (static_cast<int64_t>(res.scored_logprobs.size()) != asked ||
      (r.req.top_logprobs_num > 0 && static_cast<int64_t>(res.scored_top_logprobs.size()) != asked)) {
    auto m = "internal error: the runner returned " + std::to_string(res.scored_logprobs.size()) +
             " prompt logprobs for " + std::to_string(asked) + " positions";
    finish(self, std::string(r.req.rid), FinishReason{"abort", std::nullopt, std::nullopt, m},
           false, m);
    return false;
  }
  r.out.input_token_logprobs.insert(r.out.input_token_logprobs.end(),
                                    res.scored_logprobs.begin(), res.scored_logprobs.end());
  if (r.req.top_logprobs_num > 0)
    for (auto& row : res.scored_top_logprobs)
      r.out.input_top_logprobs.push_back(std::move(row));
  r.scored_upto += asked;
  return true;
}

// One position's answer: its sampled token (none for a prefill chunk), for a work position its
// details (a verification's accepted proposals come before the sampled token), or its error.
void apply_result(scheduler_pointer self, uint64_t seq_id, int32_t token, float logprob,
                  WorkResult* details, const std::string& error) {
  auto& st = self->state;
  auto seq = st.by_seq.find(seq_id);
  if (seq == st.by_seq.end())
    return; // finished meanwhile
  auto& r = *seq->second;
  if (details && error.empty() && !apply_scores(self, r, *details))
    return; // it ended: the runner's answer did not match what was asked
  r.in_batch_scored = 0;
  const auto& rid = r.req.rid;
  auto ran = r.in_batch_tokens;
  auto sampled = r.in_batch_samples;
  auto proposals = r.in_batch_proposals;
  r.in_batch_tokens = 0;
  r.in_batch_samples = false;
  r.in_batch_proposals = 0;
  if (ran == 0)
    return;
  if (!error.empty()) {
    finish(self, std::string(rid), FinishReason{"abort", std::nullopt, std::nullopt, error}, false,
           error);
    return;
  }
  const auto accepted =
    proposals > 0 && details ? static_cast<int32_t>(details->accepted_tokens.size()) : 0;
  auto length_before = sequence_length(r);
  if (proposals > 0) {
    // The target kept the pending token and the accepted proposals; the draft holds the
    // pending token and its first proposals - 1, of which the accepted ones stay valid.
    r.kv_tokens += 1 + accepted;
    r.draft_kv = std::min(r.draft_kv, length_before + accepted);
    record_acceptance(st, r, static_cast<int32_t>(proposals), accepted);
  } else {
    r.kv_tokens += ran;
  }
  r.prefill_left = std::max<int64_t>(r.prefill_left - ran, 0);
  if (st.options.prefix_cache)
    drop_copy_pin(st, r); // the batch that copied has run
  // Below, every path ends in finish() (whose release_kv caches the request's full blocks) or
  // caches the blocks filled by this batch itself, once its tokens are known.
  if (r.abort_requested) {
    finish(self, std::string(rid), abort_reason(r));
    return;
  }
  if (!sampled) { // a prefill chunk: nothing to report yet
    if (st.options.prefix_cache)
      cache_full_blocks(st, r);
    return;
  }
  if (r.req.sampling_params.max_new_tokens == 0) { // it ran to score its prompt
    finish(self, std::string(rid), FinishReason{"length", std::nullopt, std::nullopt, {}});
    return;
  }
  if (token < 0) { // not reached: a position that ran and sampled has its token
    auto m = std::string("internal error: the runner returned no token for a sampling sequence");
    finish(self, std::string(rid), FinishReason{"abort", std::nullopt, std::nullopt, m}, false, m);
    return;
  }
  if (r.out.top_p_token_counts) { // top-p replay: the sampled token's kept set (no speculation)
    const auto* counts = details ? &details->top_p_token_counts : nullptr;
    if (!counts || counts->size() != 1 || proposals > 0 ||
        static_cast<std::size_t>(counts->front()) != details->top_p_token_ids.size()) {
      auto m = std::string("internal error: the runner returned no kept set (top-p replay) for a "
                           "sampled token");
      finish(self, std::string(rid), FinishReason{"abort", std::nullopt, std::nullopt, m}, false, m);
      return;
    }
    auto& ids = r.out.top_p_token_ids;
    ids.insert(ids.end(), details->top_p_token_ids.begin(), details->top_p_token_ids.end());
    r.out.top_p_token_counts->push_back(counts->front());
  }
  auto& spans = r.out.weight_version_spans;
  if (spans.empty() || spans.back().weight_version != st.version)
    spans.push_back({st.version, static_cast<int32_t>(r.out.output_ids.size())});
  // The new tokens: a verification's accepted proposals, then the sampled token.
  const auto kept = static_cast<std::size_t>(accepted);
  std::optional<FinishReason> reason;
  for (std::size_t n = 0; n <= kept && !reason; ++n) {
    const bool sampled_one = n == kept;
    r.out.output_ids.push_back(sampled_one ? token : details->accepted_tokens[n]);
    if (r.req.return_logprob) { // kept only when asked for: most rollouts at scale do not
      r.out.output_token_logprobs.push_back(sampled_one ? logprob
                                            : n < details->accepted_logprobs.size()
                                              ? details->accepted_logprobs[n]
                                              : 0.0f);
      r.out.output_top_logprobs.push_back(details && n < details->top_logprobs.size()
                                            ? std::move(details->top_logprobs[n])
                                            : std::vector<TopLogprob>{});
    }
    reason = stop_check(st, r); // tokens after a stop are dropped
  }
  if (reason) {
    finish(self, std::string(rid), std::move(reason));
  } else {
    stream_progress(self, r);
    if (st.options.prefix_cache) // with the tokens just appended (a verification's too)
      cache_full_blocks(st, r);
  }
}

bool profiling(const scheduler_state& st) {
  return st.options.profile && st.options.profile->active();
}

// Traces one span of the scheduler's timeline when a profile runs (callers build `args` only
// when profiling(): no string is built per step otherwise).
void trace(const scheduler_state& st, std::string_view name, profiler::clock::time_point begin,
           std::string args = {}) {
  if (profiling(st))
    st.options.profile->record("scheduler", name, begin, profiler::clock::now(), std::move(args));
}

void on_batch_done(scheduler_pointer self, ForwardBatchOutput& out) {
  auto& st = self->state;
  thread_cpu_meter meter{st.busy_ns};
  const auto results_begin = profiler::clock::now();
  if (profiling(st))
    trace(st, "forward", st.forward_sent, "{\"step\":" + std::to_string(out.step) + "}");
  st.forward_in_flight = false;
  const auto n = st.in_flight.size(), W = st.work_in_flight;
  if (out.success && (out.tokens.size() != n || out.logprobs.size() != n ||
                      out.details.size() != W || (!out.errors.empty() && out.errors.size() != n))) {
    out.success = false;
    out.message = fmt::format("internal error: the runner answered a batch of {} positions ({} "
                              "work) with {} tokens, {} logprobs, {} details and {} errors",
                              n, W, out.tokens.size(), out.logprobs.size(), out.details.size(),
                              out.errors.size());
  }
  // Position i of the answer is position i of the batch; nothing of a failed batch ran.
  for (std::size_t i = 0; out.success && i < n; ++i)
    apply_result(self, st.in_flight[i], out.tokens[i], out.logprobs[i],
                 i < W ? &out.details[i] : nullptr, out.error(i));
  st.in_flight.clear();
  if (!out.success) {
    // The whole batch failed (the runner could not run it): every request in it ends.
    std::vector<std::string> in_batch;
    for (auto& [rid, r] : st.requests)
      if (r.in_batch_tokens > 0)
        in_batch.push_back(rid);
    for (auto& rid : in_batch)
      finish(self, rid, FinishReason{"abort", std::nullopt, std::nullopt, out.message}, false,
             out.message);
  }
  flush_outbox(self);
  trace(st, "results", results_begin);
  if (st.options.profile)
    st.options.profile->step_done();
  run_controls(self);
}

// Whether a request's sampling reads the tokens it generated (penalties, min_new_tokens): the
// runner then needs them back after a retract, and the request is not speculated (each
// position's distribution would depend on the proposals before it).
bool reads_generated_tokens(const SamplingParams& p) {
  return p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f ||
         p.repetition_penalty != 1.0f || p.min_new_tokens > 0;
}

// Proposals a decoding request may verify this step: the configured k, fewer near its
// max_new_tokens or the context limit (nothing is proposed that could not be kept).
int64_t proposals_for(const scheduler_state& st, const request_state& r) {
  if (!st.draft || !st.draft_gone.empty() || st.options.speculative_num_draft_tokens <= 0 ||
      r.prefill_left > 0 || reads_generated_tokens(r.req.sampling_params) ||
      r.req.return_routed_experts || // the rows of rejected proposals would need undoing
      // top-p replay: each accepted proposal would need its kept set from the verification
      returns_top_p_token_ids(r.req.sampling_params) ||
      r.draft_failed || r.out.output_ids.empty())
    return 0;
  auto out_len = static_cast<int64_t>(r.out.output_ids.size());
  auto left = std::min<int64_t>(r.req.sampling_params.max_new_tokens - out_len,
                                st.manifest.max_context_length - sequence_length(r));
  auto k = std::min<int64_t>({st.options.speculative_num_draft_tokens, left - 1,
                              st.options.max_batch_tokens - 1});
  return std::max<int64_t>(k, 0);
}

// Sends the target its batch and handles the answer.
void run_target(scheduler_pointer self, ForwardBatch batch) {
  auto& st = self->state;
  st.waits.request<ForwardBatchOutput>(
    self, st.target, std::move(batch),
    [self](ForwardBatchOutput& out) { on_batch_done(self, out); },
    [self](const std::string& why) {
      ForwardBatchOutput out;
      out.success = false;
      out.message = "the target runner failed: " + why;
      on_batch_done(self, out);
    });
}

// The draft proposes for every speculating request of `batch` (draft position j for the target's
// work position verifies[j]), then the target verifies. A request the draft fails on decodes
// plainly this step and without speculation afterwards: the draft only ever makes generation
// faster, never fails it.
void run_draft_then_target(scheduler_pointer self, ForwardBatch batch, ForwardBatch draft_batch,
                           std::vector<std::size_t> verifies) {
  auto& st = self->state;
  auto fallback = [self](ForwardBatch& batch, std::size_t position) {
    auto& st = self->state;
    auto it = st.by_seq.find(batch.seq_ids[position]);
    if (it == st.by_seq.end())
      return;
    auto& r = *it->second;
    r.draft_failed = true;
    r.in_batch_proposals = 0;
    release_draft(self, r);
    auto& w = batch.work[position];
    w.draft_tokens.clear();
    w.draft_probs.clear();
    w.draft_probs_on_device = false;
  };
  auto batch_ptr = std::make_shared<ForwardBatch>(std::move(batch));
  auto verifies_ptr = std::make_shared<std::vector<std::size_t>>(std::move(verifies));
  st.waits.request<ForwardBatchOutput>(
    self, st.draft, std::move(draft_batch),
    [self, batch_ptr, verifies_ptr, fallback](ForwardBatchOutput& out) {
      auto& st = self->state;
      const auto& verifies = *verifies_ptr;
      for (std::size_t j = 0; j < verifies.size(); ++j) {
        const auto position = verifies[j];
        auto it = st.by_seq.find(batch_ptr->seq_ids[position]);
        if (it == st.by_seq.end())
          continue;
        auto& r = *it->second;
        auto* proposal = out.success && j < out.details.size() ? &out.details[j] : nullptr;
        if (!proposal || !out.error(j).empty() ||
            static_cast<int64_t>(proposal->proposed_tokens.size()) != r.in_batch_proposals) {
          fallback(*batch_ptr, position);
          continue;
        }
        // The draft now holds the pending token's prefix and proposals 1 .. k - 1.
        r.draft_kv = sequence_length(r) + r.in_batch_proposals - 1;
        auto& w = batch_ptr->work[position];
        w.draft_tokens = std::move(proposal->proposed_tokens);
        w.draft_probs = std::move(proposal->draft_probs);
        w.draft_probs_on_device = proposal->draft_probs_on_device;
      }
      run_target(self, std::move(*batch_ptr));
    },
    [self, batch_ptr, verifies_ptr, fallback](const std::string&) {
      for (auto position : *verifies_ptr) {
        auto it = self->state.by_seq.find(batch_ptr->seq_ids[position]);
        if (it != self->state.by_seq.end() && it->second->in_batch_proposals > 0)
          fallback(*batch_ptr, position);
      }
      run_target(self, std::move(*batch_ptr));
    });
}

// Blocks that preempting `r` makes available: its own, and the cached ones only it pins.
int64_t freed_if_preempted(const request_state& r) {
  int64_t n = 0;
  for_each_own_block(r, [&](int32_t) { ++n; });
  for (const auto* node : r.cached_path)
    n += policy::prefix_cache::users(node) == 1 ? 1 : 0;
  return n;
}

// Whether a request ahead of one waiting with `tokens` (`cached` of them found now, at most
// `limit` usable) is computing more of that prefix into whole blocks — which its prefill fills,
// and which become cached as they fill: a running request still in prefill, or one queued
// before it that is not waiting itself (the first `ahead` views). It then waits a step rather
// than compute the same KV, so the samples of one prompt prefill it once.
bool prefix_in_progress(const scheduler_state& st, std::span<const int32_t> tokens, int64_t limit,
                        int64_t cached, std::size_t ahead) {
  const auto bs = st.blocks->block_size();
  auto shares_more = [&](const request_state& o) {
    const auto filled = sequence_length(o) / bs * bs;
    const auto n = std::min(limit, filled);
    int64_t i = 0;
    while (i < n && token_at(o, i) == tokens[static_cast<std::size_t>(i)])
      ++i;
    return i > cached;
  };
  for (const auto* o : st.running)
    if (o->prefill_left > 0 && o->caching && o->kv_epoch == st.blocks->epoch() && shares_more(*o))
      return true;
  for (std::size_t j = 0; j < ahead; ++j)
    if (!st.waiting_views[j].waits_for_prefix && shares_more(*st.waiting[j]))
      return true;
  return false;
}

// The waiting requests step() may admit, with their cached prefixes: waiting_views (what the
// planner reads) and waiting_matches (what admission pins), one each, in queue order.
void plan_admissions(scheduler_state& st) {
  auto& views = st.waiting_views;
  auto& matches = st.waiting_matches;
  views.clear();
  matches.clear();
  for (const auto* rp : st.waiting) {
    if (static_cast<int64_t>(views.size()) >= st.options.max_running_requests)
      break; // no more can be admitted in one step anyway
    const auto& r = *rp;
    policy::prefix_cache::match m;
    bool waits = false;
    if (st.options.prefix_cache) {
      auto tokens = all_tokens(r, st.token_scratch);
      const auto limit = cacheable_prefix(r);
      m = st.blocks->lookup(tokens, limit, r.req.return_routed_experts);
      if (m.tokens + m.copy_tokens < limit)
        waits = prefix_in_progress(st, tokens, limit, m.tokens + m.copy_tokens, views.size());
    }
    views.push_back({r.seq_id, sequence_length(r) - m.tokens - m.copy_tokens, m.unpinned, waits,
                     m.copy_tokens});
    matches.push_back(std::move(m));
  }
}

// Routing replay of a cached prefix: its positions' rows come from the blocks that kept them
// (lookup took only such blocks), as if the request had run them.
void restore_cached_routing(const scheduler_state& st, request_state& r, const policy::prefix_cache::match& m) {
  const auto bs = static_cast<std::size_t>(st.blocks->block_size());
  const auto& first = m.path.empty() ? m.copy_from : m.path.front();
  const auto row = policy::prefix_cache::routing(first).size() / bs;
  if (row == 0 || (r.routed_row != 0 && r.routed_row != row))
    return; // not reached: every block of one model keeps rows of one length
  r.routed_row = row;
  r.routed.resize(std::max(r.routed.size(), static_cast<std::size_t>(r.kv_tokens) * row));
  std::size_t at = 0;
  for (const auto* n : m.path) {
    auto rows = policy::prefix_cache::routing(n);
    std::copy(rows.begin(), rows.end(), r.routed.begin() + static_cast<std::ptrdiff_t>(at));
    at += rows.size();
  }
  if (m.copy_from) {
    auto rows = policy::prefix_cache::routing(m.copy_from);
    std::copy_n(rows.begin(), static_cast<std::ptrdiff_t>(m.copy_tokens) * static_cast<std::ptrdiff_t>(row),
                r.routed.begin() + static_cast<std::ptrdiff_t>(at));
  }
}

// The cached prefix planned for waiting request `seq_id` (its view's match), or null.
const policy::prefix_cache::match* planned_match(const scheduler_state& st, uint64_t seq_id) {
  for (std::size_t v = 0; v < st.waiting_views.size(); ++v)
    if (st.waiting_views[v].id == seq_id)
      return &st.waiting_matches[v];
  return nullptr; // not reached: the planner admits only what it was shown
}

// Pins the cached prefixes of the requests the plan admits before any block is allocated:
// allocating evicts unpinned blocks, which could be the very ones an admitted request reuses.
void pin_admitted_prefixes(scheduler_state& st, const policy::batch_plan& plan) {
  if (!st.options.prefix_cache)
    return;
  for (const auto& w : plan.work) {
    const auto* m = w.admitted ? planned_match(st, w.id) : nullptr;
    if (!m)
      continue;
    st.blocks->pin(m->path);
    if (m->copy_from) {
      std::array<policy::prefix_cache::node*, 1> one{m->copy_from};
      st.blocks->pin(one);
    }
  }
}

// At admission: `r` takes the cached prefix planned (and pinned) for it, and its KV starts
// after it.
void admit_cached_prefix(scheduler_state& st, request_state& r, SequenceWork& work) {
  r.kv_tokens = 0;
  r.cached_path.clear();
  r.draft_marked = 0;
  r.kv_epoch = st.blocks->epoch();
  r.caching = st.options.prefix_cache;
  const auto* planned = st.options.prefix_cache ? planned_match(st, r.seq_id) : nullptr;
  if (!planned)
    return;
  const auto& m = *planned;
  r.cached_path = m.path;
  for (const auto* n : m.path)
    r.blocks.push_back(policy::prefix_cache::block_of(n));
  if (m.copy_from) { // its first own block starts as a copy of this one's first slots
    r.copy_pin = m.copy_from;
    work.copy_from_block = policy::prefix_cache::block_of(m.copy_from);
  }
  r.kv_tokens = m.tokens + m.copy_tokens;
  work.cached_tokens = r.kv_tokens;
  if (r.req.return_routed_experts && r.kv_tokens > 0) // the cached positions' routing
    restore_cached_routing(st, r, m);
  // meta_info.cached_tokens: prompt tokens it did not compute itself before a retract.
  const auto prompt = prompt_length(r);
  r.out.cached_tokens += static_cast<int32_t>(
    std::max<int64_t>(0, std::min(r.kv_tokens, prompt) - std::min(r.computed_before, prompt)));
  st.prefix_query_tokens += static_cast<uint64_t>(sequence_length(r));
  st.prefix_hit_tokens += static_cast<uint64_t>(r.kv_tokens);
}

// Where a request's new draft sequence starts: after the leading cached blocks whose KV the
// draft's pool holds too (computed with the weights serving now).
int64_t draft_cached_prefix(scheduler_state& st, request_state& r) {
  if (!st.options.prefix_cache || r.kv_epoch != st.blocks->epoch())
    return 0;
  std::size_t n = 0;
  while (n < r.cached_path.size() && policy::prefix_cache::draft_ready(r.cached_path[n]) &&
         policy::prefix_cache::block_of(r.cached_path[n]) == r.blocks[n])
    ++n;
  r.draft_marked = n;
  return static_cast<int64_t>(n) * st.blocks->block_size();
}

void step(scheduler_pointer self) {
  auto& st = self->state;
  thread_cpu_meter meter{st.busy_ns};
  const auto plan_begin = profiler::clock::now();
  st.step_scheduled = false;
  check_flushes(self);
  if (st.paused || st.forward_in_flight || st.control_busy || !st.control_queue.empty() ||
      !st.memory_released.empty())
    return;
  if (st.running.empty() && st.waiting.empty())
    return;
  auto& running = st.running_views; // reused: no allocation per step
  running.clear();
  for (const auto* rp : st.running) {
    const auto& r = *rp;
    running.push_back({r.seq_id, r.kv_tokens, static_cast<int64_t>(r.blocks.size()),
                       r.prefill_left, 1 + proposals_for(st, r)});
  }
  policy::batch_limits limits{st.options.max_running_requests, st.options.max_batch_tokens,
                              st.blocks->block_size()};
  plan_admissions(st);
  const int64_t free_blocks = st.blocks->available_blocks();
  // A request sharing cached blocks frees only its own on preemption; counted only when the
  // planner could preempt at all (a walk over every running request's blocks).
  if (st.options.prefix_cache && policy::preemption_possible(running, free_blocks, limits))
    for (std::size_t i = 0; i < st.running.size(); ++i)
      running[i].freed_if_preempted = freed_if_preempted(*st.running[i]);
  auto plan = policy::plan_batch(running, st.waiting_views, free_blocks, limits);

  // Preempted requests rejoin the queue's front, oldest first.
  for (auto it = plan.preempted.rbegin(); it != plan.preempted.rend(); ++it) {
    auto* r = st.by_seq.at(*it);
    requeue(self, *r);
    st.waiting.push_front(r);
  }
  pin_admitted_prefixes(st, plan);
  if (plan.work.empty()) {
    flush_outbox(self);
    return;
  }
  // Work entries take the batch's first positions, plain decodes the rest (collected aside).
  ForwardBatch batch;
  batch.step = st.next_step++;
  batch.seq_ids.reserve(plan.work.size());
  auto& decodes = st.decode_scratch;
  decodes.clear();
  ForwardBatch draft_batch;
  draft_batch.step = batch.step;
  std::vector<std::size_t> verifies; // the target position each draft position proposes for
  for (const auto& w : plan.work) {
    auto& r = *st.by_seq.at(w.id);
    if (!w.admitted && r.prefill_left == 0 && w.tokens == 1 && w.new_blocks == 0 &&
        !(r.req.return_logprob && r.req.top_logprobs_num > 0) && !r.req.return_routed_experts &&
        !r.out.top_p_token_counts) { // (top-p replay: its kept sets come with the details)
      // A plain decode: flat arrays, no allocation per sequence.
      decodes.push_back(r.seq_id);
      batch.decode_tokens.push_back(r.out.output_ids.back());
      r.in_batch_tokens = 1;
      r.in_batch_samples = true;
      continue;
    }
    SequenceWork work;
    if (w.admitted) {
      st.waiting.erase(std::find(st.waiting.begin(), st.waiting.end(), &r));
      st.running.push_back(&r);
      admit_cached_prefix(st, r, work);
      r.prefill_left = sequence_length(r) - r.kv_tokens;
      work.new_sequence = true;
      work.sampling_params = r.req.sampling_params;
      // Back from a retract, the sampler is reseeded by position so a rerun is reproducible.
      work.sampling_seed = r.req.sampling_seed + r.out.output_ids.size();
      if (reads_generated_tokens(r.req.sampling_params))
        work.generated_tokens = r.out.output_ids;
      r.on_runner = true;
    }
    auto blocks = st.blocks->allocate(w.new_blocks);
    if (!blocks) { // the planner counted free blocks; this cannot happen
      finish(self, std::string(r.req.rid), FinishReason{"abort", std::nullopt, std::nullopt, "KV pool exhausted"},
             false, "internal error: the KV pool ran out of blocks the planner counted");
      continue;
    }
    r.blocks.insert(r.blocks.end(), blocks->begin(), blocks->end());
    if (w.admitted) // the runner gets the cached prefix's blocks first
      work.new_blocks = r.blocks;
    else
      work.new_blocks = std::move(*blocks);
    if (r.prefill_left > 0) {
      st.prefill_tokens += static_cast<uint64_t>(w.tokens);
      // The next chunk of prompt + outputs, from the first position without KV.
      for (int64_t i = r.kv_tokens; i < r.kv_tokens + w.tokens; ++i)
        work.tokens.push_back(token_at(r, i));
      // Prompt positions of this chunk still to score: always a run at its end (before the
      // sampled position), since scoring is done before any output exists.
      if (r.req.return_logprob) {
        auto lo = std::max(r.kv_tokens, r.scored_upto);
        auto hi = std::min(r.kv_tokens + w.tokens, prompt_length(r) - 1);
        for (auto p = lo; p < hi; ++p)
          work.scored_tokens.push_back(token_at(r, p + 1));
        r.in_batch_scored = std::max<int64_t>(hi - lo, 0);
      }
    } else {
      work.tokens = {r.out.output_ids.back()};
      if (w.tokens > 1) {
        // Speculative: the draft catches up on what it lacks and proposes w.tokens - 1.
        r.in_batch_proposals = w.tokens - 1;
        SequenceWork proposal;
        if (!r.on_draft) {
          proposal.new_sequence = true;
          proposal.sampling_params = r.req.sampling_params;
          // Its own stream: the draft's draws must not repeat the target's.
          proposal.sampling_seed = r.req.sampling_seed ^ 0x5bd1e9955bd1e995ull;
          r.on_draft = true;
          r.draft_kv = draft_cached_prefix(st, r);
          proposal.cached_tokens = r.draft_kv;
          r.draft_blocks = 0;
        } else {
          proposal.kv_length = r.draft_kv;
        }
        proposal.new_blocks.assign(r.blocks.begin() + static_cast<std::ptrdiff_t>(r.draft_blocks),
                                   r.blocks.end());
        r.draft_blocks = r.blocks.size();
        for (int64_t i = r.draft_kv; i < sequence_length(r); ++i)
          proposal.tokens.push_back(token_at(r, i));
        proposal.sample = false;
        proposal.propose = static_cast<int32_t>(r.in_batch_proposals);
        draft_batch.seq_ids.push_back(r.seq_id);
        draft_batch.work.push_back(std::move(proposal));
        verifies.push_back(batch.work.size()); // the position `work` takes below
      }
    }
    work.sample = w.samples;
    work.return_routed_experts = r.req.return_routed_experts;
    work.return_top_p_token_ids = r.out.top_p_token_counts.has_value();
    work.top_logprobs_num = r.req.return_logprob ? r.req.top_logprobs_num : 0;
    if (w.samples && r.out.weight_version_start.empty())
      r.out.weight_version_start = st.version;
    r.in_batch_tokens = w.tokens;
    r.in_batch_samples = w.samples;
    batch.seq_ids.push_back(r.seq_id);
    batch.work.push_back(std::move(work));
  }
  batch.seq_ids.insert(batch.seq_ids.end(), decodes.begin(), decodes.end());
  flush_outbox(self);
  if (batch.size() == 0)
    return;
  if (profiling(st)) {
    int64_t tokens = static_cast<int64_t>(batch.decode_tokens.size());
    for (const auto& w : batch.work)
      tokens += static_cast<int64_t>(w.tokens.size());
    trace(st, "plan", plan_begin,
          fmt::format(R"({{"step":{},"decodes":{},"other":{},"tokens":{},"running":{},"waiting":{}}})",
                      batch.step, batch.decode_tokens.size(), batch.work.size(), tokens,
                      st.running.size(), st.waiting.size()));
  }
  st.forward_sent = profiler::clock::now();
  st.forward_in_flight = true;
  st.in_flight = batch.seq_ids;
  st.work_in_flight = batch.work.size();
  if (draft_batch.work.empty())
    run_target(self, std::move(batch));
  else
    run_draft_then_target(self, std::move(batch), std::move(draft_batch), std::move(verifies));
}

// retract: every running request gives its KV back and returns to the front of the queue, in
// its admission order, keeping the tokens it has.
void retract_running(scheduler_pointer self) {
  auto& st = self->state;
  auto running = st.running;
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    requeue(self, **it);
    st.waiting.push_front(*it);
  }
}

// The weights may have changed: no KV cached so far is reused from now on.
void weights_changed(scheduler_state& st) {
  st.blocks->new_epoch();
}

// Refreshes the version the scheduler stamps on results (and the prefix cache's epoch when a
// commit happened), then calls `then`.
void refresh_version(scheduler_pointer self, std::function<void()> then) {
  self->state.waits.request<WeightUpdaterStatus>(
    self, self->state.updater, version_atom_v,
    [self, then](WeightUpdaterStatus& s) {
      auto& st = self->state;
      if (s.committed_updates != st.committed_updates)
        weights_changed(st);
      st.version = s.weight_version;
      st.committed_updates = s.committed_updates;
      then();
    },
    [self, then](const std::string&) {
      weights_changed(self->state); // unknown: assume the worst
      then();
    });
}

// Whether a weight operation's reply may hide a change of served weights that the commit count
// does not show: a failed commit may have updated one runner and not the other, and
// reset_tensors writes weights without a commit.
template <class Op>
bool may_change_weights_uncounted(const typename Op::input& req, const typename Op::output& out) {
  if constexpr (std::is_same_v<typename Op::input, CheckWeightsReqInput>)
    return req.action == check_weights_action::reset_tensors;
  else
    return Op::role != session_role::unordered && !out.success;
}

// The handler of weight operation `Op`: forwarded to the weight_updater as a control operation
// (between batches, one at a time); the reply goes back once the version stamped on results is
// fresh. If the updater dies meanwhile, `waits` answers with the reason.
// The reply to a weight operation whose updater request failed (the actor died or timed out).
template <class Out>
Out updater_failure(const std::string& why) {
  Out out;
  out.success = false;
  out.message = "the weight updater failed: " + why;
  return out;
}

template <class Op>
void forward_as_control(scheduler_pointer self, typename Op::input req,
                        caf::typed_response_promise<typename Op::output> rp) {
  using In = typename Op::input;
  using Out = typename Op::output;
  {
    enqueue_control(self, [self, req = std::move(req), rp]() mutable {
      auto finish = [self, rp, uncounted = std::make_shared<In>(req)](Out out) mutable {
        if (may_change_weights_uncounted<Op>(*uncounted, out))
          weights_changed(self->state);
        refresh_version(self, [self, rp, out = std::move(out)]() mutable {
          rp.deliver(std::move(out));
          control_done(self);
        });
      };
      self->state.waits.template request<Out>(
        self, self->state.updater, std::move(req),
        [self, finish](Out& out) mutable {
          if constexpr (std::is_same_v<In, UpdateWeightsFromTensorReqInput> ||
                        std::is_same_v<In, UpdateWeightsFromDistributedReqInput>) {
            // Outside begin/end and while generation runs, a tensor update commits at once
            // (SGLang applies each call as it comes); while paused it waits for
            // continue_generation.
            if (out.success && !self->state.paused && !self->state.updates_wait) {
              self->state.waits.template request<EndWeightUpdateReqOutput>(
                self, self->state.updater, settle_atom_v,
                [finish, out](EndWeightUpdateReqOutput& e) mutable {
                  if (!e.message.empty()) {
                    out.success = e.success;
                    out.message =
                      e.success ? e.message : "staged, but the commit failed: " + e.message;
                  }
                  finish(std::move(out));
                },
                [finish](const std::string& why) mutable { finish(updater_failure<Out>(why)); });
              return;
            }
          }
          finish(std::move(out));
        },
        [finish](const std::string& why) mutable { finish(updater_failure<Out>(why)); });
    });
  }
}

template <class Op>
auto forward_to_updater(scheduler_pointer self) {
  using In = typename Op::input;
  using Out = typename Op::output;
  return [self](In& req) -> caf::result<Out> {
    if constexpr (std::is_same_v<In, InitWeightsUpdateGroupReqInput> ||
                  std::is_same_v<In, DestroyWeightsUpdateGroupReqInput>) {
      // Joining and leaving a group touch no served weight and may wait on a trainer for as
      // long as the request's deadline: straight to the updater, and batches go on meanwhile.
      return self->delegate(self->state.updater, std::move(req));
    } else {
      auto rp = self->make_response_promise<Out>();
      if constexpr (std::is_same_v<In, UpdateWeightsFromDistributedReqInput>) {
        if (req.received == 0) {
          // The trainer's broadcast is received first, outside the one-at-a-time weight
          // operations (batches run meanwhile); staging it is the weight operation.
          self->state.waits.template request_of<ReceivedBroadcast>(
            self, self->state.updater,
            [self, rp, req](ReceivedBroadcast& r) mutable {
              if (!r.success) {
                rp.deliver(Out{false, std::move(r.message)});
                return;
              }
              req.received = r.buffer_id;
              forward_as_control<Op>(self, std::move(req), rp);
            },
            [rp](const std::string& why) mutable {
              rp.deliver(Out{false, "the weight updater failed: " + why});
            },
            receive_atom_v, req);
          return rp;
        }
      }
      forward_as_control<Op>(self, std::move(req), rp);
      return rp;
    }
  };
}

// release_memory_occupation / resume_memory_occupation, between batches: every runner (target,
// then draft) gives back or takes again the tagged memory. A release is refused while a request
// holds KV; releasing the KV empties the prefix cache (its blocks' contents go).
template <class Out>
void change_memory(scheduler_pointer self, ReleaseMemoryOccupationReqInput req,
                   caf::typed_response_promise<Out> rp, bool release) {
  enqueue_control(self, [self, req = std::move(req), rp, release]() mutable {
    auto& st = self->state;
    auto finish = [self, rp](bool ok, std::string message) mutable {
      rp.deliver(Out{ok, std::move(message)});
      control_done(self);
    };
    if (const auto i = find_unknown_memory_tag(req.tags))
      return finish(false, "unknown memory tag \"" + req.tags[*i] + "\" (expected weights, kv_cache or cuda_graph)");
    const std::vector<std::string> tags = canonical_memory_tags(req.tags);
    if (release && !st.running.empty())
      return finish(false, "cannot release GPU memory: " + std::to_string(st.running.size()) +
                             " requests hold KV (pause with mode \"abort\" or \"retract\", or wait "
                             "until none runs)");
    if (release && std::find(tags.begin(), tags.end(), "kv_cache") != tags.end() && st.blocks)
      st.blocks->flush(); // no request runs: every cached block is unpinned
    std::vector<runner_actor> runners{st.target};
    if (st.draft)
      runners.push_back(st.draft);
    auto messages = std::make_shared<std::string>();
    auto ok = std::make_shared<bool>(true);
    auto next = std::make_shared<std::function<void(std::size_t)>>();
    *next = [self, runners, tags, release, messages, ok, next, finish](std::size_t i) mutable {
      if (i == runners.size()) {
        auto& st = self->state;
        if (*ok)
          for (const auto& t : tags)
            release ? (void)st.memory_released.insert(t) : (void)st.memory_released.erase(t);
        // Copies first: clearing `next` (which breaks the cycle) destroys this closure.
        auto self_copy = self;
        auto done = std::move(finish);
        const bool good = *ok;
        auto text = *messages;
        auto keep = next;
        *keep = nullptr;
        if (self_copy->state.memory_released.empty())
          schedule_step(self_copy); // waiting (retracted) requests go on
        done(good, std::move(text));
        return;
      }
      auto on_reply = [next, messages, ok, i](RunnerReply& r) mutable {
        *messages += (messages->empty() ? "" : "; ") + r.message;
        *ok = *ok && r.success;
        (*next)(i + 1);
      };
      auto on_error = [next, messages, ok, i](const std::string& why) mutable {
        *messages += (messages->empty() ? "" : "; ") + ("a runner did not answer: " + why);
        *ok = false;
        (*next)(i + 1);
      };
      if (release)
        self->state.waits.template request<RunnerReply>(self, runners[i], ReleaseMemoryOccupationReqInput{tags},
                                                         on_reply, on_error);
      else
        self->state.waits.template request<RunnerReply>(self, runners[i], ResumeMemoryOccupationReqInput{tags},
                                                         on_reply, on_error);
    };
    (*next)(0);
  });
}

// Answers the flush requests waiting for the running requests to end: success once none runs,
// failure at the deadline. Called on every step and whenever a request ends.
void check_flushes(scheduler_pointer self) {
  auto& st = self->state;
  auto now = caf::make_timestamp();
  for (auto it = st.pending_flushes.begin(); it != st.pending_flushes.end();) {
    if (st.running.empty()) {
      auto freed = st.blocks->flush();
      it->promise.deliver(FlushCacheReqOutput{
        true, "cache flushed (" + std::to_string(freed * st.blocks->block_size()) + " cached tokens dropped)"});
    } else if (now >= it->deadline) {
      it->promise.deliver(FlushCacheReqOutput{
        false, "cannot flush the cache: " + std::to_string(st.running.size()) +
                 " requests are running (pause with mode \"abort\" or \"retract\" first, or "
                 "pass a larger timeout_s to wait for them)"});
    } else {
      ++it;
      continue;
    }
    it = st.pending_flushes.erase(it);
  }
}

// Queues a request from the front door (see the TokenizedGenerateReqInput handler).
void accept_request(scheduler_pointer self, TokenizedGenerateReqInput& req, caf::actor& sink) {
  auto& st = self->state;
  request_state r;
  r.seq_id = st.next_seq++;
  r.sink = std::move(sink);
  r.req = std::move(req);
  auto rid = r.req.rid;
  auto refuse = [&](std::string why) {
    GenerateReqOutput c;
    c.rid = rid;
    c.finished = true;
    c.success = false;
    c.prompt_tokens = static_cast<int32_t>(r.req.input_ids.size());
    c.sampling_seed = r.req.sampling_seed;
    c.message = std::move(why);
    c.finish_reason = FinishReason{"abort", std::nullopt, std::nullopt, c.message};
    caf::anon_send(r.sink, TokenChunks{{std::move(c)}});
  };
  if (!st.target_gone.empty())
    return refuse(st.target_gone);
  if (!st.memory_released.empty())
    return refuse("the engine's GPU memory is released (" + released_tags(st) +
                  "): call resume_memory_occupation before generating");
  // The front door refuses a rid in flight. One can still arrive here: a request the front door
  // has already ended (its detokenizing failed) keeps running until its batch returns, and tests
  // and benchmarks send here directly. The table must never hold two requests under one rid, so
  // this guard stays, refusing with the front door's words.
  if (st.requests.count(rid))
    return refuse(rid_in_flight_message(rid));
  // A request the pool could never hold, even alone, is refused now, not queued forever.
  auto prompt = static_cast<int64_t>(r.req.input_ids.size());
  auto most = std::min<int64_t>(prompt + r.req.sampling_params.max_new_tokens,
                                st.manifest.max_context_length);
  if (most > st.blocks->capacity_tokens())
    return refuse("the request needs up to " + std::to_string(most) + " KV slots (prompt " +
                  std::to_string(prompt) + " + max_new_tokens " +
                  std::to_string(r.req.sampling_params.max_new_tokens) +
                  ") but the KV pool holds " + std::to_string(st.blocks->capacity_tokens()) +
                  "; lower max_new_tokens or give the engine a larger KV pool");
  r.logprob_start = r.req.logprob_start_len < 0 ? std::max<int64_t>(prompt - 1, 0)
                                                : std::min<int64_t>(r.req.logprob_start_len, prompt - 1);
  r.scored_upto = r.logprob_start;
  r.out.rid = rid;
  r.out.prompt_tokens = static_cast<int32_t>(prompt);
  r.out.sampling_seed = r.req.sampling_seed;
  if (returns_top_p_token_ids(r.req.sampling_params))
    r.out.top_p_token_counts.emplace(); // the reply has the fields even with no token
  if (r.req.return_logprob) { // the first prompt token's entry: nothing before it was scored
    r.out.input_token_logprobs.push_back(std::numeric_limits<float>::quiet_NaN());
    if (r.req.top_logprobs_num > 0)
      r.out.input_top_logprobs.emplace_back();
  }
  auto& stored = st.requests.emplace(rid, std::move(r)).first->second;
  st.by_seq[stored.seq_id] = &stored;
  // max_new_tokens 0 ends at once, unless the prompt is to be scored (prompt logprobs only).
  if (stored.req.sampling_params.max_new_tokens == 0 &&
      !(stored.req.return_logprob && stored.scored_upto < prompt - 1)) {
    finish(self, rid, FinishReason{"length", std::nullopt, std::nullopt, {}});
    flush_outbox(self);
    return;
  }
  st.waiting.push_back(&stored);
  schedule_step(self);
}

// A runner or the updater has stopped (a crash, or killed): what waited on it fails now, and
// what needs it fails from now on. The scheduler itself lives on, so the front door can answer.
void on_part_down(scheduler_pointer self, caf::down_msg& dm) {
  auto& st = self->state;
  auto why = [&](const char* part) {
    return std::string("the engine's ") + part + " stopped (" + self->system().render(dm.reason) +
           "); the engine cannot serve until it is restarted";
  };
  std::string* gone = nullptr;
  std::string text;
  if (dm.source == st.target.address()) {
    gone = &st.target_gone;
    text = why("target runner");
  } else if (st.draft && dm.source == st.draft.address()) {
    gone = &st.draft_gone;
    text = std::string("the engine's draft runner stopped (") + self->system().render(dm.reason) +
           "); generation goes on without speculative decoding, weight updates fail until the "
           "engine is restarted";
  } else if (dm.source == st.updater.address()) {
    gone = &st.updater_gone;
    text = why("weight updater");
  } else {
    return;
  }
  if (!gone->empty())
    return;
  *gone = text;
  st.waits.peer_down(dm.source, text);
  if (gone == &st.target_gone) {
    // Nothing can run: every request ends now with the reason.
    std::vector<std::string> rids;
    for (auto& [rid, r] : st.requests)
      rids.push_back(rid);
    for (auto& rid : rids)
      finish(self, rid, FinishReason{"abort", std::nullopt, std::nullopt, text}, false, text);
    flush_outbox(self);
  }
}

scheduler_actor::behavior_type scheduler(scheduler_pointer self, scheduler_options options,
                                         runner_actor target, runner_actor draft,
                                         RunnerManifest manifest,
                                         weight_updater_actor updater, std::string version,
                                         std::shared_ptr<const model::bpe_tokenizer> tokenizer) {
  auto& st = self->state;
  st.options = options;
  st.target = std::move(target);
  st.draft = std::move(draft);
  st.manifest = std::move(manifest);
  st.updater = std::move(updater);
  st.version = std::move(version);
  st.tokenizer = std::move(tokenizer);
  st.blocks.emplace(st.manifest.kv_num_blocks, st.manifest.kv_block_size);
  self->monitor(st.target);
  if (st.draft)
    self->monitor(st.draft);
  self->monitor(st.updater);
  self->set_down_handler([self](caf::down_msg& dm) { on_part_down(self, dm); });
  return wrapped_with_weight_operations<scheduler_actor::behavior_type>(
    [](auto handler) { return guard_handler(scheduler_state::name, std::move(handler)); },
    [self]<class Op>() { return forward_to_updater<Op>(self); },
    [self](TokenizedGenerateReqInput& req, caf::actor& sink) {
      // No reply to carry an error: a request whose handling throws ends with a failed last
      // chunk, or its caller would wait for chunks forever.
      auto rid = req.rid;
      auto reply_to = sink;
      const auto prompt = static_cast<int32_t>(req.input_ids.size());
      const auto seed = req.sampling_seed;
      guarded([&] { accept_request(self, req, sink); },
              [&](const std::string& what) {
                GenerateReqOutput c;
                c.rid = rid;
                c.finished = true;
                c.success = false;
                c.prompt_tokens = prompt;
                c.sampling_seed = seed;
                c.message = "the scheduler failed handling this request: " + what;
                c.finish_reason = FinishReason{"abort", std::nullopt, std::nullopt, c.message};
                caf::anon_send(reply_to, TokenChunks{{std::move(c)}});
              });
    },
    [self](AbortReq& req) {
      auto& st = self->state;
      std::vector<std::string> targets;
      if (req.abort_all) {
        for (auto& [rid, r] : st.requests)
          targets.push_back(rid);
      } else if (st.requests.count(req.rid)) {
        targets.push_back(req.rid);
      }
      for (auto& rid : targets) {
        auto& r = st.requests.at(rid);
        r.abort_requested = true;
        r.abort_message = req.abort_message.empty() ? "aborted by request" : req.abort_message;
        if (r.in_batch_tokens == 0)
          finish(self, rid, abort_reason(r));
      }
      flush_outbox(self);
      return AbortReqOutput{true, std::to_string(targets.size()) + " requests aborted",
                            static_cast<int32_t>(targets.size())};
    },
    [self](PauseGenerationReqInput& req) -> caf::result<PauseGenerationReqOutput> {
      if (req.mode == pause_mode::abort) { // the front door's; see updates_wait
        self->state.updates_wait = true;
        return PauseGenerationReqOutput{true, "updates wait for continue_generation"};
      }
      auto rp = self->make_response_promise<PauseGenerationReqOutput>();
      self->state.paused = true; // no new batch from now on
      self->state.updates_wait = true;
      self->state.mode = req.mode;
      auto mode = req.mode;
      enqueue_control(self, [self, rp, mode]() mutable {
        if (mode == pause_mode::retract)
          retract_running(self);
        rp.deliver(PauseGenerationReqOutput{
          true, mode == pause_mode::retract
                  ? "generation paused; running requests retracted to the queue"
                  : "generation paused"});
        control_done(self);
      });
      return rp;
    },
    [self](ContinueGenerationReqInput&) -> caf::result<ContinueGenerationReqOutput> {
      // An update that came outside begin/end while paused (slime's buckets) commits here, before
      // the first batch of the resumed generation.
      auto rp = self->make_response_promise<ContinueGenerationReqOutput>();
      enqueue_control(self, [self, rp]() mutable {
        auto resume = [self, rp](bool ok, std::string settled) mutable {
          refresh_version(self, [self, rp, ok, settled]() mutable {
            self->state.paused = false;
            self->state.updates_wait = false;
            schedule_step(self);
            rp.deliver(ContinueGenerationReqOutput{
              ok, settled.empty() ? "generation continues" : settled + "; generation continues"});
            control_done(self);
          });
        };
        self->state.waits.request<EndWeightUpdateReqOutput>(
          self, self->state.updater, settle_atom_v,
          [self, resume](EndWeightUpdateReqOutput& out) mutable {
            if (!out.success) // a failed commit may have changed one runner
              weights_changed(self->state);
            resume(out.success, out.message);
          },
          [self, resume](const std::string& why) mutable {
            weights_changed(self->state);
            resume(false, "the weight updater failed: " + why);
          });
      });
      return rp;
    },
    [self](ReleaseMemoryOccupationReqInput& req) -> caf::result<ReleaseMemoryOccupationReqOutput> {
      auto rp = self->make_response_promise<ReleaseMemoryOccupationReqOutput>();
      change_memory<ReleaseMemoryOccupationReqOutput>(self, req, rp, true);
      return rp;
    },
    [self](ResumeMemoryOccupationReqInput& req) -> caf::result<ResumeMemoryOccupationReqOutput> {
      auto rp = self->make_response_promise<ResumeMemoryOccupationReqOutput>();
      ReleaseMemoryOccupationReqInput as_release{req.tags};
      change_memory<ResumeMemoryOccupationReqOutput>(self, as_release, rp, false);
      return rp;
    },
    [self](FlushCacheReqInput& req) -> caf::result<FlushCacheReqOutput> {
      auto rp = self->make_response_promise<FlushCacheReqOutput>();
      auto wait = caf::timespan{client_wait(req.timeout_s.value_or(0.0))};
      self->state.pending_flushes.push_back({rp, caf::make_timestamp() + wait});
      if (wait.count() > 0)
        self->delayed_send(self, wait, step_atom_v); // wakes check_flushes at the deadline
      check_flushes(self);
      return rp;
    },
    [self](GetServerInfoReqInput&) {
      auto& st = self->state;
      GetServerInfoReqOutput out;
      out.weight_version = st.version;
      out.paused = st.paused;
      out.running_requests = static_cast<int32_t>(st.running.size());
      out.waiting_requests = static_cast<int32_t>(st.waiting.size());
      out.committed_updates = st.committed_updates;
      out.max_running_requests = st.options.max_running_requests;
      if (st.blocks) { // cached blocks nobody uses are free for the taking: not "used"
        out.max_total_num_tokens = st.blocks->capacity_tokens();
        out.num_used_tokens =
          (st.blocks->total_blocks() - st.blocks->available_blocks()) * st.blocks->block_size();
        out.prefix_cache = st.options.prefix_cache;
        out.prefix_cached_tokens = st.blocks->cached_blocks() * st.blocks->block_size();
        out.prefix_query_tokens = st.prefix_query_tokens;
        out.prefix_hit_tokens = st.prefix_hit_tokens;
        out.prefill_tokens = st.prefill_tokens;
      }
      for (const auto* gone : {&st.target_gone, &st.draft_gone, &st.updater_gone})
        if (!gone->empty()) {
          out.success = false;
          out.message += (out.message.empty() ? "" : "; ") + *gone;
        }
      out.scheduler_steps = st.next_step - 1;
      out.scheduler_cpu_us = static_cast<double>(st.busy_ns) / 1e3;
      out.speculative_num_draft_tokens = st.draft ? st.options.speculative_num_draft_tokens : 0;
      out.spec_verify_steps = st.spec_verify_steps;
      out.spec_accepted_tokens = st.spec_accepted_tokens;
      out.spec_proposed_drafts = st.spec_proposed_drafts;
      if (st.spec_proposed_drafts > 0)
        out.spec_accept_rate = double(st.spec_accepted_tokens) / double(st.spec_proposed_drafts);
      if (st.spec_verify_steps > 0)
        out.spec_accept_length =
          double(st.spec_accepted_tokens + st.spec_verify_steps) / double(st.spec_verify_steps);
      if (!st.spec_recent.empty()) {
        double sum = 0;
        for (auto n : st.spec_recent)
          sum += n;
        out.spec_recent_accept_length = sum / double(st.spec_recent.size());
      }
      return out;
    },
    [self](step_atom) { step(self); });
}

} // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_options options,
                                runner_actor target, runner_actor draft,
                                RunnerManifest target_manifest, weight_updater_actor updater,
                                std::string initial_version,
                                std::shared_ptr<const model::bpe_tokenizer> tokenizer) {
  return sys.spawn(scheduler, options, std::move(target), std::move(draft), std::move(target_manifest),
                   std::move(updater), std::move(initial_version), std::move(tokenizer));
}

} // namespace rlserve
