#include "actors/runner_actor.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <unordered_map>

#include <xxhash.h>

#include "actors/guard.hpp"
#include "caf/all.hpp"
#include "messages/registration_check.hpp"
#include "kernels/bf16.hpp"
#include "kernels/spec_verify.hpp"
#include "model/qwen3.hpp"
#include "model/cuda_ipc.hpp"
#include "model/gpu_draft_distributions.hpp"
#include "model/nccl_group.hpp"
#include "model/qwen3_gpu.hpp"
#include "model/sampler.hpp"
#include "model/speculative.hpp"
#include "model/tensor_values.hpp"

namespace rlserve {

// CAF 0.17 does not check type IDs: a message type missing from messages/type_ids.hpp would
// work here and fail across processes.
static_assert(interface_registered<runner_actor>::value, "a message type of runner_actor is not in type_ids.hpp");

namespace {

struct sequence_state {
  model::kv_sequence kv;
  model::sampler sampler;
  model::sampling_config sampling;
  model::generation_history history; // what penalties and min_new_tokens read
};

struct runner_state {
  // Not an aggregate: under C++20, CAF 0.17's stateful_actor would otherwise try to build the
  // state from the actor pointer (parenthesized aggregate init makes is_constructible true).
  runner_state() = default;

  runner_options options;
  std::shared_ptr<model::qwen3_model> model; // parameters in load format (the source of truth)
  std::unique_ptr<model::kv_pool> pool; // CPU runner: shared by all sequences; blocks chosen by the scheduler
  // GPU runner: the device copy of `model` (weights, KV pool, graphs); null on the CPU runner.
  std::shared_ptr<model::qwen3_gpu_model> gpu;
  std::unordered_map<uint64_t, sequence_state> sequences;
  std::map<std::string, NamedTensor> staged; // by canonical name; a later bucket overwrites
  std::optional<std::map<std::string, HostTensor>> snapshot;
  std::optional<std::map<std::string, uint64_t>> gpu_snapshot; // GPU runner: digests of the device bytes
  uint64_t resets = 0; // seeds reset_tensors, so every reset writes different values
  // CPU runner: the tags release_memory_occupation marked (a GPU runner's model knows its own).
  model::qwen3_gpu_model::memory_tags cpu_released;
  static inline const char* name = "runner";
};

using runner_pointer = runner_actor::stateful_pointer<runner_state>;

model::sampling_config to_sampling_config(const SamplingParams& p,
                                          const std::vector<int32_t>& eos_token_ids) {
  model::sampling_config c;
  c.temperature = p.temperature;
  c.top_k = p.top_k;
  c.top_p = p.top_p;
  c.min_p = p.min_p;
  c.frequency_penalty = p.frequency_penalty;
  c.presence_penalty = p.presence_penalty;
  c.repetition_penalty = p.repetition_penalty;
  c.min_new_tokens = p.min_new_tokens;
  if (p.min_new_tokens > 0) {
    c.stop_ids = p.stop_token_ids;
    if (!p.ignore_eos)
      c.stop_ids.insert(c.stop_ids.end(), eos_token_ids.begin(), eos_token_ids.end());
  }
  return c;
}

// The logits a sequence samples from: its row as the forward wrote it, or, when its sampling
// reads what it generated (penalties, min_new_tokens), a changed copy in `scratch`.
std::span<const float> sampling_row(const sequence_state& seq, std::span<const float> row,
                                    std::vector<float>& scratch) {
  if (!seq.sampling.uses_history())
    return row;
  scratch.assign(row.begin(), row.end());
  model::apply_penalties(scratch, seq.history, seq.sampling);
  return scratch;
}

// The `n` most likely tokens of log_softmax(logits / T) (T = 1 for greedy), with the bits the
// sampled token's logprob has (model::top_logprobs).
std::vector<TopLogprob> top_logprobs(std::span<const float> logits, float temperature, int32_t n) {
  std::vector<TopLogprob> out;
  for (const auto& [token, logprob] : model::top_logprobs(logits, temperature, n))
    out.push_back({token, logprob});
  return out;
}

bool skipped(const std::string& name, const std::vector<std::string>& skip_list) {
  for (const auto& s : skip_list)
    if (!s.empty() && name.find(s) != std::string::npos)
      return true;
  return false;
}

RunnerManifest make_manifest(const runner_options& options, const model::qwen3_model& m,
                             const model::qwen3_gpu_model* gpu) {
  RunnerManifest out;
  out.role = options.role;
  out.tp_rank = options.tp_rank;
  out.tp_size = options.tp_size;
  out.model_path = options.model_path.string();
  out.architecture = m.config().architecture;
  out.device = gpu ? gpu->device_name() : "cpu";
  out.vocab_size = m.config().vocab_size;
  out.max_context_length = m.config().max_position_embeddings;
  out.eos_token_ids = m.config().eos_token_ids;
  out.kv_block_size = options.kv_block_size;
  out.kv_num_blocks = options.kv_num_blocks;
  for (auto& p : m.parameters())
    out.parameters.push_back({p.name, p.type, p.shape});
  if (m.config().tie_word_embeddings)
    out.aliases.push_back({"lm_head.weight", "model.embed_tokens.weight"});
  auto& caps = out.capabilities;
  caps.device_tensors = gpu != nullptr;
  // A GPU runner's weight_updater joins groups on its device (a draft reads what the target's
  // group received, on the same GPU).
  caps.weight_update_groups = gpu != nullptr && model::nccl_group::available();
  caps.device_checksums = gpu != nullptr;
  for (auto& p : m.parameters())
    if (p.name.ends_with(".weight_packed"))
      ++caps.int4_modules;
  if (const auto& q = m.quantization(); q && caps.int4_modules > 0) {
    caps.int4_update_recipe =
      std::string(kernels::to_string(q->recipe)) +
      (q->group_size == kernels::k_int4_channel ? " per channel" : " g" + std::to_string(q->group_size));
    caps.int4_quantized_on = gpu ? "device" : "host";
  }
  return out;
}

// Runs `items` as one batch. When the batch as a whole is refused (the forward checks every
// item before running any), the items at fault are found by trying each alone on a copy of its
// KV, marked failed in `errors` (by batch position), and the rest run without them. `items` and
// `owners` (the batch position each item runs) shrink to what ran; `row_of` gets each remaining
// item's first logits row; `routed_experts`, when given, the routing of every token that ran,
// item after item. With `spec` (a GPU runner), the first spec->size() items draw or verify on
// the device (model::gpu_spec_item): their row_of indexes spec_out's rows, the others' the
// host logits, and `spec` shrinks with the items.
status run_items(runner_state& st, std::vector<model::forward_item>& items,
                 std::vector<std::size_t>& owners, std::vector<std::string>& errors,
                 std::vector<float>& logits, std::vector<std::size_t>& row_of,
                 std::vector<int32_t>* routed_experts = nullptr,
                 std::vector<model::gpu_spec_item>* spec = nullptr,
                 model::gpu_spec_result* spec_out = nullptr) {
  auto n_spec = [&] { return spec ? spec->size() : std::size_t{0}; };
  auto rows = [&] {
    row_of.assign(items.size(), 0);
    std::size_t spec_row = 0, row = 0;
    for (std::size_t j = 0; j < items.size(); ++j) {
      auto& at = j < n_spec() ? spec_row : row;
      row_of[j] = at;
      at += static_cast<std::size_t>(items[j].logit_rows);
    }
  };
  rows();
  if (items.empty())
    return {};
  model::gpu_spec_result unused;
  auto forward = [&](std::span<model::forward_item> batch, std::vector<float>& out) {
    if (!st.gpu)
      return st.model->forward(*st.pool, batch, out, routed_experts);
    if (n_spec() == 0)
      return st.gpu->forward(batch, out, routed_experts);
    return st.gpu->forward(batch, out, routed_experts, *spec, spec_out ? *spec_out : unused);
  };
  if (auto ok = forward(items, logits); ok)
    return ok;
  std::vector<model::forward_item> good;
  std::vector<std::size_t> good_owners;
  std::vector<model::gpu_spec_item> good_spec;
  std::vector<float> scratch;
  for (std::size_t j = 0; j < items.size(); ++j) {
    auto probe = *items[j].kv; // a copy: checking must not advance the sequence
    model::forward_item single{&probe, items[j].tokens, items[j].logit_rows};
    auto s = st.gpu ? st.gpu->forward(std::span(&single, 1), scratch)
                    : st.model->forward(*st.pool, std::span(&single, 1), scratch);
    if (!s) {
      errors[owners[j]] = s.error();
    } else {
      good.push_back(items[j]);
      good_owners.push_back(owners[j]);
      if (j < n_spec())
        good_spec.push_back((*spec)[j]);
    }
  }
  items = std::move(good);
  owners = std::move(good_owners);
  if (spec)
    *spec = std::move(good_spec);
  rows();
  if (items.empty())
    return {};
  return forward(items, logits);
}

// A decode-only batch on the GPU runner: forward and sampling on the device, only tokens and
// logprobs come back (and the routing, for work that asks for it). Besides the plain decodes,
// work positions that are one sampled token (a decode that just got a new KV block, or that
// records its routing) qualify; anything else (prefill, speculation, top logprobs) takes the
// general path with logits on the host. Uniforms are peeked from each
// request's sampler and consumed only when the step ran, so a refused batch (which then takes
// the general path) draws nothing twice.
bool run_gpu_decodes(runner_state& st, ForwardBatch& batch, ForwardBatchOutput& out) {
  const auto W = batch.work.size();
  for (std::size_t i = 0; i < W; ++i) {
    const auto& w = batch.work[i];
    if (w.new_sequence || w.tokens.size() != 1 || !w.sample || w.propose > 0 ||
        !w.draft_tokens.empty() || w.top_logprobs_num > 0 || w.kv_length >= 0 ||
        !w.scored_tokens.empty() || w.return_top_p_token_ids)
      return false;
  }
  const bool routing = std::any_of(batch.work.begin(), batch.work.end(),
                                   [](const SequenceWork& w) { return w.return_routed_experts; });
  std::vector<sequence_state*> seqs;
  seqs.reserve(batch.size());
  for (auto id : batch.seq_ids) {
    auto it = st.sequences.find(id);
    if (it == st.sequences.end())
      return false; // the general path reports it
    if (it->second.sampling.uses_history())
      return false; // the device sampler has no penalties: logits go to the host
    seqs.push_back(&it->second);
  }
  std::vector<model::forward_item> items;
  std::vector<model::gpu_sample_row> rows;
  items.reserve(batch.size());
  rows.reserve(batch.size());
  std::vector<std::size_t> blocks_before(W);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto& seq = *seqs[i];
    const int32_t* token = i < W ? batch.work[i].tokens.data() : batch.decode_tokens.data() + (i - W);
    if (i < W) {
      blocks_before[i] = seq.kv.blocks.size();
      seq.kv.blocks.insert(seq.kv.blocks.end(), batch.work[i].new_blocks.begin(),
                           batch.work[i].new_blocks.end());
    }
    items.push_back({&seq.kv, std::span<const int32_t>(token, 1), 1});
    const bool greedy = model::is_greedy(seq.sampling);
    rows.push_back({greedy ? 0.0f : seq.sampling.temperature, seq.sampling.top_k,
                    seq.sampling.top_p, seq.sampling.min_p,
                    greedy ? 0.0f : seq.sampler.peek_uniform()});
  }
  std::vector<int32_t> routed; // [items, layers, top_k] when some work asks
  if (!st.gpu->forward_sample(items, rows, out.tokens, out.logprobs, routing ? &routed : nullptr)) {
    for (std::size_t i = 0; i < W; ++i) // the general path appends the new blocks itself
      seqs[i]->kv.blocks.resize(blocks_before[i]);
    out.tokens.clear();
    out.logprobs.clear();
    return false;
  }
  for (auto* seq : seqs)
    if (!model::is_greedy(seq->sampling))
      seq->sampler.consume_uniform();
  out.details.resize(W);
  const std::size_t per_item = routed.size() / batch.size(); // one token each
  for (std::size_t i = 0; i < W; ++i)
    if (batch.work[i].return_routed_experts)
      out.details[i].routed_experts.assign(routed.begin() + static_cast<std::ptrdiff_t>(i * per_item),
                                           routed.begin() + static_cast<std::ptrdiff_t>((i + 1) * per_item));
  return true;
}

ForwardBatchOutput run_batch_untraced(runner_state& st, ForwardBatch& batch);

model::qwen3_gpu_model::memory_tags released(const runner_state& st) {
  return st.gpu ? st.gpu->released_memory() : st.cpu_released;
}

// Why `what` cannot run while memory is released (the weights; with `all`, anything), or nothing.
std::optional<std::string> released_refusal(const runner_state& st, bool all, const std::string& what) {
  const auto r = released(st);
  std::string tags;
  auto add = [&](bool on, const char* tag) {
    if (on)
      tags += (tags.empty() ? "" : ", ") + std::string(tag);
  };
  add(r.weights, "weights");
  add(all && r.kv_cache, "kv_cache");
  add(all && r.cuda_graph, "cuda_graph");
  if (tags.empty())
    return std::nullopt;
  return "the " + st.options.role + " runner cannot " + what + ": the memory of " + tags +
         " is released (resume_memory_occupation first)";
}

RunnerReply change_memory(runner_state& st, const std::vector<std::string>& requested, bool release) {
  const auto tag_names = canonical_memory_tags(requested);
  auto named = [&](std::string_view tag) {
    return std::find(tag_names.begin(), tag_names.end(), tag) != tag_names.end();
  };
  const model::qwen3_gpu_model::memory_tags tags{named("weights"), named("kv_cache"), named("cuda_graph")};
  std::string names;
  for (const auto& n : tag_names)
    names += (names.empty() ? "" : ", ") + n;
  if (!st.gpu) {
    auto& r = st.cpu_released;
    if (tags.weights) r.weights = release;
    if (tags.kv_cache) r.kv_cache = release;
    if (tags.cuda_graph) r.cuda_graph = release;
    return {true, st.options.role + " runner (CPU): " + (release ? "marked released" : "resumed") + ": " + names +
                    " (its memory is host memory and stays allocated)"};
  }
  const auto before = st.gpu->mapped_bytes();
  auto done = release ? st.gpu->release_memory(tags, st.options.weights_cpu_backup) : st.gpu->resume_memory(tags);
  if (done && release && tags.cuda_graph && st.options.draft_distributions && st.options.role == "draft")
    st.options.draft_distributions->trim(); // what released sequences held
  if (!done)
    return {false, st.options.role + " runner: " + done.error()};
  const auto after = st.gpu->mapped_bytes();
  const auto moved = release ? before - std::min(before, after) : after - std::min(before, after);
  return {true, st.options.role + " runner: " + (release ? "released " : "took ") + std::to_string(moved >> 20) +
                  " MiB on " + st.gpu->device_name() + " (" + names + ")" +
                  (release && tags.weights && st.options.weights_cpu_backup ? "; weights backed up in host memory" : "")};
}

// One forward batch, traced on the runner's timeline while a profile runs (forward and sampling
// together; on the GPU the host waits for the device inside it).
ForwardBatchOutput run_batch(runner_state& st, ForwardBatch& batch) {
  auto refuse = [&](std::string why) {
    ForwardBatchOutput out;
    out.success = false;
    out.message = std::move(why);
    out.step = batch.step;
    return out;
  };
  if (auto why = released_refusal(st, true, "run a forward batch"))
    return refuse(*why);
  if (batch.seq_ids.size() != batch.work.size() + batch.decode_tokens.size())
    return refuse("a forward batch names " + std::to_string(batch.seq_ids.size()) +
                  " sequences for " + std::to_string(batch.work.size()) + " work entries and " +
                  std::to_string(batch.decode_tokens.size()) + " plain decodes");
  const auto& profile = st.options.profile;
  if (!profile || !profile->active())
    return run_batch_untraced(st, batch);
  const auto begin = profiler::clock::now();
  auto out = run_batch_untraced(st, batch);
  int64_t tokens = static_cast<int64_t>(batch.decode_tokens.size());
  for (const auto& w : batch.work)
    tokens += static_cast<int64_t>(w.tokens.size());
  profile->record("runner " + st.options.role, "run_batch", begin, profiler::clock::now(),
                  "{\"step\":" + std::to_string(batch.step) + ",\"sequences\":" +
                    std::to_string(batch.size()) +
                    ",\"tokens\":" + std::to_string(tokens) + "}");
  return out;
}

// One forward batch on the general path (logits on the host), in its phases: every position is
// checked and becomes a forward item (prepare_work for work positions, prepare_decodes for the
// plain decodes); one forward runs them all (forward_all); each item's rows are then used
// (use_rows): a verification verifies, a proposal proposes, a sampling position samples, after
// scoring its prompt rows; draft proposals continue one forward per proposal
// (continue_proposals). Everything is indexed by the batch's positions: errors, out.tokens and
// out.logprobs by every position, out.details by the work positions.
//
// On a GPU runner, verifications and proposals run on the device where they can (on_device):
// their items go first in the forward as model::gpu_spec_item, their logits never reach the
// host, and a sampled draft's distributions stay in options.draft_distributions for the target.
// Positions that want top logprobs (or prompt scores, for a proposal) take the host path.
struct batch_run {
  runner_state& st;
  ForwardBatch& batch;
  ForwardBatchOutput& out;
  const std::size_t vocab;
  const std::size_t W, N; // work positions, all positions
  std::vector<std::string> errors;
  std::vector<std::vector<int32_t>> verify_tokens; // per work position: pending token + proposals
  std::vector<model::forward_item> items;
  std::vector<std::size_t> owners; // items[j] runs position owners[j]
  std::vector<float> logits;
  std::vector<std::size_t> row_of;
  std::vector<std::size_t> proposing; // work positions still proposing after a forward
  std::vector<float> probs;           // a draft's distribution (scratch)
  std::vector<float> penalized;       // sampling_row's scratch
  std::vector<int32_t> kept;          // a sampled token's kept set (top-p replay; scratch)
  // On the device: items that run first in the forward, and what they draw and verify with.
  std::vector<model::forward_item> spec_items;
  std::vector<std::size_t> spec_owners;
  std::vector<model::gpu_spec_item> spec;
  model::gpu_spec_result spec_out;
  std::size_t n_spec = 0;                        // after a forward: items[0 .. n_spec) drew or verified
  std::vector<std::vector<float>> uniforms;      // per work position (stable: spec items point here)
  std::vector<std::vector<const float*>> q_rows; // per work position

  batch_run(runner_state& s, ForwardBatch& b, ForwardBatchOutput& o)
      : st(s), batch(b), out(o), vocab(static_cast<std::size_t>(s.model->config().vocab_size)),
        W(b.work.size()), N(b.size()), errors(N), verify_tokens(W), uniforms(W), q_rows(W) {
    out.tokens.assign(N, -1);
    out.logprobs.assign(N, 0.0f);
    out.details.resize(W);
  }

  std::span<const float> row(std::size_t j, std::size_t n) const {
    return std::span<const float>(logits.data() + (row_of[j] + n) * vocab, vocab);
  }

  std::string unknown(uint64_t seq_id) const {
    return "sequence " + std::to_string(seq_id) + " is unknown to the " + st.options.role +
           " runner (released, or never started)";
  }

  // A new sequence whose first cached_tokens positions another request computed: the whole
  // blocks are in its table already, a partial one is copied from copy_from_block into its
  // next block (before this batch's forward, which may write the source's block anew).
  std::string start_after_cached_prefix(const SequenceWork& work, model::kv_sequence& kv) {
    const int64_t block_size = st.pool ? st.pool->block_size() : st.options.kv_block_size;
    const int64_t num_blocks = st.pool ? st.pool->num_blocks() : st.options.kv_num_blocks;
    const int64_t whole = work.cached_tokens / block_size, copied = work.cached_tokens % block_size;
    if (work.cached_tokens < 0 || whole + (copied > 0 ? 1 : 0) > static_cast<int64_t>(kv.blocks.size()))
      return "a cached prefix of " + std::to_string(work.cached_tokens) + " positions does not fit its " +
             std::to_string(kv.blocks.size()) + " blocks of " + std::to_string(block_size);
    if (copied > 0) {
      const auto to = kv.blocks[static_cast<std::size_t>(whole)];
      if (work.copy_from_block < 0 || work.copy_from_block >= num_blocks || work.copy_from_block == to)
        return "a cached prefix of " + std::to_string(work.cached_tokens) +
               " positions needs a block to copy its last " + std::to_string(copied) +
               " from, got block " + std::to_string(work.copy_from_block);
      if (st.gpu) {
        if (auto s = st.gpu->copy_kv_slots(work.copy_from_block, to, copied); !s)
          return s.error();
      } else {
        st.pool->copy_slots(work.copy_from_block, to, copied);
      }
    }
    kv.length = work.cached_tokens;
    return {};
  }

  // Work position i: its sequence (new or known), its KV cut and blocks, and its forward item;
  // or why not.
  std::string prepare_work(std::size_t i) {
    auto& work = batch.work[i];
    const auto seq_id = batch.seq_ids[i];
    const auto id = std::to_string(seq_id);
    if (work.new_sequence) {
      st.sequences.erase(seq_id);
      auto& seq = st.sequences
                    .emplace(seq_id,
                             sequence_state{{}, model::sampler{work.sampling_seed},
                                            to_sampling_config(work.sampling_params,
                                                               st.model->config().eos_token_ids),
                                            {}})
                    .first->second;
      for (int32_t t : work.generated_tokens)
        seq.history.add(t);
    }
    auto it = st.sequences.find(seq_id);
    if (it == st.sequences.end())
      return unknown(seq_id);
    auto& seq = it->second;
    auto& kv = seq.kv;
    kv.blocks.insert(kv.blocks.end(), work.new_blocks.begin(), work.new_blocks.end());
    if (work.new_sequence && work.cached_tokens != 0)
      if (auto why = start_after_cached_prefix(work, kv); !why.empty())
        return "sequence " + id + ": " + why;
    if (work.kv_length > kv.length)
      return "sequence " + id + ": asked to keep " + std::to_string(work.kv_length) +
             " KV positions but holds only " + std::to_string(kv.length);
    if (work.kv_length >= 0)
      kv.length = work.kv_length; // drop rejected or stale positions; their blocks stay
    if (work.tokens.empty())
      return "sequence " + id + ": no tokens to run";
    // The scheduler never speculates for these: each position's distribution would depend on
    // the proposals before it.
    if ((!work.draft_tokens.empty() || work.propose > 0) && seq.sampling.uses_history())
      return "sequence " + id + ": penalties and min_new_tokens are not speculated";
    if (!work.draft_tokens.empty())
      return prepare_verification(i, seq);
    const auto sampled_rows = (work.sample || work.propose > 0) ? 1 : 0;
    if (work.scored_tokens.size() + sampled_rows > work.tokens.size())
      return "sequence " + id + ": asked to score " + std::to_string(work.scored_tokens.size()) +
             " positions of a chunk of " + std::to_string(work.tokens.size()) + " tokens";
    if (work.propose > 0 && proposes_on_device(i, seq))
      return add_proposal(i, seq, work.tokens);
    items.push_back({&kv, work.tokens, static_cast<int64_t>(work.scored_tokens.size()) + sampled_rows});
    owners.push_back(i);
    return {};
  }

  static model::gpu_sample_row device_sampling(const sequence_state& seq) {
    const bool greedy = model::is_greedy(seq.sampling);
    return {greedy ? 0.0f : seq.sampling.temperature, seq.sampling.top_k, seq.sampling.top_p,
            seq.sampling.min_p, 0.0f};
  }

  // A verification runs on the device unless it wants top logprobs (rows on the host) or more
  // proposals than the device verifies at once; a sampled one needs the draft's rows there.
  bool verifies_on_device(const SequenceWork& work, const sequence_state& seq) const {
    return st.gpu && work.top_logprobs_num == 0 &&
           static_cast<int64_t>(work.draft_tokens.size()) <= kernels::k_spec_verify_max_draft &&
           (model::is_greedy(seq.sampling) || work.draft_probs_on_device);
  }

  // A proposal runs on the device when its chunk scores nothing and, sampled, its distribution
  // has somewhere to stay.
  bool proposes_on_device(std::size_t i, const sequence_state& seq) const {
    const auto& work = batch.work[i];
    return st.gpu && work.scored_tokens.empty() && work.top_logprobs_num == 0 &&
           (model::is_greedy(seq.sampling) || st.options.draft_distributions);
  }

  // Work position i verifies its proposals: on the device (a spec item) or on the host (the
  // draft's distributions downloaded when they are on the device). A sampled verification
  // takes its k + 1 uniforms here, in model::verify_draft's order, whichever path it takes.
  std::string prepare_verification(std::size_t i, sequence_state& seq) {
    auto& work = batch.work[i];
    const auto seq_id = batch.seq_ids[i];
    const auto id = std::to_string(seq_id);
    const auto k = work.draft_tokens.size();
    const bool greedy = model::is_greedy(seq.sampling);
    if (work.tokens.size() != 1 ||
        (!greedy && !work.draft_probs_on_device && work.draft_probs.size() != k * vocab))
      return "sequence " + id + ": a verification needs one pending token and, when sampling, " +
             std::to_string(k) + " draft distributions of " + std::to_string(vocab) + " entries";
    const auto& store = st.options.draft_distributions;
    if (!greedy && work.draft_probs_on_device && !store)
      return "sequence " + id + ": the draft's distributions are on the device, and the " + st.options.role +
             " runner has no access to them";
    auto& all = verify_tokens[i];
    all = work.tokens;
    all.insert(all.end(), work.draft_tokens.begin(), work.draft_tokens.end());
    if (!verifies_on_device(work, seq)) {
      if (!greedy && work.draft_probs_on_device) {
        auto host = store->download(seq_id, static_cast<int64_t>(k));
        if (!host)
          return "sequence " + id + ": " + host.error();
        work.draft_probs = std::move(*host);
      }
      items.push_back({&seq.kv, all, static_cast<int64_t>(all.size())});
      owners.push_back(i);
      return {};
    }
    model::gpu_spec_item x;
    x.sampling = device_sampling(seq);
    x.draft_tokens = work.draft_tokens;
    if (!greedy) {
      auto rows = store->rows(seq_id, static_cast<int64_t>(k));
      if (!rows)
        return "sequence " + id + ": " + rows.error();
      q_rows[i] = std::move(*rows);
      x.draft_rows = q_rows[i];
      for (std::size_t j = 0; j <= k; ++j)
        uniforms[i].push_back(seq.sampler.uniform());
      x.uniforms = uniforms[i];
    }
    spec_items.push_back({&seq.kv, all, static_cast<int64_t>(all.size())});
    spec_owners.push_back(i);
    spec.push_back(x);
    return {};
  }

  // Work position i runs `tokens` and draws its next proposal on the device (one uniform, as
  // the host's sampler::draw takes); a sampled draw keeps its distribution for the target.
  std::string add_proposal(std::size_t i, sequence_state& seq, std::span<const int32_t> tokens) {
    const auto seq_id = batch.seq_ids[i];
    model::gpu_spec_item x;
    x.sampling = device_sampling(seq);
    if (!model::is_greedy(seq.sampling)) {
      auto& u = uniforms[i];
      u.assign(1, seq.sampler.uniform());
      x.uniforms = u;
      const auto index = static_cast<int64_t>(out.details[i].proposed_tokens.size());
      auto row = st.options.draft_distributions->row_for_writing(seq_id, index);
      if (!row)
        return "sequence " + std::to_string(seq_id) + ": " + row.error();
      x.keep_row = *row;
    }
    spec_items.push_back({&seq.kv, tokens, 1});
    spec_owners.push_back(i);
    spec.push_back(x);
    return {};
  }

  // The spec items first, then the others, as one list for run_items (which keeps `spec` in
  // step with the items it drops); afterwards n_spec says where the spec items end.
  status run_with_spec(std::vector<int32_t>* routed) {
    if (!spec_items.empty()) {
      spec_items.insert(spec_items.end(), items.begin(), items.end());
      spec_owners.insert(spec_owners.end(), owners.begin(), owners.end());
      items = std::move(spec_items);
      owners = std::move(spec_owners);
    }
    spec_items.clear();
    spec_owners.clear();
    auto ok = run_items(st, items, owners, errors, logits, row_of, routed, &spec, &spec_out);
    n_spec = spec.size();
    return ok;
  }

  // The plain decodes: one token each, no allocation per sequence.
  void prepare_decodes() {
    for (std::size_t i = W; i < N; ++i) {
      auto it = st.sequences.find(batch.seq_ids[i]);
      if (it == st.sequences.end()) {
        errors[i] = unknown(batch.seq_ids[i]);
        continue;
      }
      items.push_back({&it->second.kv, std::span<const int32_t>(&batch.decode_tokens[i - W], 1), 1});
      owners.push_back(i);
    }
  }

  // The one forward of the batch; the routing of the work positions that ask for it.
  status forward_all() {
    const bool routing = std::any_of(batch.work.begin(), batch.work.end(),
                                     [](const SequenceWork& w) { return w.return_routed_experts; });
    std::vector<int32_t> routed; // [tokens of all items, layers, top_k] when some work asks
    if (auto ok = run_with_spec(routing ? &routed : nullptr); !ok)
      return ok;
    if (!routing)
      return {};
    std::size_t tokens = 0;
    for (const auto& item : items)
      tokens += item.tokens.size();
    const std::size_t per_token = tokens > 0 ? routed.size() / tokens : 0;
    std::size_t first = 0;
    for (std::size_t j = 0; j < items.size(); ++j) {
      const auto n = items[j].tokens.size();
      if (owners[j] < W && batch.work[owners[j]].return_routed_experts)
        out.details[owners[j]].routed_experts.assign(
          routed.begin() + static_cast<std::ptrdiff_t>(first * per_token),
          routed.begin() + static_cast<std::ptrdiff_t>((first + n) * per_token));
      first += n;
    }
    return {};
  }

  // Prompt logprobs: the rows before the sampled one score the tokens that follow them.
  void score_prompt(std::size_t j, const SequenceWork& work, const sequence_state& seq, WorkResult& r) {
    for (std::size_t n = 0; n < work.scored_tokens.size(); ++n) {
      r.scored_logprobs.push_back(model::token_logprob(row(j, n), seq.sampling.temperature, work.scored_tokens[n]));
      if (work.top_logprobs_num > 0)
        r.scored_top_logprobs.push_back(top_logprobs(row(j, n), seq.sampling.temperature, work.top_logprobs_num));
    }
  }

  // The target's side of speculation: the proposals it keeps go to the details, its own token
  // (a correction or a bonus) is the position's sampled token.
  void verify(std::size_t j, std::size_t i, sequence_state& seq) {
    const auto& work = batch.work[i];
    auto& r = out.details[i];
    const auto k = work.draft_tokens.size();
    auto v = model::verify_draft(seq.sampler, seq.sampling,
                                 std::span<const float>(logits.data() + row_of[j] * vocab, (k + 1) * vocab),
                                 static_cast<int64_t>(vocab), work.draft_tokens, work.draft_probs);
    // The forward stored all k + 1 positions; keep the pending token and the accepted ones.
    seq.kv.length -= static_cast<int64_t>(k) - v.accepted;
    if (work.top_logprobs_num > 0)
      for (std::size_t n = 0; n < v.tokens.size(); ++n)
        r.top_logprobs.push_back(top_logprobs(row(j, n), seq.sampling.temperature, work.top_logprobs_num));
    const auto kept = static_cast<std::ptrdiff_t>(v.accepted);
    r.accepted_tokens.assign(v.tokens.begin(), v.tokens.begin() + kept);
    r.accepted_logprobs.assign(v.logprobs.begin(), v.logprobs.begin() + kept);
    out.tokens[i] = v.tokens.back();
    out.logprobs[i] = v.logprobs.back();
  }

  // The device's verification of item j (position i): as verify(), from spec_out's rows.
  void verify_on_device(std::size_t j, std::size_t i, sequence_state& seq) {
    auto& r = out.details[i];
    const auto k = static_cast<int64_t>(batch.work[i].draft_tokens.size());
    const auto accepted = spec_out.accepted[j];
    const auto at = static_cast<std::ptrdiff_t>(row_of[j]);
    seq.kv.length -= k - accepted;
    r.accepted_tokens.assign(spec_out.tokens.begin() + at, spec_out.tokens.begin() + at + accepted);
    r.accepted_logprobs.assign(spec_out.logprobs.begin() + at, spec_out.logprobs.begin() + at + accepted);
    out.tokens[i] = spec_out.tokens[static_cast<std::size_t>(at + accepted)];
    out.logprobs[i] = spec_out.logprobs[static_cast<std::size_t>(at + accepted)];
  }

  // The device's proposal of item j (position i).
  void propose_on_device(std::size_t j, std::size_t i, const sequence_state& seq) {
    auto& r = out.details[i];
    r.proposed_tokens.push_back(spec_out.tokens[row_of[j]]);
    r.draft_probs_on_device = !model::is_greedy(seq.sampling);
  }

  // A draft's proposal from `logits_row`, with the distribution it came from (sampling only).
  void propose(std::span<const float> logits_row, sequence_state& seq, WorkResult& r) {
    seq.sampler.distribution(logits_row, seq.sampling, probs);
    r.proposed_tokens.push_back(seq.sampler.draw(probs));
    if (!model::is_greedy(seq.sampling))
      r.draft_probs.insert(r.draft_probs.end(), probs.begin(), probs.end());
  }

  // Position i samples its next token from `logits_row` (a plain decode's or a work's last row).
  void sample(std::size_t i, std::span<const float> logits_row, sequence_state& seq) {
    auto row_used = sampling_row(seq, logits_row, penalized);
    const bool replay = i < W && batch.work[i].return_top_p_token_ids;
    auto sampled = seq.sampler.sample(row_used, seq.sampling, replay ? &kept : nullptr);
    if (replay) {
      auto& r = out.details[i];
      r.top_p_token_ids.insert(r.top_p_token_ids.end(), kept.begin(), kept.end());
      r.top_p_token_counts.push_back(static_cast<int32_t>(kept.size()));
    }
    if (seq.sampling.uses_history())
      seq.history.add(sampled.token);
    out.tokens[i] = sampled.token;
    out.logprobs[i] = sampled.logprob;
    if (i < W && batch.work[i].top_logprobs_num > 0)
      out.details[i].top_logprobs.push_back(
        top_logprobs(row_used, seq.sampling.temperature, batch.work[i].top_logprobs_num));
  }

  void use_rows() {
    for (std::size_t j = 0; j < items.size(); ++j) {
      const auto i = owners[j];
      auto& seq = st.sequences.at(batch.seq_ids[i]);
      if (j < n_spec) {
        if (!batch.work[i].draft_tokens.empty()) {
          verify_on_device(j, i, seq);
        } else {
          propose_on_device(j, i, seq);
          if (batch.work[i].propose > 1)
            proposing.push_back(i);
        }
        continue;
      }
      if (i >= W) {
        sample(i, row(j, 0), seq);
        continue;
      }
      const auto& work = batch.work[i];
      if (!work.draft_tokens.empty()) {
        verify(j, i, seq);
        continue;
      }
      score_prompt(j, work, seq, out.details[i]);
      const auto sampled_row = row(j, work.scored_tokens.size());
      if (work.propose > 0) {
        propose(sampled_row, seq, out.details[i]);
        if (work.propose > 1)
          proposing.push_back(i);
      } else if (work.sample) {
        sample(i, sampled_row, seq);
      }
    }
  }

  // Draft proposals after the first: one forward per proposal, every proposing sequence in it.
  void continue_proposals() {
    while (!proposing.empty()) {
      items.clear();
      owners.clear();
      spec.clear();
      for (auto i : proposing) {
        auto& seq = st.sequences.at(batch.seq_ids[i]);
        const auto last = std::span<const int32_t>(&out.details[i].proposed_tokens.back(), 1);
        if (proposes_on_device(i, seq)) {
          if (auto why = add_proposal(i, seq, last); !why.empty())
            errors[i] = why;
          continue;
        }
        items.push_back({&seq.kv, last, 1});
        owners.push_back(i);
      }
      if (auto ok = run_with_spec(nullptr); !ok) {
        for (auto i : owners)
          errors[i] = ok.error();
        return;
      }
      std::vector<std::size_t> still;
      for (std::size_t j = 0; j < items.size(); ++j) {
        const auto i = owners[j];
        auto& r = out.details[i];
        if (j < n_spec)
          propose_on_device(j, i, st.sequences.at(batch.seq_ids[i]));
        else
          propose(row(j, 0), st.sequences.at(batch.seq_ids[i]), r);
        if (static_cast<int32_t>(r.proposed_tokens.size()) < batch.work[i].propose)
          still.push_back(i);
      }
      proposing = std::move(still);
    }
  }

  // Failed positions answer with their error and nothing else; the others stand.
  void report_errors() {
    bool any = false;
    for (std::size_t i = 0; i < N; ++i) {
      if (errors[i].empty())
        continue;
      any = true;
      out.tokens[i] = -1;
      out.logprobs[i] = 0.0f;
      if (i < W)
        out.details[i] = WorkResult{};
    }
    if (any)
      out.errors = std::move(errors);
  }
};

ForwardBatchOutput run_batch_untraced(runner_state& st, ForwardBatch& batch) {
  ForwardBatchOutput out;
  out.step = batch.step;
  if (st.gpu && batch.size() > 0 && run_gpu_decodes(st, batch, out))
    return out;
  batch_run run(st, batch, out);
  for (std::size_t i = 0; i < run.W; ++i)
    run.errors[i] = run.prepare_work(i);
  run.prepare_decodes();
  if (auto ok = run.forward_all(); !ok) {
    out.success = false;
    out.message = ok.error();
    return out;
  }
  run.use_rows();
  run.continue_proposals();
  run.report_errors();
  return out;
}

// A GPU runner stages on the device: its host model keeps the weights it was loaded with only
// for names, dtypes and shapes, and every read of weight bytes (checksums, snapshots,
// get_weights_by_name) goes to the device.
// Whether a device staging error left the staging area as it was (the model's messages say so).
bool refused_whole(const std::string& error) {
  return error.find("nothing from this message was staged") != std::string::npos &&
         error.find("were dropped") == std::string::npos;
}

RunnerReply stage_on_device(runner_state& st, StageTensors& msg) {
  if (auto s = st.gpu->stage_host(msg.tensors, st.options.allow_non_finite_weights); !s)
    return {false, st.options.role + " runner: " + s.error(), refused_whole(s.error())};
  return {true, "staged " + std::to_string(msg.tensors.size()) + " tensors on " + st.gpu->device_name() +
                  " (" + std::to_string(st.gpu->staged_bytes() >> 20) + " MiB staged in this session)"};
}

RunnerReply stage_device_tensors(runner_state& st, StageDeviceTensors& msg) {
  if (!st.gpu)
    return {false, "the " + st.options.role + " runner runs on the CPU and cannot read CUDA IPC "
                   "tensors; send the tensors inline (named_tensors) instead", true};
  auto mapping = model::ipc_mapping::open(msg.tensors, st.gpu->options().device);
  if (!mapping)
    return {false, st.options.role + " runner: " + mapping.error() + "; nothing from this message was staged", true};
  auto& map = **mapping;
  if (auto s = map.wait_for_producer(); !s) {
    (void)map.close(); // the wait's failure is the one to report
    return {false, st.options.role + " runner: " + s.error() + "; nothing from this message was staged", true};
  }
  std::vector<model::qwen3_gpu_model::update_source> sources;
  sources.reserve(msg.tensors.size());
  for (std::size_t i = 0; i < msg.tensors.size(); ++i)
    sources.push_back({msg.tensors[i].name, map.data(i), msg.tensors[i].tensor.type, msg.tensors[i].tensor.shape});
  auto staged = st.gpu->stage(sources, st.options.allow_non_finite_weights);
  // Closed before the reply either way: the trainer may free or reuse its buffers after it.
  auto closed = map.close();
  if (!staged)
    return {false, st.options.role + " runner: " + staged.error(), refused_whole(staged.error())};
  if (!closed)
    return {false, st.options.role + " runner: the tensors were staged, but " + closed.error(), true};
  return {true, "staged " + std::to_string(msg.tensors.size()) + " device tensors on " +
                  st.gpu->device_name() + " (" + std::to_string(st.gpu->staged_bytes() >> 20) +
                  " MiB staged in this session)"};
}

RunnerReply stage(runner_state& st, StageTensors& msg) {
  if (st.gpu)
    return stage_on_device(st, msg);
  // Validate the whole message before keeping any of it.
  std::map<std::string, const NamedTensor*> seen;
  for (const auto& t : msg.tensors) {
    if (auto ok = st.model->validate(t); !ok)
      return {false, ok.error()};
    if (!seen.emplace(t.name, &t).second)
      return {false, "tensor '" + t.name + "' appears twice in one update message"};
  }
  for (auto& t : msg.tensors)
    st.staged[t.name] = t;
  return {true, "staged " + std::to_string(msg.tensors.size()) + " tensors (" +
                  std::to_string(st.staged.size()) + " in this session)"};
}

RunnerReply commit(runner_state& st) {
  if (st.gpu) {
    auto done = st.gpu->commit_staged();
    if (!done)
      return {false, st.options.role + " runner could not commit: " + done.error()};
    return {true, *done};
  }
  std::vector<NamedTensor> tensors;
  tensors.reserve(st.staged.size());
  for (auto& [name, t] : st.staged)
    tensors.push_back(t);
  if (auto ok = st.model->assign(tensors); !ok)
    return {false, st.options.role + " runner could not commit: " + ok.error()};
  auto n = st.staged.size();
  st.staged.clear();
  return {true, "committed " + std::to_string(n) + " tensors"};
}

// Random values of the tensor's own dtype: uniform floats in [-1, 1) for float types, random
// bits for integer types (the full range), as SGLang's checker does.
HostTensor random_like(const HostTensor& t, std::mt19937_64& rng) {
  std::vector<std::byte> bytes(t.nbytes);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto put16 = [&](std::size_t i, uint16_t v) { std::memcpy(bytes.data() + 2 * i, &v, 2); };
  auto n = static_cast<std::size_t>(t.numel());
  switch (t.type) {
    case dtype::bf16:
      for (std::size_t i = 0; i < n; ++i)
        put16(i, kernels::float_to_bf16(uniform(rng)));
      break;
    case dtype::f16:
      for (std::size_t i = 0; i < n; ++i)
        put16(i, kernels::float_to_f16(uniform(rng)));
      break;
    case dtype::f32:
      for (std::size_t i = 0; i < n; ++i) {
        float v = uniform(rng);
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      }
      break;
    case dtype::f64:
      for (std::size_t i = 0; i < n; ++i) {
        double v = uniform(rng);
        std::memcpy(bytes.data() + 8 * i, &v, 8);
      }
      break;
    case dtype::i8:
    case dtype::u8:
    case dtype::i16:
    case dtype::i32:
    case dtype::i64:
      for (auto& b : bytes)
        b = static_cast<std::byte>(rng());
      break;
    case dtype::boolean:
      for (auto& b : bytes)
        b = static_cast<std::byte>(rng() & 1u);
      break;
  }
  return HostTensor::adopt(t.type, t.shape, std::move(bytes));
}

RunnerCheckOutput check_failed(std::string message) {
  RunnerCheckOutput out;
  out.success = false;
  out.message = std::move(message);
  return out;
}

// Names whose bytes the device serves (everything but INT4 modules' weight_shape, which is the
// module's shape and never changes), and the rest, whose bytes the host keeps.
bool served_on_device(const std::string& name) { return !name.ends_with(".weight_shape"); }

// check() on a GPU runner: digests of the device bytes; snapshot/compare by digest.
RunnerCheckOutput check_on_device(runner_state& st, const CheckWeightsReqInput& req) {
  RunnerCheckOutput out;
  out.role = st.options.role;
  std::vector<std::string> names;
  for (const auto& p : st.model->parameters())
    if (!skipped(p.name, req.skip_tensor_list))
      names.push_back(p.name);
  auto digest_all = [&]() -> expected<std::map<std::string, uint64_t>> {
    std::vector<std::string> device_names;
    std::map<std::string, uint64_t> d;
    for (const auto& n : names) {
      if (served_on_device(n)) {
        device_names.push_back(n);
        continue;
      }
      auto t = st.model->parameter(n);
      if (!t)
        return std::move(t).take_failure();
      d[n] = XXH3_64bits(t->data.get(), t->nbytes);
    }
    auto dev = st.gpu->digests(device_names);
    if (!dev)
      return std::move(dev).take_failure();
    for (std::size_t i = 0; i < device_names.size(); ++i)
      d[device_names[i]] = (*dev)[i];
    return d;
  };
  switch (req.action) {
    case check_weights_action::checksum: {
      auto d = digest_all();
      if (!d)
        return check_failed(d.error());
      for (auto& [name, digest] : *d) {
        out.names.push_back(name);
        out.digests.push_back(digest);
      }
      out.message = std::to_string(out.names.size()) + " tensors hashed on " + st.gpu->device_name();
      return out;
    }
    case check_weights_action::snapshot: {
      auto d = digest_all();
      if (!d)
        return check_failed(d.error());
      out.message = "snapshot of " + std::to_string(d->size()) + " tensors (their digests on " +
                    st.gpu->device_name() + ")";
      st.gpu_snapshot = std::move(*d);
      return out;
    }
    case check_weights_action::compare: {
      if (!st.gpu_snapshot)
        return check_failed("the " + st.options.role +
                            " runner has no snapshot to compare with; run check_weights with "
                            "action \"snapshot\" first");
      auto d = digest_all();
      if (!d)
        return check_failed(d.error());
      for (auto& [name, digest] : *d) {
        auto it = st.gpu_snapshot->find(name);
        (it != st.gpu_snapshot->end() && it->second == digest ? out.unchanged : out.changed).push_back(name);
      }
      out.message = std::to_string(out.changed.size()) + " of " +
                    std::to_string(out.changed.size() + out.unchanged.size()) +
                    " tensors differ from the snapshot";
      return out;
    }
    case check_weights_action::reset_tensors: {
      if (st.gpu->staged_bytes() > 0)
        return check_failed("reset_tensors would commit what the open weight-update session staged "
                            "on the " + st.options.role + " runner; end or abort the session first");
      std::mt19937_64 rng(0x5eed0000u + st.resets++);
      std::vector<NamedTensor> poisoned;
      for (const auto& n : names) {
        if (!served_on_device(n))
          continue;
        auto t = st.model->parameter(n);
        if (!t)
          return check_failed(t.error());
        poisoned.push_back({n, random_like(*t, rng)});
      }
      // Random bits are valid INT4 codes and zero points; random scales in [-1, 1) are finite.
      if (auto s = st.gpu->stage_host(poisoned, true); !s)
        return check_failed(s.error());
      if (auto c = st.gpu->commit_staged(); !c)
        return check_failed(c.error());
      out.message = "overwrote " + std::to_string(poisoned.size()) + " tensors with random values on " +
                    st.gpu->device_name();
      return out;
    }
  }
  return check_failed("unknown check_weights action");
}

RunnerCheckOutput check(runner_state& st, const CheckWeightsReqInput& req) {
  if (auto why = released_refusal(st, false, "read its weights")) {
    RunnerCheckOutput out;
    out.success = false;
    out.message = *why;
    out.role = st.options.role;
    return out;
  }
  if (st.gpu)
    return check_on_device(st, req);
  RunnerCheckOutput out;
  out.role = st.options.role;
  auto params = st.model->parameters();
  switch (req.action) {
    case check_weights_action::checksum:
      for (const auto& p : params) {
        if (skipped(p.name, req.skip_tensor_list))
          continue;
        auto t = st.model->parameter(p.name);
        if (!t)
          return check_failed(t.error());
        out.names.push_back(p.name);
        out.digests.push_back(XXH3_64bits(t->data.get(), t->nbytes));
      }
      out.message = std::to_string(out.names.size()) + " tensors hashed";
      return out;
    case check_weights_action::snapshot: {
      std::map<std::string, HostTensor> snap;
      for (const auto& p : params) {
        if (skipped(p.name, req.skip_tensor_list))
          continue;
        auto t = st.model->parameter(p.name);
        if (!t)
          return check_failed(t.error());
        snap.emplace(p.name, std::move(*t)); // shares the immutable bytes: no copy
      }
      out.message = "snapshot of " + std::to_string(snap.size()) + " tensors";
      st.snapshot = std::move(snap);
      return out;
    }
    case check_weights_action::compare: {
      if (!st.snapshot)
        return check_failed("the " + st.options.role +
                         " runner has no snapshot to compare with; run check_weights with "
                         "action \"snapshot\" first");
      for (const auto& p : params) {
        if (skipped(p.name, req.skip_tensor_list))
          continue;
        auto t = st.model->parameter(p.name);
        if (!t)
          return check_failed(t.error());
        auto it = st.snapshot->find(p.name);
        bool same = it != st.snapshot->end() && it->second.nbytes == t->nbytes &&
                    std::memcmp(it->second.data.get(), t->data.get(), t->nbytes) == 0;
        (same ? out.unchanged : out.changed).push_back(p.name);
      }
      out.message = std::to_string(out.changed.size()) + " of " +
                    std::to_string(out.changed.size() + out.unchanged.size()) +
                    " tensors differ from the snapshot";
      return out;
    }
    case check_weights_action::reset_tensors: {
      std::mt19937_64 rng(0x5eed0000u + st.resets++);
      std::vector<NamedTensor> poisoned;
      for (const auto& p : params) {
        if (skipped(p.name, req.skip_tensor_list))
          continue;
        auto t = st.model->parameter(p.name);
        if (!t)
          return check_failed(t.error());
        poisoned.push_back({p.name, random_like(*t, rng)});
      }
      if (auto ok = st.model->assign(poisoned); !ok)
        return check_failed(ok.error());
      out.message = "overwrote " + std::to_string(poisoned.size()) + " tensors with random values";
      return out;
    }
  }
  return check_failed("unknown check_weights action");
}

GetWeightsByNameReqOutput get_weights(runner_state& st, const GetWeightsByNameReqInput& req) {
  if (auto why = released_refusal(st, false, "read its weights")) {
    GetWeightsByNameReqOutput out;
    out.success = false;
    out.message = *why;
    return out;
  }
  GetWeightsByNameReqOutput out;
  auto t = st.model->parameter(req.name);
  if (t && st.gpu && served_on_device(req.name)) {
    // The bytes the device serves, in the parameter's shape (bf16 where the device keeps bf16).
    auto d = st.gpu->download(req.name);
    if (!d) {
      out.success = false;
      out.message = d.error();
      return out;
    }
    d->shape = t->shape;
    t = std::move(*d);
  }
  if (!t) {
    out.success = false;
    out.message = t.error();
    return out;
  }
  out.type = t->type;
  out.shape = t->shape;
  auto n = std::min<int64_t>(req.truncate_size, t->numel());
  auto values = model::tensor_values(*t, n);
  if (!values) {
    out.success = false;
    out.message = values.error();
    return out;
  }
  out.parameter = std::move(*values);
  return out;
}

runner_actor::behavior_type runner(runner_pointer self, runner_options options,
                                   std::shared_ptr<model::qwen3_model> m,
                                   std::shared_ptr<model::qwen3_gpu_model> gpu) {
  self->state.options = std::move(options);
  self->state.model = std::move(m);
  if (gpu) {
    self->state.gpu = std::move(gpu); // its methods make its device current on this thread
  } else {
    self->state.pool = std::make_unique<model::kv_pool>(self->state.model->config(),
                                                        self->state.options.kv_block_size,
                                                        self->state.options.kv_num_blocks);
  }
  return guarded_behavior<runner_actor::behavior_type>(
    runner_state::name,
    [self](manifest_atom) {
      return make_manifest(self->state.options, *self->state.model, self->state.gpu.get());
    },
    [self](ForwardBatch& batch) { return run_batch(self->state, batch); },
    [self](ReleaseSequences& msg) {
      for (auto id : msg.seq_ids) {
        self->state.sequences.erase(id);
        if (self->state.options.draft_distributions && self->state.options.role == "draft")
          self->state.options.draft_distributions->release(id);
      }
    },
    [self](restore_atom) {
      if (auto why = released_refusal(self->state, false, "take new weights"))
        return RunnerReply{false, *why, true};
      self->state.staged.clear();
      if (auto& gpu = self->state.gpu) {
        // Updates are staged on the device beside the serving weights (INT4 modules as
        // load-format copies), so the serving layout is never undone and generation can go on
        // until the commit.
        gpu->discard_staged();
        std::string int4;
        if (auto r = gpu->int4_update_recipe())
          int4 = "; INT4 modules take load-format tensors or BF16 weights, quantized on the device "
                 "with " + std::string(kernels::to_string(*r));
        return RunnerReply{true, self->state.options.role + " runner ready for new weights on " +
                                   gpu->device_name() + ": staged on the device, the old weights "
                                   "serve until the commit" + int4};
      }
      // The CPU model keeps every module in load format (INT4 modules as their compressed-tensors
      // tensors, with an fp32 dequantized copy beside them), so there is no serving layout to
      // undo: restore only empties the staging area. A GPU runner restores its INT4 modules here.
      const auto& q = self->state.model->quantization();
      return RunnerReply{true, self->state.options.role + " runner ready for new weights" +
                                 (q ? " (CPU: INT4 modules are kept in load format; nothing to restore)"
                                    : "")};
    },
    [self](StageTensors& msg) {
      if (auto why = released_refusal(self->state, false, "take new weights"))
        return RunnerReply{false, *why, true};
      return stage(self->state, msg);
    },
    [self](StageDeviceTensors& msg) {
      if (auto why = released_refusal(self->state, false, "take new weights"))
        return RunnerReply{false, *why, true};
      return stage_device_tensors(self->state, msg);
    },
    [self](commit_atom) {
      if (auto why = released_refusal(self->state, false, "commit new weights"))
        return RunnerReply{false, *why, false};
      return commit(self->state);
    },
    [self](discard_atom) {
      auto n = self->state.staged.size();
      self->state.staged.clear();
      if (auto& gpu = self->state.gpu) {
        auto bytes = gpu->staged_bytes();
        gpu->discard_staged();
        return RunnerReply{true, "dropped " + std::to_string(bytes >> 20) + " MiB staged on " +
                                   gpu->device_name() + "; the serving weights are untouched"};
      }
      return RunnerReply{true, "dropped " + std::to_string(n) + " staged tensors"};
    },
    [self](CheckWeightsReqInput& req) { return check(self->state, req); },
    [self](GetWeightsByNameReqInput& req) { return get_weights(self->state, req); },
    [self](ReleaseMemoryOccupationReqInput& req) { return change_memory(self->state, req.tags, true); },
    [self](ResumeMemoryOccupationReqInput& req) { return change_memory(self->state, req.tags, false); });
}

} // namespace

runner_actor spawn_cpu_runner(caf::actor_system& sys, runner_options options,
                              std::shared_ptr<model::qwen3_model> model) {
  if (!options.detached)
    return sys.spawn(runner, std::move(options), std::move(model),
                     std::shared_ptr<model::qwen3_gpu_model>{});
  return sys.spawn<caf::detached>(runner, std::move(options), std::move(model),
                                  std::shared_ptr<model::qwen3_gpu_model>{});
}

runner_actor spawn_gpu_runner(caf::actor_system& sys, runner_options options,
                              std::shared_ptr<model::qwen3_model> model,
                              std::shared_ptr<model::qwen3_gpu_model> gpu) {
  return sys.spawn<caf::detached>(runner, std::move(options), std::move(model), std::move(gpu));
}

} // namespace rlserve
