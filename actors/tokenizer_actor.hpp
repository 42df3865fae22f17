// tokenizer: the front door (SGLang's tokenizer manager and its control mixin). Validates and
// tokenizes generate requests (or passes token ids through), detokenizes results incrementally
// for streaming, routes results back to callers, and holds the pause-aware update lock
// (actors/policy/update_gate.hpp): generate requests hold it shared, a weight-update session
// exclusive, except while generation is paused.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "actors/scheduler_actor.hpp"
#include "caf/fwd.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"
#include "messages/all.hpp"

namespace rlserve {

namespace model {
class bpe_tokenizer;
}

using tokenizer_actor = caf::typed_actor<
  // Runs one request to its end. When req.stream is set, every chunk also goes to `sink`
  // (a GenerateReqOutput message per chunk; `sink` may be invalid otherwise). The reply is the
  // whole result. Bad input ends it at once with success = false and a message.
  caf::replies_to<GenerateReqInput, caf::actor>::with<GenerateReqOutput>,
  // From the scheduler: progress of requests, one message per step.
  caf::reacts_to<TokenChunks>,
  // Aborts a request (queued here or running) or all of them, whoever made it (the admin
  // route abort_request and the Engine API).
  caf::replies_to<AbortReq>::with<AbortReqOutput>,
  // Aborts request `rid` (finish reason "abort" with the message `why`) only if the sender of
  // this message is the actor that sent its GenerateReqInput (a connection cancelling its own
  // request, or cleaning up after its client left); otherwise nothing happens. A client can
  // name another client's rid, never abort it this way.
  caf::reacts_to<cancel_atom, std::string, std::string>,
  // abort: end every running request (partial output, finish reason "abort") and reply once
  // none runs; retract / in_place: the scheduler keeps them. New requests wait until continue.
  caf::replies_to<PauseGenerationReqInput>::with<PauseGenerationReqOutput>,
  // Unpauses, after any update operation or session in progress has ended.
  caf::replies_to<ContinueGenerationReqInput>::with<ContinueGenerationReqOutput>,
  caf::replies_to<FlushCacheReqInput>::with<FlushCacheReqOutput>,
  // release_memory_occupation / resume_memory_occupation: to the scheduler.
  caf::replies_to<ReleaseMemoryOccupationReqInput>::with<ReleaseMemoryOccupationReqOutput>,
  caf::replies_to<ResumeMemoryOccupationReqInput>::with<ResumeMemoryOccupationReqOutput>,
  caf::replies_to<GetServerInfoReqInput>::with<GetServerInfoReqOutput>,
  caf::replies_to<HealthCheckReqInput>::with<HealthCheckReqOutput>>
  // And every weight operation: those of a session wait at the pause-aware update lock (their
  // role in messages/operations.hpp), the others go straight to the scheduler.
  ::extend_with<weight_operations_actor>;

struct front_door_info {
  std::string model_path;
  std::string draft_model_path;
  std::string device;
  std::string architecture;
  int64_t vocab_size = 0;
  int64_t max_context_length = 0;
  // What get_server_info says of weight updates (GetServerInfoReqOutput's fields of the same
  // names), from the runners' manifests.
  std::vector<std::string> weight_transports;
  int32_t int4_modules = 0;
  std::string int4_update_recipe;
  std::string int4_quantized_on;
};

tokenizer_actor spawn_tokenizer(caf::actor_system& sys, scheduler_actor scheduler,
                                std::shared_ptr<const model::bpe_tokenizer> tokenizer,
                                front_door_info info);

} // namespace rlserve
