// weight_updater: owns the weight-update session (begin → updates → end), the runner selector,
// the weight-update groups, the weight version and the weight checker (docs/sglang-contract.md,
// 'Sessions and selectors'). Selection is routing: each operation goes to the runner actors the
// selector names.
//
// Atomicity: every update message is validated as a whole against the selected runners'
// manifests (names, aliases, dtypes, shapes, byte counts, duplicates) before any runner stages
// any of it; runners keep staged tensors aside until end_weight_update commits them all. A
// failed message leaves the session open with what earlier messages staged; an aborted or
// failed session leaves the old weights serving and the version unchanged.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "actors/policy/update_session.hpp"
#include "actors/runner_actor.hpp"
#include "actors/weight_group_actor.hpp"
#include "actors/weight_operations.hpp"
#include "caf/fwd.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"
#include "messages/all.hpp"

namespace rlserve {

// Every weight operation of messages/operations.hpp (the comments there say what each does),
// plus the scheduler's two questions:
using weight_updater_actor = caf::typed_actor<
  // Commits an implicit session (an update that came outside begin/end) if one is open; a no-op
  // otherwise. The scheduler sends it at continue_generation and after such an update while
  // generation runs.
  caf::replies_to<settle_atom>::with<EndWeightUpdateReqOutput>,
  // The serving version and whether a session is open.
  caf::replies_to<version_atom>::with<WeightUpdaterStatus>,
  // Receives the broadcast of an update_weights_from_distributed into its group's buffers and
  // answers with a ticket (buffer_id) for the update to be sent with (`received`); a refused
  // update's bytes are received and dropped. The scheduler asks this outside its one-at-a-time
  // weight operations, so batches run while a trainer broadcasts.
  caf::replies_to<receive_atom, UpdateWeightsFromDistributedReqInput>::with<ReceivedBroadcast>>::
  extend_with<weight_operations_actor>;

struct runner_handle {
  runner_actor actor;
  RunnerManifest manifest;
};

// How the weight_updater starts the actor of a group it joins: spawn_weight_group. A test may
// pass one that also keeps the handle, to end the group's actor as a crash would.
using weight_group_spawner =
  std::function<weight_group_actor(caf::actor_system&, std::shared_ptr<std::atomic<bool>>)>;

// `runners`: target first, then draft(s). `initial_version`: the label of the loaded weights.
// `allow_non_finite`: accept NaN/infinity in host tensors of updates (refused by default: a
// model with them emits garbage while reporting success).
weight_updater_actor spawn_weight_updater(caf::actor_system& sys, std::vector<runner_handle> runners,
                                          std::string initial_version, bool allow_non_finite = false,
                                          weight_group_spawner spawn_group = spawn_weight_group);

// The version a commit gets when the caller named none (actors/policy/update_session.hpp).
using policy::next_weight_version;

} // namespace rlserve
