// The table of the engine's public operations: one line per request/reply pair (generate, which
// also takes a result sink, is written out by hand where it appears). Everything that lists
// operations is generated from these lines:
//   - the CAF type IDs of the request and reply structs (messages/type_ids.hpp);
//   - the codec routes with their auth level (messages/codec_registry.cpp);
//   - the weight-operation interface that the weight_updater, scheduler and tokenizer actors
//     extend, and their forwarding handlers (actors/weight_operations.hpp);
//   - the blocking methods of rlserve::Engine (actors/engine.hpp).
// Adding an operation: its request and reply structs in their family header (with inspect and
// JSON codec), one line here, and the handler in the one actor that does the work.
//
// Columns of X(route, method, In, Out, auth, role):
//   route   the HTTP / websocket route: SGLang's HTTP route without the slash
//   method  the rlserve::Engine method
//   In/Out  the request and reply structs
//   auth    normal: generation and read-only server state (api_key); admin: everything that
//           changes or reads weights, pauses or resumes, flushes or aborts (admin_api_key)
//   role    for weight operations, their part in an update session, which orders them against
//           generation at the front door (actors/policy/update_gate.hpp):
//             session_begin / session_update / session_end: begin, an update inside, the end;
//             standalone: a session of its own (a whole checkpoint, generation-1 flags);
//             unordered: takes no lock (groups, checks, reads, relabelling)
//           control operations are handled one by one by the front door: role `control`.
// SEP separates lines (RLSERVE_OP_COMMA where the expansion is a list).
#pragma once

#define RLSERVE_OP_COMMA ,
#define RLSERVE_OP_NOTHING

// Server state and generation control; the front door handles each itself.
#define RLSERVE_CONTROL_OPERATIONS(X, SEP)                                                        \
  /* Liveness: the front door and the scheduler answer. */                                       \
  X(health, health, HealthCheckReqInput, HealthCheckReqOutput, normal, control) SEP              \
  /* Queue depths, pause state, the serving weight version, speculative statistics. */           \
  X(get_server_info, get_server_info, GetServerInfoReqInput, GetServerInfoReqOutput, normal,     \
    control) SEP                                                                                 \
  /* Ends one request (by rid) or all, whoever made it; abort_all ends everyone's requests. */   \
  X(abort_request, abort, AbortReq, AbortReqOutput, admin, control) SEP                          \
  /* abort / retract / in_place; replies once the batch in flight is done. */                    \
  X(pause_generation, pause_generation, PauseGenerationReqInput, PauseGenerationReqOutput,       \
    admin, control) SEP                                                                          \
  /* Unpauses, after any update in progress has ended; commits an implicit session first. */     \
  X(continue_generation, continue_generation, ContinueGenerationReqInput,                        \
    ContinueGenerationReqOutput, admin, control) SEP                                             \
  /* Drops cached KV; refused while requests run (after waiting up to timeout_s). */             \
  X(flush_cache, flush_cache, FlushCacheReqInput, FlushCacheReqOutput, admin, control) SEP        \
  /* Gives GPU memory back by tag (weights, kv_cache, cuda_graph) / takes it again. */           \
  X(release_memory_occupation, release_memory_occupation, ReleaseMemoryOccupationReqInput,       \
    ReleaseMemoryOccupationReqOutput, admin, control) SEP                                        \
  X(resume_memory_occupation, resume_memory_occupation, ResumeMemoryOccupationReqInput,          \
    ResumeMemoryOccupationReqOutput, admin, control)

// Weight operations: the scheduler forwards them to the weight_updater between batches, one at a
// time; the tokenizer orders them against generation by their role.
#define RLSERVE_WEIGHT_OPERATIONS(X, SEP)                                                         \
  /* Joins / leaves a trainer's NCCL group (GPU runners only). */                                \
  X(init_weights_update_group, init_weights_update_group, InitWeightsUpdateGroupReqInput,        \
    InitWeightsUpdateGroupReqOutput, admin, unordered) SEP                                       \
  X(destroy_weights_update_group, destroy_weights_update_group,                                  \
    DestroyWeightsUpdateGroupReqInput, DestroyWeightsUpdateGroupReqOutput, admin, unordered) SEP \
  /* Receives a broadcast bucket over a weight-update group into the open session. */            \
  X(update_weights_from_distributed, update_weights_from_distributed,                            \
    UpdateWeightsFromDistributedReqInput, UpdateWeightsFromDistributedReqOutput, admin,          \
    session_update) SEP                                                                          \
  /* Stages inline tensors or CUDA IPC handles; outside begin/end it is a session of its own. */ \
  X(update_weights_from_tensor, update_weights_from_tensor, UpdateWeightsFromTensorReqInput,     \
    UpdateWeightsFromTensorReqOutput, admin, session_update) SEP                                 \
  /* Loads a whole checkpoint directory as a session of its own; refused while one is open. */   \
  X(update_weights_from_disk, update_weights_from_disk, UpdateWeightFromDiskReqInput,            \
    UpdateWeightFromDiskReqOutput, admin, standalone) SEP                                        \
  /* Opens a session on the runners the selector names (owned by the connection that sent it). */\
  X(begin_weight_update, begin_weight_update, BeginWeightUpdateReqInput,                         \
    BeginWeightUpdateReqOutput, admin, session_begin) SEP                                        \
  /* Commits (or aborts) the open session and sets the weight version. */                        \
  X(end_weight_update, end_weight_update, EndWeightUpdateReqInput, EndWeightUpdateReqOutput,     \
    admin, session_end) SEP                                                                      \
  /* Generation-1 restore / post-process flags: restore opens an implicit session, post-process  \
     commits it; refused inside a begin/end session. */                                          \
  X(post_process_weights, post_process_weights, PostProcessWeightsReqInput,                      \
    PostProcessWeightsReqOutput, admin, standalone) SEP                                          \
  /* Relabels the serving weights. */                                                            \
  X(update_weight_version, update_weight_version, UpdateWeightVersionReqInput,                   \
    UpdateWeightVersionReqOutput, admin, unordered) SEP                                          \
  /* checksum / snapshot / compare / reset_tensors on the selected runners, merged by role; it   \
     can reset tensors and reads weights, so it is never normal. */                              \
  X(weights_checker, check_weights, CheckWeightsReqInput, CheckWeightsReqOutput, admin,          \
    unordered) SEP                                                                               \
  /* The first values of one parameter from one runner. */                                       \
  X(get_weights_by_name, get_weights_by_name, GetWeightsByNameReqInput,                          \
    GetWeightsByNameReqOutput, admin, unordered)
