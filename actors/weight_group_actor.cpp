#include "actors/weight_group_actor.hpp"

#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "actors/guard.hpp"
#include "caf/all.hpp"
#include "messages/base64.hpp"
#include "messages/registration_check.hpp"
#include "messages/validate.hpp"
#include "model/nccl_group.hpp"
#include "model/tcp_store.hpp"

namespace rlserve {

// A join's rendezvous with the trainer's store, on its way to the thread that waits for it and
// its outcome on the way back (local only: they never leave the process).
struct store_join_job {
  std::string host;
  int port = 0;
  model::nccl_group::clock::time_point deadline;
};
struct store_join_result {
  std::shared_ptr<expected<model::counted_in_trainer_store>> joined;
};

} // namespace rlserve

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::store_join_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::store_join_result)

namespace rlserve {

static_assert(interface_registered<weight_group_actor>::value,
              "a message type of weight_group_actor is not in type_ids.hpp");

namespace {

using clock_type = model::nccl_group::clock;
using limit = model::nccl_group::limit;

constexpr auto k_poll_interval = std::chrono::milliseconds(20);
// Tensors of one per-tensor receive share one allocation, each at an offset aligned for any
// kernel that reads it.
constexpr std::size_t k_tensor_alignment = 256;

struct group_state {
  // Not an aggregate (see weight_updater_actor.cpp).
  group_state() = default;

  std::shared_ptr<std::atomic<bool>> cancel;
  InitWeightsUpdateGroupReqInput request;
  int device = 0;
  int rank = 0;
  std::optional<model::tcp_store_client> store; // joined through the trainer's store
  std::unique_ptr<model::nccl_group> comm;
  std::string broken; // why the group takes no more broadcasts; empty while it is sound
  std::map<uint64_t, model::device_buffer> buffers;
  uint64_t next_buffer = 1;
  // While a join waits on the trainer's store (on a thread of its own): its promise, and the
  // receives that came meanwhile, answered in order once the join has ended.
  std::optional<caf::typed_response_promise<InitWeightsUpdateGroupReqOutput>> joining;
  std::vector<std::pair<caf::typed_response_promise<ReceivedBroadcast>, ReceiveBroadcast>> waiting_receives;
  static inline const char* name = "weight_group";
};

using group_pointer = weight_group_actor::stateful_pointer<group_state>;

std::string what(const group_state& st) {
  return fmt::format("weight-update group \"{}\" (rank {} of {})", st.request.group_name, st.rank,
                     st.request.world_size);
}

// The deadline of a wait: `timeout_s` when positive (a receive's own), else the group's. Both come
// from the trainer, so they are clamped (client_wait: at most a day): converting 1e300 s to the
// clock's nanoseconds unclamped is undefined behaviour, in practice a deadline in the past.
limit limit_for(const group_state& st, double timeout_s) {
  const double s = timeout_s > 0 ? timeout_s : st.request.timeout_s;
  return limit{clock_type::now() + std::chrono::duration_cast<clock_type::duration>(client_wait(s)),
               st.cancel.get()};
}

void mark_broken(group_state& st, std::string why) {
  if (st.broken.empty())
    st.broken = std::move(why);
  st.comm.reset(); // aborts a communicator left in a failed state
  st.store.reset();
}

// Creates the communicator from the unique id the trainer published in its store, waiting for
// it until `until`. A failure breaks the group.
status connect(group_state& st, limit until) {
  if (st.comm)
    return {};
  if (!st.broken.empty())
    return fail(what(st) + " is broken: " + st.broken);
  if (!st.store) {
    mark_broken(st, "it has no rendezvous");
    return fail(what(st) + ": no communicator and no store to find the trainer's in");
  }
  const auto key = model::nccl_unique_id_key(st.request.group_name);
  const std::string_view keys[] = {key};
  const auto started = clock_type::now();
  while (true) {
    // CHECK answers at once; its own deadline is the store's, not the receive's, so a probe
    // near the receive's deadline does not read as a store gone silent.
    auto present = st.store->check(keys, clock_type::now() + std::chrono::seconds(5));
    if (!present) {
      // The store client gives up when the group is destroyed too (the same flag).
      mark_broken(st, until.cancelled() ? "the group was destroyed while it waited for the trainer"
                                        : "the trainer's store went away: " + present.error());
      return fail(what(st) + ": " + st.broken);
    }
    if (*present)
      break;
    if (until.cancelled()) {
      mark_broken(st, "the group was destroyed while it waited for the trainer");
      return fail(what(st) + ": " + st.broken);
    }
    if (clock_type::now() >= until.deadline) {
      auto waited = std::chrono::duration<double>(clock_type::now() - started).count();
      mark_broken(st, fmt::format("waited {:.1f} s for the trainer's NCCL unique id under key \"{}\" "
                                  "in {}: the trainer has not created its communicator for the "
                                  "group (PyTorch does at the group's first collective)",
                                  waited, key, st.store->where()));
      return fail(what(st) + ": " + st.broken);
    }
    std::this_thread::sleep_for(k_poll_interval);
  }
  auto id = st.store->get(key, std::max(until.deadline, clock_type::now() + std::chrono::seconds(5)));
  if (!id) {
    mark_broken(st, id.error());
    return fail(what(st) + ": " + st.broken);
  }
  if (id->size() != model::nccl_unique_id_bytes) {
    mark_broken(st, fmt::format("{} holds {} bytes under \"{}\", not an NCCL unique id ({} bytes)",
                                st.store->where(), id->size(), key, model::nccl_unique_id_bytes));
    return fail(what(st) + ": " + st.broken);
  }
  auto comm = model::nccl_group::create(*id, st.request.world_size, st.rank, st.device,
                                        st.request.group_name, until);
  if (!comm) {
    mark_broken(st, comm.error());
    return fail(comm.error());
  }
  st.comm = std::move(*comm);
  return {};
}

// Joins with the unique id the trainer sent: the communicator is created here.
InitWeightsUpdateGroupReqOutput join_with_unique_id(group_state& st) {
  const auto& r = st.request;
  auto id = hex_decode(r.nccl_unique_id);
  if (!id)
    return {false, "nccl_unique_id: " + id.error()};
  auto comm = model::nccl_group::create(*id, r.world_size, st.rank, st.device, r.group_name,
                                        limit_for(st, 0));
  if (!comm)
    return {false, comm.error()};
  st.comm = std::move(*comm);
  return {true, fmt::format("joined {} on cuda:{} with the trainer's unique id ({})", what(st),
                            st.device, model::nccl_group::version())};
}

// The join's answer once the store rendezvous is over.
InitWeightsUpdateGroupReqOutput joined_store(group_state& st, expected<model::counted_in_trainer_store> joined) {
  if (!joined) {
    if (st.cancel->load())
      return {false, fmt::format("{}: the group was destroyed, or the engine is stopping, while it "
                                 "joined: {}",
                                 what(st), joined.error())};
    return {false, fmt::format("{}: {}", what(st), joined.error())};
  }
  st.store = std::move(joined->client);
  return {true, fmt::format("joined {} through {} ({} ranks counted in); the NCCL communicator "
                            "follows as soon as the trainer creates its own",
                            what(st), st.store->where(), joined->joined)};
}

// The thread a store rendezvous waits on (one per join): the trainer's store may accept and
// never answer, for as long as the trainer's deadline (up to a day). Waiting here rather than on
// the group's own thread leaves the group's mailbox free, so the group can still be ended (an
// exit message is only read between handlers); its end sets `cancel`, which cuts this wait short.
caf::behavior store_rendezvous(caf::event_based_actor* self, std::shared_ptr<std::atomic<bool>> cancel) {
  return {guard_handler("weight-update group's store thread", [self, cancel](store_join_job& job) {
    self->quit();
    return store_join_result{std::make_shared<expected<model::counted_in_trainer_store>>(
      model::count_in_trainer_store(job.host, job.port, job.deadline, cancel.get()))};
  })};
}

// Looks once for the unique id; creates the communicator when it is there, else looks again
// soon. Stops when the group has a communicator or is broken.
void poll(group_pointer self) {
  auto& st = self->state;
  if (st.comm || !st.broken.empty() || !st.store || st.cancel->load())
    return;
  const auto key = model::nccl_unique_id_key(st.request.group_name);
  const std::string_view keys[] = {key};
  auto present = st.store->check(keys, clock_type::now() + std::chrono::seconds(5));
  if (!present) {
    mark_broken(st, "the trainer's store went away: " + present.error());
    return;
  }
  if (*present) {
    (void)connect(st, limit_for(st, 0)); // a failure is kept in `broken` for the next receive
    return;
  }
  self->delayed_send(self, k_poll_interval, poll_atom_v);
}

ReceivedBroadcast receive(group_state& st, ReceiveBroadcast& msg) {
  auto broken_reply = [&](std::string why) {
    ReceivedBroadcast out;
    out.success = false;
    out.message = std::move(why);
    out.group_broken = true;
    return out;
  };
  if (!st.broken.empty())
    return broken_reply(what(st) + " is broken: " + st.broken);
  const auto started = clock_type::now();
  // Where each tensor lands; a flattened bucket packs them back to back, as the trainer did.
  std::vector<std::size_t> offsets, bytes;
  std::size_t total = 0;
  std::string misaligned;
  for (const auto& t : msg.tensors) {
    const int64_t numel = checked_numel(t.shape);
    if (numel < 0) {
      mark_broken(st, "an update announced a tensor of impossible shape");
      return broken_reply(fmt::format("{}: tensor '{}' has a negative or overflowing shape, so the "
                                      "trainer's bytes cannot be matched", what(st), t.name));
    }
    const std::size_t n = static_cast<std::size_t>(numel) * element_size(t.type);
    if (msg.flattened) {
      if (total % element_size(t.type) != 0 && misaligned.empty())
        misaligned = fmt::format("tensor '{}' starts at byte {} of the flattened bucket, not a "
                                 "multiple of its element size ({} bytes)",
                                 t.name, total, element_size(t.type));
    } else {
      total = (total + k_tensor_alignment - 1) / k_tensor_alignment * k_tensor_alignment;
    }
    offsets.push_back(total);
    bytes.push_back(n);
    total += n;
  }
  if (msg.tensors.empty())
    return ReceivedBroadcast{true, "nothing to receive", 0, {}, false};
  auto until = limit_for(st, msg.timeout_s);
  if (auto s = connect(st, until); !s)
    return broken_reply(s.error());
  auto buffer = model::device_buffer::allocate(st.device, total);
  if (!buffer) {
    mark_broken(st, "the engine could not hold an update's bytes");
    return broken_reply(what(st) + ": " + buffer.error());
  }
  std::vector<model::nccl_buffer> targets;
  if (msg.flattened) {
    targets.push_back({buffer->data(), static_cast<int64_t>(total), dtype::u8});
  } else {
    for (std::size_t i = 0; i < msg.tensors.size(); ++i) {
      // NCCL has no 16-bit integer type; a broadcast moves bytes either way.
      const auto type = msg.tensors[i].type == dtype::i16 ? dtype::u8 : msg.tensors[i].type;
      targets.push_back({buffer->data() + offsets[i],
                         static_cast<int64_t>(bytes[i] / element_size(type)), type});
    }
  }
  if (auto s = st.comm->broadcast(targets, 0, until); !s) {
    mark_broken(st, s.error());
    return broken_reply(s.error());
  }
  const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - started).count();
  if (!misaligned.empty())
    return ReceivedBroadcast{false, what(st) + ": " + misaligned + "; the bucket was received and dropped",
                             0, {}, false};
  if (!msg.keep)
    return ReceivedBroadcast{true,
                             fmt::format("received and dropped {} tensors ({} bytes)", msg.tensors.size(), total),
                             0, {}, false};
  ReceivedBroadcast out;
  out.message = fmt::format("received {} tensors ({:.1f} MiB) over {} in {:.1f} ms", msg.tensors.size(),
                            static_cast<double>(total) / (1 << 20), what(st), ms);
  for (std::size_t i = 0; i < msg.tensors.size(); ++i) {
    DeviceTensorRef ref;
    ref.device = st.device;
    ref.pointer = reinterpret_cast<uint64_t>(buffer->data() + offsets[i]);
    ref.nbytes = bytes[i];
    ref.type = msg.tensors[i].type;
    ref.shape = msg.tensors[i].shape;
    out.tensors.push_back({msg.tensors[i].name, std::move(ref)});
  }
  out.buffer_id = st.next_buffer++;
  st.buffers.emplace(out.buffer_id, std::move(*buffer));
  return out;
}

// Answers the receives that waited for the join, in order.
void answer_waiting_receives(group_state& st) {
  auto waiting = std::move(st.waiting_receives);
  st.waiting_receives.clear();
  for (auto& [rp, msg] : waiting)
    rp.deliver(receive(st, msg));
}

// The join through the store has ended with `out`: answers it and the receives that waited.
void end_join(group_pointer self, InitWeightsUpdateGroupReqOutput out) {
  auto& st = self->state;
  if (!st.joining)
    return;
  auto rp = std::move(*st.joining);
  st.joining.reset();
  const bool ok = out.success;
  if (!ok)
    mark_broken(st, "joining failed: " + out.message);
  rp.deliver(std::move(out));
  answer_waiting_receives(st);
  if (!ok)
    self->quit();
  else if (!st.comm)
    self->send(self, poll_atom_v);
}

// Joins through the trainer's store: counts this rank in on a thread of its own, and answers
// when that is done. Not awaited: CAF 0.17 reads nothing else while an actor awaits a response,
// not even an exit message, so an awaiting group could not be ended. Receives that come
// meanwhile wait for the join (waiting_receives); a destroy answers the join at once.
caf::result<InitWeightsUpdateGroupReqOutput> join_through_store(group_pointer self) {
  auto& st = self->state;
  st.joining = self->make_response_promise<InitWeightsUpdateGroupReqOutput>();
  auto rp = *st.joining;
  auto worker = self->spawn<caf::detached>(store_rendezvous, st.cancel);
  // The handlers hold the worker: nothing else does, and CAF would destroy it unrun.
  self->request(worker, caf::infinite,
                store_join_job{st.request.master_address, st.request.master_port, limit_for(st, 0).deadline})
    .then(
      [self, worker](store_join_result& r) {
        guarded([&] { end_join(self, joined_store(self->state, std::move(*r.joined))); },
                [&](const std::string& why) { end_join(self, {false, what(self->state) + ": " + why}); });
      },
      [self, worker](caf::error& e) {
        end_join(self, {false, fmt::format("{}: the store rendezvous's thread failed: {}",
                                           what(self->state), self->system().render(e))});
      });
  return rp;
}

weight_group_actor::behavior_type weight_group(group_pointer self,
                                               std::shared_ptr<std::atomic<bool>> cancel) {
  self->state.cancel = std::move(cancel);
  // However the group ends (a destroy, a failed join, killed), a wait still running for it on
  // another thread (the store rendezvous) ends too.
  self->attach_functor([flag = self->state.cancel] { flag->store(true); });
  return guarded_behavior<weight_group_actor::behavior_type>(
    group_state::name,
    [self](JoinWeightGroup& msg) -> caf::result<InitWeightsUpdateGroupReqOutput> {
      auto& st = self->state;
      st.request = std::move(msg.request);
      st.device = msg.device;
      st.rank = msg.rank;
      if (st.request.nccl_unique_id.empty())
        return join_through_store(self);
      auto rp = self->make_response_promise<InitWeightsUpdateGroupReqOutput>();
      auto out = join_with_unique_id(st);
      const bool ok = out.success;
      rp.deliver(std::move(out));
      if (!ok)
        self->quit();
      return rp;
    },
    [self](ReceiveBroadcast& msg) -> caf::result<ReceivedBroadcast> {
      auto& st = self->state;
      if (!st.joining)
        return receive(st, msg);
      auto rp = self->make_response_promise<ReceivedBroadcast>();
      st.waiting_receives.emplace_back(rp, std::move(msg));
      return rp;
    },
    [self](ReleaseBroadcast& msg) { self->state.buffers.erase(msg.buffer_id); },
    [self](DestroyWeightsUpdateGroupReqInput&) -> caf::result<DestroyWeightsUpdateGroupReqOutput> {
      auto& st = self->state;
      auto rp = self->make_response_promise<DestroyWeightsUpdateGroupReqOutput>();
      const auto name = what(st);
      if (st.joining) { // its rendezvous thread ends with the actor (the cancel flag)
        st.joining->deliver(InitWeightsUpdateGroupReqOutput{
          false, fmt::format("{}: the group was destroyed while it joined the trainer's TCPStore "
                             "at {}:{}",
                             name, st.request.master_address, st.request.master_port)});
        st.joining.reset();
      }
      mark_broken(st, "the group was destroyed");
      answer_waiting_receives(st);
      st.buffers.clear();
      st.comm.reset();
      st.store.reset();
      rp.deliver(DestroyWeightsUpdateGroupReqOutput{true, "left " + name});
      self->quit();
      return rp;
    },
    [self](poll_atom) { poll(self); });
}

} // namespace

weight_group_actor spawn_weight_group(caf::actor_system& sys, std::shared_ptr<std::atomic<bool>> cancel) {
  return sys.spawn<caf::detached>(weight_group, std::move(cancel));
}

} // namespace rlserve
