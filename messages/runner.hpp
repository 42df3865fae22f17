// Internal messages between the scheduler / weight_updater and the runner actors. Not part of
// the public contract (no JSON codec), but inspectable so runners can live in another process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "caf/meta/type_name.hpp"
#include "messages/dtype.hpp"
#include "messages/generate.hpp"
#include "messages/tensor.hpp"
#include "messages/weight_update.hpp"

namespace rlserve {

// ---- forward -----------------------------------------------------------------------------------

// One work entry of a forward batch (a position below ForwardBatch::work.size()): `tokens` are
// appended to the sequence's KV (a prompt chunk, or the token sampled last step) and, when
// `sample` is set, a next token is sampled from the last position with the sequence's own
// seeded sampler.
//
// Speculative decoding adds two shapes of work (model/speculative.hpp):
//  - draft runner, `propose` = k > 0: after `tokens`, the draft samples k tokens one after
//    another from its own distributions and returns them with those distributions; its KV then
//    holds `tokens` and the first k - 1 proposals.
//  - target runner, `draft_tokens` non-empty: `tokens` is the one pending token; the target runs
//    it and the k proposals in one forward, keeps the proposals it accepts and adds one token of
//    its own; its KV keeps the pending token and the accepted proposals only.
struct SequenceWork {
  bool new_sequence = false;       // drop any KV under the sequence's id and start fresh
  std::vector<int32_t> new_blocks; // KV pool blocks appended to the sequence's block table
  // Read when new_sequence is set: the first cached_tokens positions are already in the leading
  // new_blocks (a prefix another request computed, shared through the scheduler's prefix
  // cache); `tokens` run from there. The whole blocks among them are never written. When
  // cached_tokens is not a whole number of blocks, the rest (cached_tokens % block size) are the
  // first slots of block copy_from_block, copied into the block after the whole ones before
  // anything runs (copy-on-write of a partly shared block).
  int64_t cached_tokens = 0;
  int32_t copy_from_block = -1;
  int64_t kv_length = -1;          // >= 0: first cut the sequence's KV to this many positions
  std::vector<int32_t> tokens;
  bool sample = true;
  SamplingParams sampling_params;  // read when new_sequence is set
  uint64_t sampling_seed = 0;      // read when new_sequence is set
  // Read when new_sequence is set: the tokens the request generated before (back from a
  // retract or a preemption), which its penalties and min_new_tokens count.
  std::vector<int32_t> generated_tokens;
  int32_t top_logprobs_num = 0;
  // Prompt logprobs: the tokens that follow the last scored_tokens.size() positions of `tokens`
  // before the sampled one (when `sample` is set, the last position is sampled, not scored).
  // The runner returns the logprob of each (and its top logprobs when top_logprobs_num > 0).
  std::vector<int32_t> scored_tokens;
  // Routing replay: return the router's top-k expert ids of every layer for every position of
  // `tokens` (WorkResult::routed_experts).
  bool return_routed_experts = false;
  // Top-p replay (returns_top_p_token_ids): return the kept set of the sampled token
  // (WorkResult::top_p_token_ids), whose logprob is then the one over that set (model::sampler).
  bool return_top_p_token_ids = false;
  int32_t propose = 0;                // draft: tokens to propose after `tokens`
  std::vector<int32_t> draft_tokens;  // target: proposals to verify
  std::vector<float> draft_probs;     // target: [k, vocab] draft distributions (empty if greedy)
  // target: the draft distributions are on the device instead (a GPU draft beside a GPU target:
  // model/gpu_draft_distributions.hpp, rows by this position's sequence id); draft_probs is empty.
  bool draft_probs_on_device = false;
};

// One forward batch: one sequence per position, W = work.size() work entries at positions
// 0 .. W - 1, then D = decode_tokens.size() plain decodes at positions W .. W + D - 1, and the
// answer (ForwardBatchOutput) is indexed by the same positions. A plain decode step — a running
// sequence runs the token it sampled last and samples the next, needing no new block, no top
// logprobs and no proposals — is by far the most common work at large batch sizes, so it is
// only its position's entry in seq_ids and decode_tokens: a step of hundreds of them costs no
// allocation per sequence.
struct ForwardBatch {
  uint64_t step = 0;
  std::vector<uint64_t> seq_ids;      // the sequence at each position (W + D entries)
  std::vector<SequenceWork> work;     // positions 0 .. W - 1
  std::vector<int32_t> decode_tokens; // position W + d runs decode_tokens[d]

  std::size_t size() const { return seq_ids.size(); }
};

// What a work position returns besides its sampled token (ForwardBatchOutput::details). Empty
// when the position failed.
struct WorkResult {
  // Verification: the proposals the target kept, which come before the position's own sampled
  // token, and the target's logprob of each.
  std::vector<int32_t> accepted_tokens;
  std::vector<float> accepted_logprobs;
  // Proposal (draft runner): the k proposed tokens and the [k, vocab] distributions they were
  // drawn from (empty for greedy requests).
  std::vector<int32_t> proposed_tokens;
  std::vector<float> draft_probs;
  // The distributions stayed on the device (a GPU draft beside a GPU target); draft_probs is empty.
  bool draft_probs_on_device = false;
  // top_logprobs_num > 0: one list per new token (the accepted proposals, then the sampled one).
  std::vector<std::vector<TopLogprob>> top_logprobs;
  std::vector<float> scored_logprobs;                       // one per SequenceWork::scored_tokens
  std::vector<std::vector<TopLogprob>> scored_top_logprobs; // one list each when asked
  // return_routed_experts: [tokens run, num_hidden_layers, num_experts_per_tok] expert ids, -1
  // in dense layers (empty for a model without experts).
  std::vector<int32_t> routed_experts;
  // return_top_p_token_ids: the kept sets of the new tokens, flattened, and one count per new
  // token (the sampled one; speculation is off for such requests).
  std::vector<int32_t> top_p_token_ids;
  std::vector<int32_t> top_p_token_counts;
};

// The answer to a ForwardBatch, by its positions. Every position has its sampled token and that
// token's logprob (-1 and 0 when it sampled none: a prefill chunk before the last, a proposal,
// a failure); errors is empty when no position failed, else one entry per position, the reason
// for each that failed (such a position returns nothing else; the others still ran). Work
// positions have their details too.
struct ForwardBatchOutput {
  bool success = true;
  std::string message;
  uint64_t step = 0;
  std::vector<int32_t> tokens;     // one per position
  std::vector<float> logprobs;     // one per position
  std::vector<std::string> errors; // none, or one per position
  std::vector<WorkResult> details; // one per work position (the first W)

  // Position i's error; empty when it ran.
  const std::string& error(std::size_t i) const {
    static const std::string none;
    return i < errors.size() ? errors[i] : none;
  }
};

struct ReleaseSequences {
  std::vector<uint64_t> seq_ids;
};

// ---- weights -----------------------------------------------------------------------------------

struct TensorSpec {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
};

// A second name for a parameter: with tied embeddings, trainers send the shared tensor under
// `lm_head.weight` too (or only there); it lands in `target`.
struct TensorAlias {
  std::string alias;
  std::string target;
};

// What a runner serves: its role, its parameters in load format (what a checkpoint or a trainer
// sends), and its model's limits. The weight_updater validates whole buckets against this
// before anything is staged.
// What a runner can do, stated by the runner itself so that the weight_updater's refusals and
// the engine's replies (get_server_info) are true for the engine they come from.
struct RunnerCapabilities {
  // Stages tensors read from a trainer's GPU memory (CUDA IPC handles, device pointers): GPU
  // runners. Others take inline tensors and checkpoints only.
  bool device_tensors = false;
  // Joins a trainer's NCCL weight-update group (init_weights_update_group) and receives
  // broadcast buckets.
  bool weight_update_groups = false;
  // check_weights hashes the copy the device serves (GPU runners), not a host copy.
  bool device_checksums = false;
  // Quantized (INT4, W4A16) Linear modules it serves; 0 for a BF16 model.
  int32_t int4_modules = 0;
  // What BF16 updates of those modules are quantized with ("int4-asym g128"), and where:
  // "device" (GPU runners) or "host". Empty without INT4 modules.
  std::string int4_update_recipe;
  std::string int4_quantized_on;
};

struct RunnerManifest {
  std::string role; // "target" | "draft"
  int32_t tp_rank = 0;
  int32_t tp_size = 1;
  std::string model_path;
  std::string architecture;
  std::string device;
  int64_t vocab_size = 0;
  int64_t max_context_length = 0;
  std::vector<int32_t> eos_token_ids;
  int64_t kv_block_size = 0;  // tokens per KV block of the runner's pool
  int64_t kv_num_blocks = 0;  // blocks in the pool (the scheduler hands them out)
  std::vector<TensorSpec> parameters; // sorted by name
  std::vector<TensorAlias> aliases;
  RunnerCapabilities capabilities;
};

// Tensors a runner keeps aside until the session commits; they must be in the manifest.
struct StageTensors {
  std::vector<NamedTensor> tensors;
};

// Tensors in a trainer's GPU memory (CUDA IPC, or device pointers of this process) for the
// next commit; a GPU runner reads them on the device and closes them before it replies. All or
// nothing per message, as StageTensors.
struct StageDeviceTensors {
  std::vector<NamedDeviceTensor> tensors;
};

// ---- weight-update groups: the weight_updater and its weight_group actors ---------------------

// Joins the trainer's group as `rank` (rank_offset + tp_rank) with buffers on CUDA device `device`
// (the target runner's). Answered with an InitWeightsUpdateGroupReqOutput.
struct JoinWeightGroup {
  InitWeightsUpdateGroupReqInput request;
  int32_t device = 0;
  int32_t rank = 0;
};

// Receives one update's broadcasts from rank 0 into new device buffers: one broadcast per tensor
// in order, or (`flattened`) one broadcast of a byte buffer holding them back to back, each at
// an offset aligned to its element size. `keep` false: receive and drop (a refused update still
// takes the trainer's bytes, so the next update's broadcasts line up with the trainer's).
struct ReceiveBroadcast {
  std::vector<TensorSpec> tensors;
  bool flattened = false;
  double timeout_s = 0; // deadline of the whole receive (creating the communicator included)
  bool keep = true;
};

struct ReceivedBroadcast {
  bool success = true;
  std::string message;
  uint64_t buffer_id = 0;                 // hand back with ReleaseBroadcast when read
  std::vector<NamedDeviceTensor> tensors; // device pointers of this process into the buffers
  bool group_broken = false;              // the group can take no more broadcasts: destroy it
};

// The buffers of one ReceivedBroadcast are no longer read.
struct ReleaseBroadcast {
  uint64_t buffer_id = 0;
};

struct RunnerReply {
  bool success = true;
  std::string message;
  // On failure: the runner refused the message whole and its staging area is as it was before
  // (so a session may go on); false when staged state may have been lost.
  bool nothing_staged = false;
};

// A runner's answer to a CheckWeightsReqInput: its own role and unprefixed names.
struct RunnerCheckOutput {
  bool success = true;
  std::string message;
  std::string role;
  std::vector<std::string> names;   // checksum: sorted; same order as digests
  std::vector<uint64_t> digests;    // XXH3-64 of each tensor's canonical bytes
  std::vector<std::string> changed; // compare
  std::vector<std::string> unchanged;
};

// ---- weight_updater state -----------------------------------------------------------------------

// What the weight_updater reports about itself (the scheduler stamps results with the version).
struct WeightUpdaterStatus {
  std::string weight_version;
  bool session_open = false;
  std::string session_selector; // "target" | "draft" | "all" while a session is open
  uint64_t committed_updates = 0;
};

// ---- inspect (CAF 0.17 form) ------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SequenceWork& x) {
  return f(caf::meta::type_name("SequenceWork"), x.new_sequence, x.new_blocks, x.cached_tokens,
           x.copy_from_block, x.kv_length, x.tokens, x.sample, x.sampling_params, x.sampling_seed,
           x.generated_tokens, x.top_logprobs_num, x.scored_tokens, x.return_routed_experts,
           x.return_top_p_token_ids, x.propose, x.draft_tokens, x.draft_probs, x.draft_probs_on_device);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ForwardBatch& x) {
  return f(caf::meta::type_name("ForwardBatch"), x.step, x.seq_ids, x.work, x.decode_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkResult& x) {
  return f(caf::meta::type_name("WorkResult"), x.accepted_tokens, x.accepted_logprobs,
           x.proposed_tokens, x.draft_probs, x.draft_probs_on_device, x.top_logprobs, x.scored_logprobs,
           x.scored_top_logprobs, x.routed_experts, x.top_p_token_ids, x.top_p_token_counts);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ForwardBatchOutput& x) {
  return f(caf::meta::type_name("ForwardBatchOutput"), x.success, x.message, x.step, x.tokens,
           x.logprobs, x.errors, x.details);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReleaseSequences& x) {
  return f(caf::meta::type_name("ReleaseSequences"), x.seq_ids);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TensorSpec& x) {
  return f(caf::meta::type_name("TensorSpec"), x.name, x.type, x.shape);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TensorAlias& x) {
  return f(caf::meta::type_name("TensorAlias"), x.alias, x.target);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RunnerCapabilities& x) {
  return f(caf::meta::type_name("RunnerCapabilities"), x.device_tensors, x.weight_update_groups,
           x.device_checksums, x.int4_modules, x.int4_update_recipe, x.int4_quantized_on);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RunnerManifest& x) {
  return f(caf::meta::type_name("RunnerManifest"), x.role, x.tp_rank, x.tp_size, x.model_path,
           x.architecture, x.device, x.vocab_size, x.max_context_length, x.eos_token_ids,
           x.kv_block_size, x.kv_num_blocks, x.parameters, x.aliases, x.capabilities);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StageTensors& x) {
  return f(caf::meta::type_name("StageTensors"), x.tensors);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StageDeviceTensors& x) {
  return f(caf::meta::type_name("StageDeviceTensors"), x.tensors);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JoinWeightGroup& x) {
  return f(caf::meta::type_name("JoinWeightGroup"), x.request, x.device, x.rank);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReceiveBroadcast& x) {
  return f(caf::meta::type_name("ReceiveBroadcast"), x.tensors, x.flattened, x.timeout_s, x.keep);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReceivedBroadcast& x) {
  return f(caf::meta::type_name("ReceivedBroadcast"), x.success, x.message, x.buffer_id, x.tensors,
           x.group_broken);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReleaseBroadcast& x) {
  return f(caf::meta::type_name("ReleaseBroadcast"), x.buffer_id);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RunnerReply& x) {
  return f(caf::meta::type_name("RunnerReply"), x.success, x.message, x.nothing_staged);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RunnerCheckOutput& x) {
  return f(caf::meta::type_name("RunnerCheckOutput"), x.success, x.message, x.role, x.names,
           x.digests, x.changed, x.unchanged);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WeightUpdaterStatus& x) {
  return f(caf::meta::type_name("WeightUpdaterStatus"), x.weight_version, x.session_open,
           x.session_selector, x.committed_updates);
}

} // namespace rlserve
