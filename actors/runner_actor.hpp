// runner: one per (role, tensor-parallel rank). Owns one device (the CPU or a CUDA GPU), one model's
// parameters, the per-sequence KV and samplers. Runs forward batches for the scheduler and
// weight operations for the weight_updater. Spawned detached: its long work runs on its own
// thread, never on CAF's shared workers (and a GPU runner's CUDA context is per-thread state).
//
// Weight updates are staged: StageTensors keeps tensors aside, commit swaps them in all at
// once (qwen3_model::assign is all-or-nothing), discard drops them. Forward batches between
// stage and commit run on the old weights, so no batch ever sees half an update.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "caf/fwd.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"
#include "actors/profiler.hpp"
#include "messages/all.hpp"

namespace rlserve {

using runner_actor = caf::typed_actor<
  // Describes this runner: role, device, limits, and its parameters in load format.
  caf::replies_to<manifest_atom>::with<RunnerManifest>,
  // Runs one forward batch; the answer is indexed by the batch's positions (work entries, then
  // plain decodes). A sequence that cannot run (unknown, a token outside the vocabulary, its
  // context full) fails alone with its error at its position; the others run.
  caf::replies_to<ForwardBatch>::with<ForwardBatchOutput>,
  // Forgets the KV and sampler state of finished, aborted or retracted sequences.
  caf::reacts_to<ReleaseSequences>,
  // Opens a session on this runner: restores quantized modules to the load format (nothing to
  // do for BF16 modules) and clears the staging area.
  caf::replies_to<restore_atom>::with<RunnerReply>,
  // Keeps tensors aside for the next commit; all or nothing per message (a name outside the
  // manifest, a wrong dtype or shape fails the message and stages none of it).
  caf::replies_to<StageTensors>::with<RunnerReply>,
  // Keeps tensors that live in a trainer's GPU memory aside for the next commit (GPU runners:
  // read on the device, the trainer's memory closed again before the reply; CPU runners refuse).
  caf::replies_to<StageDeviceTensors>::with<RunnerReply>,
  // Swaps every staged tensor in at once and post-processes; the staging area is emptied.
  caf::replies_to<commit_atom>::with<RunnerReply>,
  // Drops the staging area; the serving weights are untouched.
  caf::replies_to<discard_atom>::with<RunnerReply>,
  // checksum / snapshot / compare / reset_tensors over this runner's parameters.
  caf::replies_to<CheckWeightsReqInput>::with<RunnerCheckOutput>,
  // The first values of one parameter, as floats.
  caf::replies_to<GetWeightsByNameReqInput>::with<GetWeightsByNameReqOutput>,
  // Gives the device memory of the message's tags back / takes it again (a GPU runner; a CPU
  // runner keeps its memory and only marks the tags). While anything is released forward batches
  // fail, and while the weights are, every weight operation does, naming what to resume.
  caf::replies_to<ReleaseMemoryOccupationReqInput>::with<RunnerReply>,
  caf::replies_to<ResumeMemoryOccupationReqInput>::with<RunnerReply>>;

namespace model {
class qwen3_model;
class qwen3_gpu_model;
class gpu_draft_distributions;
} // namespace model

struct runner_options {
  std::string role = "target"; // "target" | "draft"
  int32_t tp_rank = 0;
  int32_t tp_size = 1;
  std::filesystem::path model_path;
  int64_t kv_block_size = 16;    // tokens per KV block
  int64_t kv_num_blocks = 2048;  // blocks in the runner's KV pool
  // Accept NaN/Inf in updated weights (they are refused by default).
  bool allow_non_finite_weights = false;
  // CPU runners: on a thread of their own (always, when serving). False only under CAF's
  // deterministic test coordinator (tests/support/actor_sim.hpp), which must schedule every
  // actor itself for a run to be replayable from its seed.
  bool detached = true;
  // Where forward batches are traced while a profile runs (/start_profile); may be null.
  std::shared_ptr<profiler> profile;
  // release_memory_occupation of the weights copies them to pinned host memory first and resume
  // restores them (SGLang's --enable-weights-cpu-backup); otherwise they are undefined after
  // resume until an update writes them.
  bool weights_cpu_backup = false;
  // GPU target and draft on one device: the draft's distributions stay there, the draft writes
  // them and the target verifies against them (null otherwise: they travel in the messages).
  std::shared_ptr<model::gpu_draft_distributions> draft_distributions;
};

// Spawns a CPU runner over an already loaded model (loading happens before the actor graph
// exists, so a bad checkpoint is an error of Engine::start, not a dead actor).
runner_actor spawn_cpu_runner(caf::actor_system& sys, runner_options options,
                              std::shared_ptr<model::qwen3_model> model);

// Spawns a GPU runner: `model` keeps the parameters in load format (checksums, validation, the
// staging rules), `gpu` their device copy, the device KV pool and the CUDA graphs. Forward
// batches run on the device; plain decode batches also sample there. Commits write the updated
// tensors into the device buffers in place and repack INT4 modules (graphs stay valid).
runner_actor spawn_gpu_runner(caf::actor_system& sys, runner_options options,
                              std::shared_ptr<model::qwen3_model> model,
                              std::shared_ptr<model::qwen3_gpu_model> gpu);

} // namespace rlserve
