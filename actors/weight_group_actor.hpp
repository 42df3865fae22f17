// weight_group: this engine's rank in one trainer's NCCL weight-update group, from
// init_weights_update_group to destroy_weights_update_group (docs/protocol.md, "Joining a
// trainer's NCCL group"). The weight_updater spawns one per group, detached: the communicator's
// creation and every broadcast block this actor's own thread — each to a deadline — and never
// CAF's shared workers, so pause, continue, generate and health answer while a trainer is slow or
// gone. The store rendezvous of a join waits on a thread of its own while the actor goes on
// reading its mailbox: a trainer's store that accepts and never answers cannot keep the actor
// from ending (destroyed, killed, the engine stopping), and the actor's end cuts that wait short.
//
// Two rendezvous:
//  - a trainer's TCPStore (a torch.distributed trainer): the join answers once this rank has
//    counted itself in. PyTorch creates the group's NCCL communicator lazily, at the trainer's
//    first broadcast, which comes after the engines' answers; so from then on the actor looks
//    for the group's unique id in the store every 20 ms, between messages, and creates its
//    communicator as soon as the trainer publishes it (at once for a trainer that passed a
//    device_id and creates it inside init_process_group). A receive that comes first waits for
//    it, to the receive's deadline.
//  - a unique id the trainer sends (a trainer that is not PyTorch): the communicator is created
//    inside the join, which answers when it is ready; the trainer creates its own meanwhile.
//
// A receive puts each broadcast into new device buffers of the group's GPU and answers with
// pointers into them; the buffers live until ReleaseBroadcast. Any failure of a receive (a
// deadline, an NCCL error, a trainer gone) breaks the group: a later broadcast could no longer
// be matched with the trainer's, so every later receive is refused until the group is destroyed
// and joined again. Destroy answers once the communicator, the buffers and the store connection
// are gone, then the actor ends. The shared `cancel` flag, set by the weight_updater before a
// destroy (and when it ends) and by the actor's own end, cuts short any wait in progress, the
// join's included.
#pragma once

#include <atomic>
#include <memory>

#include "caf/fwd.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"
#include "messages/all.hpp"

namespace rlserve {

using weight_group_actor = caf::typed_actor<
  // Joins the group (once, the first message).
  caf::replies_to<JoinWeightGroup>::with<InitWeightsUpdateGroupReqOutput>,
  // Receives one update's broadcasts (kept until released, or dropped when not `keep`).
  caf::replies_to<ReceiveBroadcast>::with<ReceivedBroadcast>,
  caf::reacts_to<ReleaseBroadcast>,
  // Leaves the group and ends.
  caf::replies_to<DestroyWeightsUpdateGroupReqInput>::with<DestroyWeightsUpdateGroupReqOutput>,
  // (to itself) looks for the group's unique id in the trainer's store.
  caf::reacts_to<poll_atom>>;

weight_group_actor spawn_weight_group(caf::actor_system& sys, std::shared_ptr<std::atomic<bool>> cancel);

} // namespace rlserve
