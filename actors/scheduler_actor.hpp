// scheduler: runs generation over the target runner, one batch at a time, and is the one door
// through which weight operations reach the weight_updater — only between batches, so a weight
// operation never overlaps a forward.
//
// Continuous batching over the target runner's paged KV pool: the scheduler owns the block
// manager, plans each batch with actors/policy/batch_planner.hpp (decodes first, then FCFS
// admissions with chunked prefill, within a token budget; newest requests preempted when blocks
// run out), and sends every request's new blocks with its work.
#pragma once

#include <memory>

#include "actors/runner_actor.hpp"
#include "actors/weight_updater_actor.hpp"
#include "caf/fwd.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"
#include "actors/profiler.hpp"
#include "messages/all.hpp"

namespace rlserve {

namespace model {
class bpe_tokenizer;
}

using scheduler_actor = caf::typed_actor<
  // Queues a request. Progress goes to `sink` as TokenChunks messages, one per step (a chunk per
  // token when streaming, else one final chunk); the last chunk of a request has finished = true.
  // A request that could never fit the KV pool ends at once with a message. No reply.
  caf::reacts_to<TokenizedGenerateReqInput, caf::actor>,
  // Aborts one request (by rid) or all; each ends with finish reason "abort" and its partial
  // output. Replies with how many it found.
  caf::replies_to<AbortReq>::with<AbortReqOutput>,
  // retract: running requests give up their KV and go back to the queue; in_place: they keep
  // it. Either way no batch starts until continue. Replies once the batch in flight is done.
  caf::replies_to<PauseGenerationReqInput>::with<PauseGenerationReqOutput>,
  caf::replies_to<ContinueGenerationReqInput>::with<ContinueGenerationReqOutput>,
  // Drops the prefix cache; refused while requests are running (after waiting up to timeout_s).
  caf::replies_to<FlushCacheReqInput>::with<FlushCacheReqOutput>,
  // Gives GPU memory back by tag / takes it again, on every runner, between batches; a release
  // is refused while requests hold KV. While anything is released no batch runs and new
  // generate requests are refused.
  caf::replies_to<ReleaseMemoryOccupationReqInput>::with<ReleaseMemoryOccupationReqOutput>,
  caf::replies_to<ResumeMemoryOccupationReqInput>::with<ResumeMemoryOccupationReqOutput>,
  // Queue depths, pause state and the serving weight version.
  caf::replies_to<GetServerInfoReqInput>::with<GetServerInfoReqOutput>,
  // Internal: run the next batch if there is work and nothing else in flight.
  caf::reacts_to<step_atom>>
  // And every weight operation, forwarded to the weight_updater between batches, one at a time.
  ::extend_with<weight_operations_actor>;

struct scheduler_options {
  int32_t max_running_requests = 64;
  int64_t max_batch_tokens = 2048; // tokens per forward batch; longer prompts are prefilled in chunks
  // Draft tokens proposed and verified per decode step when a draft runner is given; 0: off.
  int32_t speculative_num_draft_tokens = 4;
  // Reuse the KV of shared prefixes across requests (actors/policy/prefix_cache.hpp); SGLang's
  // radix cache, off with --disable-radix-cache.
  bool prefix_cache = true;
  // Output tokens per streamed chunk when a request does not set sampling_params.stream_interval
  // (SGLang's --stream-interval): fewer chunks, and less per-step work, at large batches.
  int32_t stream_interval = 1;
  // Where steps are traced while a profile runs (/start_profile); may be null.
  std::shared_ptr<profiler> profile;
};

// `target`: the runner that generates; `draft`: the speculative draft runner or a null handle;
// `target_manifest`: the target's limits and EOS ids; `tokenizer`: for stop strings (may be
// null: then stop strings are refused by the front door).
scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_options options,
                                runner_actor target, runner_actor draft,
                                RunnerManifest target_manifest,
                                weight_updater_actor updater, std::string initial_version,
                                std::shared_ptr<const model::bpe_tokenizer> tokenizer);

} // namespace rlserve
