#include "actors/weight_updater_actor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <xxhash.h>

#include "actors/guard.hpp"
#include "actors/policy/update_session.hpp"
#include "actors/watch.hpp"
#include "actors/weight_group_actor.hpp"
#include "caf/all.hpp"
#include "messages/registration_check.hpp"
#include "messages/enums.hpp"
#include "model/checkpoint.hpp"

namespace rlserve {

// CAF 0.17 does not check type IDs: a message type missing from messages/type_ids.hpp would
// work here and fail across processes.
static_assert(interface_registered<weight_updater_actor>::value, "a message type of weight_updater_actor is not in type_ids.hpp");

namespace {

struct runner_entry {
  runner_handle handle;
  std::unordered_map<std::string, const TensorSpec*> by_name;
  std::unordered_map<std::string, std::string> aliases; // alias -> canonical name
};

// One NCCL weight-update group this engine joined (actors/weight_group_actor.hpp).
struct group_entry {
  std::string name;
  weight_group_actor actor;
  std::shared_ptr<std::atomic<bool>> cancel; // cuts short the group's waits (destroy, shutdown)
  std::set<uint64_t> tickets;                // received updates whose buffers runners may still read
  bool leaving = false;                      // destroyed: leaves once no ticket is outstanding
  std::vector<caf::typed_response_promise<DestroyWeightsUpdateGroupReqOutput>> destroyed;

  group_entry() = default;
  group_entry(const group_entry&) = delete;
  group_entry& operator=(const group_entry&) = delete;
  // The last reference goes with the weight_updater (the engine stops) or after the group left:
  // a wait still in progress on the group's thread ends at once, and so does the thread.
  ~group_entry() {
    if (cancel)
      cancel->store(true);
    if (actor)
      caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }
};

// The bytes of one update_weights_from_distributed, received and waiting to be staged.
struct received_update {
  std::shared_ptr<group_entry> group;
  uint64_t buffer_id = 0;
  std::vector<NamedDeviceTensor> tensors; // pointers into the group's buffers
};

struct updater_state {
  // Not an aggregate: under C++20, CAF 0.17's stateful_actor would otherwise try to build the
  // state from the actor pointer (parenthesized aggregate init makes is_constructible true).
  updater_state() = default;

  std::vector<std::unique_ptr<runner_entry>> runners; // target first
  std::map<std::string, std::shared_ptr<group_entry>> groups; // joined or joining, by name
  std::map<uint64_t, received_update> received;               // by ticket
  uint64_t next_ticket = 1;
  // The session rules and the weight version (the one place it lives).
  policy::update_session session{"0"};
  bool allow_non_finite = false; // engine option allow_non_finite_weights
  weight_group_spawner spawn_group; // spawn_weight_group, unless a test watches the groups
  pending_requests waits;        // requests to the runners: failed when one dies holding them
  static inline const char* name = "weight_updater";
};

using updater_pointer = weight_updater_actor::stateful_pointer<updater_state>;

std::string selector_name(runner_selector s) { return std::string(to_string(s)); }

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string spec_string(dtype t, const std::vector<int64_t>& shape) {
  return std::string(torch_name(t)) + " " + shape_string(shape);
}

// The first of `targets` whose manifest lacks capability `can`, or null.
const runner_entry* lacking(const std::vector<runner_entry*>& targets,
                            bool RunnerCapabilities::*can) {
  for (const auto* r : targets)
    if (!(r->handle.manifest.capabilities.*can))
      return r;
  return nullptr;
}

std::string runs_on(const runner_entry& r) {
  const auto& m = r.handle.manifest;
  return "the " + m.role + " runner runs on " + (m.device == "cpu" ? "the CPU" : m.device);
}

// The runners a selector reaches, target first; an error when it names a role with no runner.
expected<std::vector<runner_entry*>> select(updater_state& st, runner_selector sel) {
  std::vector<runner_entry*> out;
  for (auto& r : st.runners) {
    const auto& role = r->handle.manifest.role;
    if (sel == runner_selector::all || (sel == runner_selector::target && role == "target") ||
        (sel == runner_selector::draft && role == "draft"))
      out.push_back(r.get());
  }
  if (out.empty())
    return fail(sel == runner_selector::draft
                  ? "selector \"draft\": no draft model is loaded (start the engine with "
                    "--draft-model to have one)"
                  : "selector \"" + selector_name(sel) + "\" reaches no runner");
  return out;
}

// Runs `msg` on every runner of `targets` concurrently and calls `done` with one reply per
// runner (in the same order) once all have answered; a runner that fails to answer (it died)
// yields a reply with success = false and CAF's reason.
template <class Reply, class Msg, class Done>
void gather(updater_pointer self, const std::vector<runner_entry*>& targets, Msg msg, Done done) {
  struct pending_replies {
    std::vector<Reply> replies;
    std::size_t missing;
  };
  auto acc = std::make_shared<pending_replies>(pending_replies{std::vector<Reply>(targets.size()),
                                                               targets.size()});
  if (targets.empty()) {
    done(std::move(acc->replies));
    return;
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    auto role = targets[i]->handle.manifest.role;
    self->state.waits.template request<Reply>(
      self, targets[i]->handle.actor, msg,
      [acc, i, done](Reply& r) mutable {
        acc->replies[i] = std::move(r);
        if (--acc->missing == 0)
          done(std::move(acc->replies));
      },
      [acc, i, done, role](const std::string& why) mutable {
        acc->replies[i].success = false;
        acc->replies[i].message = "the " + role + " runner did not answer: " + why;
        if (--acc->missing == 0)
          done(std::move(acc->replies));
      });
  }
}

// Joins the messages of failed replies, each prefixed by its runner's role.
template <class Reply>
std::optional<std::string> failures(const std::vector<runner_entry*>& targets,
                                    const std::vector<Reply>& replies) {
  std::string msg;
  for (std::size_t i = 0; i < replies.size(); ++i)
    if (!replies[i].success)
      msg += (msg.empty() ? "" : "; ") + targets[i]->handle.manifest.role + ": " +
             replies[i].message;
  if (msg.empty())
    return std::nullopt;
  return msg;
}

// "NaN", "+inf" or "-inf": element i, known to be non-finite.
std::string non_finite_name(const HostTensor& t, std::size_t i) {
  const std::size_t es = element_size(t.type);
  uint64_t bits = 0;
  std::memcpy(&bits, t.data.get() + i * es, es); // little-endian: the low bytes
  const uint64_t sign = bits >> (8 * es - 1) & 1;
  uint64_t mantissa = 0;
  switch (t.type) {
    case dtype::f32: mantissa = bits & 0x7fffff; break;
    case dtype::f16: mantissa = bits & 0x3ff; break;
    case dtype::bf16: mantissa = bits & 0x7f; break;
    case dtype::f64: mantissa = bits & 0xfffffffffffffull; break;
    default: break;
  }
  if (mantissa != 0)
    return "NaN";
  return sign ? "-inf" : "+inf";
}

// Splits checked tensors (host or device) among the selected runners: each name must be a
// parameter (or alias) of at least one of them with the manifest's dtype and shape, or the BF16
// `<prefix>.weight` of an INT4 module (its runner checks and quantizes it). `tied(t, canonical,
// role)` decides a tensor sent under an alias: true when the canonical name's own entry carries
// it, false to route it under the canonical name, or an error. `what` names the kind in errors.
template <class Named, class Tied>
expected<std::vector<std::vector<Named>>> route_owned(const std::vector<runner_entry*>& targets,
                                                      const std::vector<Named>& bucket,
                                                      const updater_state& st, runner_selector sel,
                                                      const std::string& what, Tied tied) {
  std::vector<std::vector<Named>> out(targets.size());
  for (const auto& t : bucket) {
    bool owned = false;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      auto& r = *targets[i];
      std::string name = t.name;
      if (auto a = r.aliases.find(name); a != r.aliases.end()) {
        name = a->second;
        auto carried = tied(t, name, r.handle.manifest.role);
        if (!carried)
          return std::move(carried).take_failure();
        if (*carried) {
          owned = true;
          continue;
        }
      }
      auto spec = r.by_name.find(name);
      if (spec == r.by_name.end()) {
        // The float `<prefix>.weight` of an INT4 module (its manifest lists weight_packed): the
        // runner quantizes it and checks dtype and shape itself.
        if (name.ends_with(".weight") && r.by_name.count(name + "_packed")) {
          owned = true;
          out[i].push_back({name, t.tensor});
        }
        continue;
      }
      owned = true;
      if (spec->second->type != t.tensor.type || spec->second->shape != t.tensor.shape)
        return fail(what + " '" + t.name + "': the " + r.handle.manifest.role + " model expects " +
                    spec_string(spec->second->type, spec->second->shape) + ", the update sent " +
                    spec_string(t.tensor.type, t.tensor.shape));
      out[i].push_back({name, t.tensor});
    }
    if (!owned) {
      for (const auto& r : st.runners)
        if (r->by_name.count(t.name) || r->aliases.count(t.name) || r->by_name.count(t.name + "_packed"))
          return fail(what + " '" + t.name + "' belongs to the " + r->handle.manifest.role +
                      " model, which selector \"" + selector_name(sel) + "\" does not reach");
      return fail("unknown tensor name '" + t.name + "': not a parameter of the " +
                  (targets.size() == 1 ? targets[0]->handle.manifest.role + " model"
                                       : std::string("target or draft model")));
    }
  }
  return out;
}

// Splits a bucket among the selected runners after checking all of it: every name is a
// parameter (or alias) of at least one selected runner, with its dtype, shape and byte count;
// no name twice; tied aliases agree with their target; no NaN or infinity unless the engine
// allows them (GPU runners scan on the device, in one launch per message: the host scan runs only
// when a CPU runner is among the targets). Returns one tensor list per runner.
expected<std::vector<std::vector<NamedTensor>>>
route_bucket(const std::vector<runner_entry*>& targets, const std::vector<NamedTensor>& bucket,
             const updater_state& st, runner_selector sel) {
  std::set<std::string> seen;
  const bool all_on_device = std::all_of(targets.begin(), targets.end(), [](const runner_entry* r) {
    return r->handle.manifest.device != "cpu";
  });
  for (const auto& t : bucket) {
    if (!seen.insert(t.name).second)
      return fail("tensor '" + t.name + "' appears twice in one update");
    for (auto d : t.tensor.shape)
      if (d < 0)
        return fail("tensor '" + t.name + "': negative dimension in shape " +
                    shape_string(t.tensor.shape));
    auto numel = t.tensor.checked_numel();
    if (numel < 0)
      return fail("tensor '" + t.name + "': shape " + shape_string(t.tensor.shape) +
                  " overflows (more bytes than a 64-bit size can count)");
    auto expected_bytes = static_cast<std::size_t>(numel) * element_size(t.tensor.type);
    if (expected_bytes != t.tensor.nbytes)
      return fail("tensor '" + t.name + "': " + std::to_string(t.tensor.nbytes) +
                  " bytes of data for " + spec_string(t.tensor.type, t.tensor.shape) + " (" +
                  std::to_string(expected_bytes) + " expected)");
    if (!st.allow_non_finite && !all_on_device)
      if (auto bad = first_non_finite(t.tensor))
        return fail("tensor '" + t.name + "': element " + std::to_string(*bad) + " is " +
                    non_finite_name(t.tensor, *bad) +
                    "; non-finite weights are refused (engine option allow_non_finite_weights, "
                    "`serve --allow-non-finite-weights`, accepts them)");
  }
  // Sent under both tied names: they are one tensor here, so they must be equal, and the
  // canonical entry carries it.
  return route_owned(targets, bucket, st, sel, "tensor",
                     [&](const NamedTensor& t, const std::string& canonical,
                         const std::string& role) -> expected<bool> {
                       for (const auto& other : bucket) {
                         if (other.name != canonical)
                           continue;
                         if (other.tensor.nbytes != t.tensor.nbytes ||
                             std::memcmp(other.tensor.data.get(), t.tensor.data.get(), t.tensor.nbytes) != 0)
                           return fail("'" + t.name + "' and '" + canonical + "' are tied in the " + role +
                                       " model (tie_word_embeddings) but the update gives them different "
                                       "values");
                         return true;
                       }
                       return false;
                     });
}

// Device tensors (CUDA IPC) of one update message, checked against the manifests as
// route_bucket checks host tensors (the bytes are read by the runners, on the device): one list
// per runner.
expected<std::vector<std::vector<NamedDeviceTensor>>>
route_device(const std::vector<runner_entry*>& targets, const std::vector<NamedDeviceTensor>& bucket,
             const updater_state& st, runner_selector sel) {
  std::set<std::string> seen;
  for (const auto& t : bucket) {
    if (!seen.insert(t.name).second)
      return fail("device tensor '" + t.name + "' appears twice in one update");
    const int64_t numel = checked_numel(t.tensor.shape);
    if (numel < 0)
      return fail("device tensor '" + t.name + "': shape " + shape_string(t.tensor.shape) +
                  " has a negative or overflowing dimension");
    auto want = static_cast<uint64_t>(numel) * element_size(t.tensor.type);
    if (t.tensor.nbytes != 0 && t.tensor.nbytes != want)
      return fail("device tensor '" + t.name + "': " + std::to_string(t.tensor.nbytes) + " bytes for " +
                  spec_string(t.tensor.type, t.tensor.shape) + " (" + std::to_string(want) + " expected)");
  }
  // Both tied names: the bytes are on the device, so they cannot be compared here; one is enough.
  return route_owned(targets, bucket, st, sel, "device tensor",
                     [&](const NamedDeviceTensor& t, const std::string& canonical,
                         const std::string& role) -> expected<bool> {
                       if (seen.count(canonical))
                         return fail("'" + t.name + "' and '" + canonical + "' are tied in the " + role +
                                     " model (tie_word_embeddings): send one of them");
                       return false;
                     });
}

// What one runner gets of an update message.
struct runner_bucket {
  std::vector<NamedTensor> host;
  std::vector<NamedDeviceTensor> device;
  bool empty() const { return host.empty() && device.empty(); }
};

// How staging one message went: `error` is empty on success; `intact` says that every runner
// that failed refused the message whole and none staged any of it (the session may go on).
struct stage_result {
  std::optional<std::string> error;
  bool intact = true;
};

// Stages routed tensors on the runners that got any (host tensors, then device tensors, in
// turn per runner); `done(stage_result)`.
template <class Done>
void stage_routed(updater_pointer self, const std::vector<runner_entry*>& targets,
                  std::vector<runner_bucket> routed, Done done) {
  auto remaining = std::make_shared<std::size_t>(0);
  auto result = std::make_shared<stage_result>();
  auto staged_any = std::make_shared<bool>(false);
  for (auto& b : routed)
    *remaining += !b.host.empty() + !b.device.empty();
  if (*remaining == 0) {
    done(stage_result{});
    return;
  }
  auto finish = [remaining, result, staged_any, done](const std::string& role,
                                                        const RunnerReply& r) mutable {
    if (r.success) {
      *staged_any = true;
    } else {
      result->error = (result->error ? *result->error + "; " : std::string()) + role + ": " + r.message;
      result->intact = result->intact && r.nothing_staged;
    }
    if (--*remaining == 0) {
      if (*staged_any && result->error)
        result->intact = false;
      done(*result);
    }
  };
  for (std::size_t i = 0; i < targets.size(); ++i) {
    auto role = targets[i]->handle.manifest.role;
    auto actor = targets[i]->handle.actor;
    auto on_error = [finish, role](const std::string& why) mutable {
      finish(role, RunnerReply{false, role + " runner did not answer: " + why, false});
    };
    auto device = std::make_shared<std::vector<NamedDeviceTensor>>(std::move(routed[i].device));
    auto send_device = [self, actor, device, finish, role, on_error]() mutable {
      if (device->empty())
        return;
      self->state.waits.template request<RunnerReply>(
        self, actor, StageDeviceTensors{std::move(*device)},
        [finish, role](RunnerReply& r) mutable { finish(role, r); }, on_error);
    };
    if (routed[i].host.empty()) {
      send_device();
      continue;
    }
    self->state.waits.template request<RunnerReply>(
      self, actor, StageTensors{std::move(routed[i].host)},
      [finish, role, send_device](RunnerReply& r) mutable {
        finish(role, r);
        send_device();
      },
      on_error);
  }
}

std::size_t count_tensors(const std::vector<std::vector<NamedTensor>>& routed) {
  std::size_t n = 0;
  for (auto& l : routed)
    n += l.size();
  return n;
}

// Commits runner i, then i + 1, ... (target first, so a draft never serves weights its
// target does not have); `done(error or nullopt)`.
template <class Done>
void commit_chain(updater_pointer self, std::shared_ptr<std::vector<runner_entry*>> targets,
                  std::size_t i, std::string so_far, Done done) {
  if (i == targets->size()) {
    done(std::optional<std::string>{});
    return;
  }
  auto role = (*targets)[i]->handle.manifest.role;
  auto fail_with = [i, so_far, role, done](const std::string& why) mutable {
    std::string msg = role + " runner failed to commit: " + why;
    if (i > 0)
      msg += " (" + so_far + " already committed: the engine is partially updated; resend "
             "every tensor in a new session)";
    done(std::optional<std::string>{msg});
  };
  self->state.waits.template request<RunnerReply>(
    self, (*targets)[i]->handle.actor, commit_atom_v,
    [self, targets, i, so_far, role, done, fail_with](RunnerReply& r) mutable {
      if (!r.success) {
        fail_with(r.message);
        return;
      }
      commit_chain(self, targets, i + 1, so_far.empty() ? role : so_far + ", " + role, done);
    },
    [fail_with](const std::string& why) mutable { fail_with(why); });
}

// What performing one request's plan needs: the session's runners (prepare, commit, discard)
// and, for a stage step, the request's tensors routed to its runners.
struct plan_io {
  policy::session_op op;
  std::vector<runner_entry*> session_runners;
  std::vector<runner_entry*> stage_runners;
  std::vector<runner_bucket> buckets; // one per stage runner
  std::size_t tensors = 0;
  std::optional<std::string> version; // the update's weight_version
};

using answer_fn = std::function<void(bool success, std::string message)>;

// Runs the plan's steps from `i` on, one after another: each step's outcome goes to the session
// machine, whose verdict ends the request or lets the next step run. `text` gathers what the
// verdicts of earlier steps said; `answer` gets the final result.
void run_plan(updater_pointer self, std::shared_ptr<plan_io> io, std::shared_ptr<policy::session_plan> plan,
              std::size_t i, std::string text, answer_fn answer) {
  if (i == plan->steps.size()) {
    answer(true, text + plan->message);
    return;
  }
  auto next = [self, io, plan, i, text, answer](policy::session_verdict v) mutable {
    if (v.discard)
      for (auto* r : io->session_runners)
        caf::anon_send(r->handle.actor, discard_atom_v); // its reply is not needed
    if (v.done) {
      answer(v.success, text + v.message);
      return;
    }
    run_plan(self, io, plan, i + 1, text + v.message, answer);
  };
  switch (plan->steps[i]) {
    case policy::session_step::prepare:
      gather<RunnerReply>(self, io->session_runners, restore_atom_v,
                          [self, io, next](std::vector<RunnerReply> replies) mutable {
                            next(self->state.session.prepared(io->op, failures(io->session_runners, replies),
                                                              io->session_runners.size()));
                          });
      return;
    case policy::session_step::stage:
      stage_routed(self, io->stage_runners, std::move(io->buckets),
                   [self, io, next](stage_result r) mutable {
                     next(self->state.session.staged(
                       io->op, policy::stage_outcome{io->tensors, io->version, r.error, r.intact}));
                   });
      return;
    case policy::session_step::commit:
      commit_chain(self, std::make_shared<std::vector<runner_entry*>>(io->session_runners), 0, "",
                   [self, io, next](std::optional<std::string> err) mutable {
                     next(self->state.session.committed(io->op, err));
                   });
      return;
    case policy::session_step::discard:
      for (auto* r : io->session_runners)
        caf::anon_send(r->handle.actor, discard_atom_v);
      next(policy::session_verdict{});
      return;
  }
}

// Starts a plan the machine made: refused plans answer at once.
void start_plan(updater_pointer self, std::shared_ptr<plan_io> io, policy::session_plan plan,
                answer_fn answer) {
  if (plan.refused) {
    answer(false, plan.message);
    return;
  }
  if (io->session_runners.empty()) {
    auto runners = select(self->state, plan.selector);
    if (runners)
      io->session_runners = *runners;
  }
  run_plan(self, std::move(io), std::make_shared<policy::session_plan>(std::move(plan)), 0, "",
           std::move(answer));
}

// The answer of the calls that end a session (end_weight_update, settle).
answer_fn end_answer(updater_pointer self, caf::typed_response_promise<EndWeightUpdateReqOutput> rp) {
  return [self, rp](bool ok, std::string message) mutable {
    const auto& s = self->state.session;
    rp.deliver(EndWeightUpdateReqOutput{ok, std::move(message), s.version(), s.open()});
  };
}

template <class Out>
answer_fn status_answer(caf::typed_response_promise<Out> rp) {
  return [rp](bool ok, std::string message) mutable {
    Out out;
    out.success = ok;
    out.message = std::move(message);
    rp.deliver(std::move(out));
  };
}

// One update_weights_from_tensor message: checked whole against the manifests, then staged in
// the open session, or in an implicit one opened for it.
void tensor_update(updater_pointer self, UpdateWeightsFromTensorReqInput& req,
                   caf::typed_response_promise<UpdateWeightsFromTensorReqOutput> rp) {
  auto& st = self->state;
  auto answer = status_answer(rp);
  if (req.load_format && *req.load_format != "direct" &&
      !(*req.load_format == "flattened_bucket" && req.named_tensors.empty())) {
    answer(false, "update_weights_from_tensor: load_format \"" + *req.load_format +
                    "\" is not supported for inline tensors (use none or \"direct\")");
    return;
  }
  auto targets = select(st, req.selector);
  if (!targets) {
    answer(false, targets.error());
    return;
  }
  const std::string unchanged = st.session.open()
                                  ? "; nothing from this update was staged (the session stays open)"
                                  : "; nothing from this update was staged";
  auto routed = route_bucket(*targets, req.named_tensors, st, req.selector);
  if (!routed) {
    answer(false, routed.error() + unchanged);
    return;
  }
  auto routed_device = route_device(*targets, req.device_tensors, st, req.selector);
  if (!routed_device) {
    answer(false, routed_device.error() + unchanged);
    return;
  }
  // Refused here, from the manifests, so no runner is asked to stage part of the message.
  if (!req.device_tensors.empty())
    if (const auto* r = lacking(*targets, &RunnerCapabilities::device_tensors)) {
      answer(false, runs_on(*r) + " and cannot read tensors from a trainer's GPU (CUDA IPC "
                                  "handles); send them inline (named_tensors) or from disk" +
                      unchanged);
      return;
    }
  auto io = std::make_shared<plan_io>();
  io->op = policy::session_op::tensor_update;
  io->stage_runners = *targets;
  io->tensors = count_tensors(*routed);
  io->buckets.resize(targets->size());
  for (std::size_t i = 0; i < targets->size(); ++i) {
    io->buckets[i].host = std::move((*routed)[i]);
    io->tensors += (*routed_device)[i].size();
    io->buckets[i].device = std::move((*routed_device)[i]);
  }
  io->version = req.weight_version;
  start_plan(self, io, st.session.update(req.selector, req.requester), std::move(answer));
}

// update_weights_from_disk: every parameter of the selected runners read from the checkpoint
// (owned copies), checked, then prepared, staged and committed as a session of its own.
void disk_update(updater_pointer self, UpdateWeightFromDiskReqInput& req,
                 caf::typed_response_promise<UpdateWeightFromDiskReqOutput> rp) {
  auto& st = self->state;
  auto answer = [rp, path = req.model_path](bool ok, std::string message) mutable {
    rp.deliver(UpdateWeightFromDiskReqOutput{
      ok, ok ? "loaded from " + path + ": " + message : message, 0});
  };
  if (auto why = st.session.disk_refusal()) {
    answer(false, *why);
    return;
  }
  auto targets = select(st, req.selector);
  if (!targets) {
    answer(false, targets.error());
    return;
  }
  auto ckpt = model::checkpoint::open(req.model_path);
  if (!ckpt) {
    answer(false, ckpt.error());
    return;
  }
  std::vector<NamedTensor> bucket;
  std::set<std::string> wanted;
  for (auto* r : *targets)
    for (const auto& spec : r->handle.manifest.parameters)
      wanted.insert(spec.name);
  // An INT4 module may come as its load-format tensors or, from a trainer's BF16 checkpoint,
  // as `<prefix>.weight`, which the runner quantizes with the module's recipe.
  const auto available = ckpt->names();
  const std::set<std::string> present(available.begin(), available.end());
  std::set<std::string> bf16_of_int4;
  for (const auto& name : wanted) {
    if (name.ends_with(".weight_packed") && !present.count(name)) {
      auto prefix = name.substr(0, name.size() - 14);
      if (present.count(prefix + ".weight")) {
        bf16_of_int4.insert(prefix);
        continue;
      }
    }
    if ((name.ends_with(".weight_scale") || name.ends_with(".weight_zero_point") ||
         name.ends_with(".weight_shape")) && !present.count(name)) {
      auto prefix = name.substr(0, name.rfind(".weight_"));
      if (present.count(prefix + ".weight") && !present.count(prefix + ".weight_packed"))
        continue; // the module comes as BF16: none of its load-format tensors are needed
    }
    auto t = ckpt->tensor(name);
    if (!t) {
      answer(false, req.model_path + " lacks tensor '" + name + "' (" + t.error() +
                      "); weights unchanged");
      return;
    }
    bucket.push_back({name, std::move(*t)});
  }
  for (const auto& prefix : bf16_of_int4) {
    auto t = ckpt->tensor(prefix + ".weight");
    if (!t) {
      answer(false, t.error() + "; weights unchanged");
      return;
    }
    bucket.push_back({prefix + ".weight", std::move(*t)});
    wanted.insert(prefix + ".weight");
  }
  for (const auto& name : available) {
    bool tolerated = name.find("rotary_emb.inv_freq") != std::string::npos;
    for (auto* r : *targets)
      tolerated = tolerated || r->aliases.count(name);
    if (!wanted.count(name) && !tolerated) {
      answer(false, req.model_path + " holds tensor '" + name +
                      "', which no selected model has (is it a checkpoint of another "
                      "architecture?); weights unchanged");
      return;
    }
  }
  auto routed = route_bucket(*targets, bucket, st, req.selector);
  if (!routed) {
    answer(false, routed.error() + "; weights unchanged");
    return;
  }
  auto io = std::make_shared<plan_io>();
  io->op = policy::session_op::disk_update;
  io->session_runners = *targets;
  io->stage_runners = *targets;
  io->tensors = count_tensors(*routed);
  io->buckets.resize(targets->size());
  for (std::size_t i = 0; i < targets->size(); ++i)
    io->buckets[i].host = std::move((*routed)[i]);
  start_plan(self, io, st.session.disk(req.selector, req.weight_version), std::move(answer));
}

// ---- NCCL weight-update groups ------------------------------------------------------------------

// The CUDA ordinal of a GPU runner's device ("cuda:0 (NVIDIA H200)" -> 0).
expected<int> cuda_ordinal(const std::string& device) {
  int ordinal = -1;
  if (std::sscanf(device.c_str(), "cuda:%d", &ordinal) != 1 || ordinal < 0)
    return fail("the target runner's device \"" + device + "\" is not a CUDA device");
  return ordinal;
}

// Removes `group` from the engine's groups, unless its name has been taken by a newer group.
void forget_group(updater_state& st, const std::shared_ptr<group_entry>& group) {
  if (auto it = st.groups.find(group->name); it != st.groups.end() && it->second == group)
    st.groups.erase(it);
}

// init_weights_update_group: checks the request against the target runner (it must take NCCL
// groups; the engine's rank must be one the trainer does not hold), then spawns the group's
// actor, which joins the trainer's store and creates the communicator on its own thread. The
// group is known by its name from now on, so a second init with that name is refused while this
// one joins; a failed join forgets it again.
caf::result<InitWeightsUpdateGroupReqOutput> join_group(updater_pointer self,
                                                        const InitWeightsUpdateGroupReqInput& req) {
  auto& st = self->state;
  auto refuse = [&](const std::string& why) {
    return InitWeightsUpdateGroupReqOutput{false, "cannot join weight-update group \"" +
                                                    req.group_name + "\": " + why};
  };
  const auto& target = *st.runners.front();
  if (!target.handle.manifest.capabilities.weight_update_groups)
    return refuse(runs_on(target) + " and cannot join NCCL weight-update groups (send the "
                  "tensors by CUDA IPC, inline or from disk; get_server_info's "
                  "weight_transports lists what this engine takes)");
  if (req.group_name.empty())
    return refuse("group_name is empty");
  if (st.groups.count(req.group_name))
    return refuse("this engine is in a group of that name already "
                  "(destroy_weights_update_group it first, or choose another name)");
  const int rank = req.rank_offset + target.handle.manifest.tp_rank;
  if (req.rank_offset < 1 || rank >= req.world_size)
    return refuse("rank_offset " + std::to_string(req.rank_offset) + " gives this engine rank " +
                  std::to_string(rank) + " of world_size " + std::to_string(req.world_size) +
                  "; rank 0 is the trainer, which broadcasts, so engines are ranks 1 .. "
                  "world_size - 1");
  if (!(req.timeout_s > 0))
    return refuse(fmt::format("timeout_s: {} is not a number of seconds > 0", req.timeout_s));
  auto device = cuda_ordinal(target.handle.manifest.device);
  if (!device)
    return refuse(device.error());
  auto group = std::make_shared<group_entry>();
  group->name = req.group_name;
  group->cancel = std::make_shared<std::atomic<bool>>(false);
  group->actor = st.spawn_group(self->system(), group->cancel);
  self->monitor(group->actor);
  st.groups.emplace(group->name, group);
  auto rp = self->make_response_promise<InitWeightsUpdateGroupReqOutput>();
  st.waits.template request<InitWeightsUpdateGroupReqOutput>(
    self, group->actor, JoinWeightGroup{req, *device, rank},
    [self, group, rp](InitWeightsUpdateGroupReqOutput& out) mutable {
      if (!out.success) // the group actor ends by itself
        forget_group(self->state, group);
      rp.deliver(std::move(out));
    },
    [self, group, rp](const std::string& why) mutable {
      forget_group(self->state, group);
      rp.deliver(InitWeightsUpdateGroupReqOutput{false, "weight-update group \"" + group->name +
                                                          "\" stopped while joining: " + why});
    });
  return rp;
}

// Sends the group its destroy once no runner reads its buffers any more; answers every
// destroy_weights_update_group waiting for it.
void leave_group(updater_pointer self, const std::shared_ptr<group_entry>& group) {
  if (!group->leaving || !group->tickets.empty())
    return;
  auto answer = [group](DestroyWeightsUpdateGroupReqOutput out) {
    for (auto& rp : group->destroyed)
      rp.deliver(out);
    group->destroyed.clear();
  };
  self->state.waits.template request<DestroyWeightsUpdateGroupReqOutput>(
    self, group->actor, DestroyWeightsUpdateGroupReqInput{group->name},
    [answer](DestroyWeightsUpdateGroupReqOutput& out) mutable { answer(std::move(out)); },
    [answer, name = group->name](const std::string& why) mutable {
      answer({true, "weight-update group \"" + name + "\" is gone (" + why + ")"});
    });
}

// Destroys a group: no new update may use it; it leaves once its outstanding buffers are
// released. `rp`, when given, gets the answer. `group` is taken by value: the caller's
// reference may be the engine's own map entry, which forget_group erases.
void destroy_group(updater_pointer self, std::shared_ptr<group_entry> group,
                   std::optional<caf::typed_response_promise<DestroyWeightsUpdateGroupReqOutput>> rp = {}) {
  forget_group(self->state, group);
  const bool first = !group->leaving;
  group->leaving = true;
  group->cancel->store(true);
  if (rp)
    group->destroyed.push_back(std::move(*rp));
  if (first)
    leave_group(self, group);
}

// The group's buffers of a received update are no longer read.
void release_ticket(updater_pointer self, uint64_t ticket) {
  auto& st = self->state;
  auto it = st.received.find(ticket);
  if (it == st.received.end())
    return;
  auto group = it->second.group;
  self->send(group->actor, ReleaseBroadcast{it->second.buffer_id});
  group->tickets.erase(ticket);
  st.received.erase(it);
  leave_group(self, group);
}

// Why an NCCL update may not be staged (checked before receiving, from the manifests and the
// session), or nothing.
std::optional<std::string> distributed_refusal(updater_state& st, const UpdateWeightsFromDistributedReqInput& req) {
  // The JSON codec refuses these already; in-process callers reach here unchecked, and a
  // non-positive wait would otherwise silently become the group's.
  if (req.timeout_s && !(*req.timeout_s > 0))
    return fmt::format("timeout_s: {} is not a number of seconds > 0 (leave it out to wait as long "
                       "as init_weights_update_group's timeout_s)",
                       *req.timeout_s);
  if (req.load_format && *req.load_format != "flattened_bucket")
    return "load_format \"" + *req.load_format + "\" is not supported (none: one broadcast per "
           "tensor, or \"flattened_bucket\")";
  auto targets = select(st, req.selector);
  if (!targets)
    return targets.error();
  if (const auto* r = lacking(*targets, &RunnerCapabilities::device_tensors))
    return runs_on(*r) + " and cannot read the tensors the target receives (use selector "
                         "\"target\", and update the draft inline or from disk)";
  std::vector<NamedDeviceTensor> specs;
  for (std::size_t i = 0; i < req.names.size(); ++i) {
    NamedDeviceTensor t;
    t.name = req.names[i];
    t.tensor.type = req.dtypes[i];
    t.tensor.shape = req.shapes[i];
    specs.push_back(std::move(t));
  }
  if (auto routed = route_device(*targets, specs, st, req.selector); !routed)
    return routed.error();
  return st.session.update_refusal(req.selector, req.requester);
}

// After a failed receive, the group is destroyed and an open session this requester may
// abort is aborted (the old weights keep serving); `answer` gets `why` with what was done.
void receive_failed(updater_pointer self, const std::shared_ptr<group_entry>& group, const std::string& why,
                    policy::requester_id requester, std::function<void(std::string)> answer) {
  destroy_group(self, group);
  std::string text = why + "; weight-update group \"" + group->name +
                     "\" was destroyed (init_weights_update_group again to go on)";
  auto& session = self->state.session;
  if (!session.open() || policy::update_session{session}.end(true, std::nullopt, requester).refused) {
    answer(text + "; nothing was staged");
    return;
  }
  auto io = std::make_shared<plan_io>();
  io->op = policy::session_op::end;
  start_plan(self, io, session.end(true, std::nullopt, requester),
             [text, answer](bool, std::string message) { answer(text + "; the session was aborted (" + message + ")"); });
}

// Receives the broadcast of one update_weights_from_distributed into the group's buffers: a
// ticket to stage it with, or a failure. A request the manifests or the session refuse still
// receives, and drops, the trainer's bytes, so the group's next broadcast lines up.
void receive_distributed(updater_pointer self, UpdateWeightsFromDistributedReqInput req,
                         std::function<void(ReceivedBroadcast)> done) {
  auto& st = self->state;
  auto refuse = [&](std::string why) {
    ReceivedBroadcast out;
    out.success = false;
    out.message = std::move(why);
    done(std::move(out));
  };
  auto it = st.groups.find(req.group_name);
  if (it == st.groups.end()) {
    std::string names;
    for (auto& [name, g] : st.groups)
      names += (names.empty() ? "" : ", ") + ("\"" + name + "\"");
    refuse("no weight-update group named \"" + req.group_name + "\" exists (" +
           (names.empty() ? std::string("none is joined") : "joined: " + names) +
           "); call init_weights_update_group first");
    return;
  }
  auto group = it->second;
  ReceiveBroadcast msg;
  msg.flattened = req.load_format && *req.load_format == "flattened_bucket";
  msg.timeout_s = req.timeout_s.value_or(0);
  std::optional<std::string> refusal;
  if (req.names.size() != req.dtypes.size() || req.names.size() != req.shapes.size()) {
    refusal = "names, dtypes and shapes have different lengths (" + std::to_string(req.names.size()) +
              ", " + std::to_string(req.dtypes.size()) + ", " + std::to_string(req.shapes.size()) + ")";
  } else {
    for (std::size_t i = 0; i < req.names.size() && !refusal; ++i) {
      if (checked_numel(req.shapes[i]) < 0)
        refusal = "tensor '" + req.names[i] + "': shape " + shape_string(req.shapes[i]) +
                  " has a negative or overflowing dimension";
      msg.tensors.push_back({req.names[i], req.dtypes[i], req.shapes[i]});
    }
  }
  if (refusal) {
    // The trainer's bytes cannot be counted, so they cannot be taken: the group is out of step.
    receive_failed(self, group, "update_weights_from_distributed: " + *refusal, req.requester,
                   [refuse](std::string text) mutable { refuse(std::move(text)); });
    return;
  }
  refusal = distributed_refusal(st, req);
  msg.keep = !refusal;
  const auto requester = req.requester;
  st.waits.template request<ReceivedBroadcast>(
    self, group->actor, std::move(msg),
    [self, group, refusal, requester, done](ReceivedBroadcast& r) mutable {
      if (r.group_broken) {
        receive_failed(self, group, r.message, requester, [done](std::string text) mutable {
          ReceivedBroadcast out;
          out.success = false;
          out.message = std::move(text);
          done(std::move(out));
        });
        return;
      }
      if (r.success && refusal) {
        r.success = false;
        r.message = *refusal + "; nothing was staged (the broadcast was received and dropped, so "
                               "weight-update group \"" + group->name + "\" stays in step with the trainer)";
      }
      if (r.success) {
        auto& st = self->state;
        const auto ticket = st.next_ticket++;
        st.received[ticket] = received_update{group, r.buffer_id, std::move(r.tensors)};
        group->tickets.insert(ticket);
        r.tensors.clear();
        r.buffer_id = ticket;
        if (group->leaving) { // destroyed while it received
          release_ticket(self, ticket);
          r.success = false;
          r.message = "weight-update group \"" + group->name + "\" was destroyed during the receive";
        }
      }
      done(std::move(r));
    },
    [self, group, requester, done](const std::string& why) mutable {
      receive_failed(self, group, "weight-update group \"" + group->name + "\" stopped: " + why, requester,
                     [done](std::string text) mutable {
                       ReceivedBroadcast out;
                       out.success = false;
                       out.message = std::move(text);
                       done(std::move(out));
                     });
    });
}

// Stages a received update (its ticket) in the open session, or an implicit one, like a tensor
// update; the group's buffers are released when the plan has run.
void stage_received(updater_pointer self, const UpdateWeightsFromDistributedReqInput& req, uint64_t ticket,
                    answer_fn answer) {
  auto& st = self->state;
  auto it = st.received.find(ticket);
  if (it == st.received.end()) {
    answer(false, "update_weights_from_distributed: the received tensors are gone (was weight-update "
                  "group \"" + req.group_name + "\" destroyed?); nothing was staged");
    return;
  }
  auto done = [self, ticket, answer](bool ok, std::string message) {
    release_ticket(self, ticket);
    answer(ok, std::move(message));
  };
  auto targets = select(st, req.selector);
  if (!targets) {
    done(false, targets.error() + "; nothing was staged");
    return;
  }
  auto routed = route_device(*targets, it->second.tensors, st, req.selector);
  if (!routed) {
    done(false, routed.error() + "; nothing was staged");
    return;
  }
  auto io = std::make_shared<plan_io>();
  io->op = policy::session_op::tensor_update;
  io->stage_runners = *targets;
  io->buckets.resize(targets->size());
  for (std::size_t i = 0; i < targets->size(); ++i) {
    io->tensors += (*routed)[i].size();
    io->buckets[i].device = std::move((*routed)[i]);
  }
  io->version = req.weight_version;
  start_plan(self, io, st.session.update(req.selector, req.requester), std::move(done));
}

// ---- the handlers that do more than start one plan ----------------------------------------------

// begin_weight_update: refused while a session is open, whatever the selector (the machine says
// why); otherwise the selected runners prepare, and the session opens when they have.
caf::result<BeginWeightUpdateReqOutput> begin_session(updater_pointer self, const BeginWeightUpdateReqInput& req) {
  auto& st = self->state;
  if (st.session.open())
    return BeginWeightUpdateReqOutput{false, st.session.begin(req.selector, req.requester).message};
  auto targets = select(st, req.selector);
  if (!targets)
    return BeginWeightUpdateReqOutput{false, targets.error()};
  auto rp = self->make_response_promise<BeginWeightUpdateReqOutput>();
  auto io = std::make_shared<plan_io>();
  io->op = policy::session_op::begin;
  io->session_runners = *targets;
  start_plan(self, io, st.session.begin(req.selector, req.requester), status_answer(rp));
  return rp;
}

// update_weights_from_distributed: the scheduler has the broadcast received first (receive_atom,
// while generation runs) and then sends the update with its ticket; a request sent straight here
// receives, then stages.
void distributed_update(updater_pointer self, const UpdateWeightsFromDistributedReqInput& req, answer_fn answer) {
  if (req.received != 0) {
    stage_received(self, req, req.received, std::move(answer));
    return;
  }
  receive_distributed(self, req, [self, req, answer](ReceivedBroadcast r) mutable {
    if (!r.success)
      answer(false, r.message);
    else
      stage_received(self, req, r.buffer_id, std::move(answer));
  });
}

// check_weights' answer from the selected runners' replies, all successful: names of the draft
// (any role but the target) prefixed with its role; for `checksum`, each role's checksum and the
// overall one over the sorted lines `name:digest\n` (docs/architecture.md, 'Checksums').
CheckWeightsReqOutput merge_checks(check_weights_action action, const std::vector<RunnerCheckOutput>& replies) {
  CheckWeightsReqOutput out;
  ChecksumInfo info;
  std::string messages;
  for (const auto& r : replies) {
    std::string prefix = r.role == "target" ? "" : r.role + ".";
    std::string role_stream;
    for (std::size_t i = 0; i < r.names.size(); ++i) {
      auto digest = hex16(r.digests[i]);
      info.checksums[prefix + r.names[i]] = digest;
      role_stream += r.names[i] + ":" + digest + "\n";
    }
    for (const auto& n : r.changed)
      out.changed.push_back(prefix + n);
    for (const auto& n : r.unchanged)
      out.unchanged.push_back(prefix + n);
    if (action == check_weights_action::checksum)
      info.role_checksums[r.role] = hex16(XXH3_64bits(role_stream.data(), role_stream.size()));
    ParallelismInfo p;
    p.role = r.role;
    info.parallelism_info.push_back(p);
    messages += (messages.empty() ? "" : "; ") + r.role + ": " + r.message;
  }
  if (action == check_weights_action::checksum) {
    std::string all;
    for (const auto& [name, digest] : info.checksums)
      all += name + ":" + digest + "\n";
    info.per_gpu_checksum = hex16(XXH3_64bits(all.data(), all.size()));
    // Over every GPU's checksum in rank order, as SGLang's engine checksum; one GPU here.
    out.per_engine_checksum =
      hex16(XXH3_64bits(info.per_gpu_checksum.data(), info.per_gpu_checksum.size()));
    out.payload.push_back(std::move(info));
  }
  out.message = messages;
  return out;
}

// check_weights: asks every selected runner, then merges; any runner's failure fails the whole.
caf::result<CheckWeightsReqOutput> check_weights(updater_pointer self, const CheckWeightsReqInput& req) {
  auto targets = select(self->state, req.selector);
  if (!targets)
    return CheckWeightsReqOutput{false, targets.error(), {}, {}, {}, {}};
  auto rp = self->make_response_promise<CheckWeightsReqOutput>();
  gather<RunnerCheckOutput>(
    self, *targets, req,
    [rp, action = req.action, targets = *targets](std::vector<RunnerCheckOutput> replies) mutable {
      if (auto err = failures(targets, replies)) {
        CheckWeightsReqOutput out;
        out.success = false;
        out.message = *err;
        rp.deliver(std::move(out));
        return;
      }
      rp.deliver(merge_checks(action, replies));
    });
  return rp;
}

weight_updater_actor::behavior_type updater(updater_pointer self, std::vector<runner_handle> runners,
                                            std::string initial_version, bool allow_non_finite,
                                            weight_group_spawner spawn_group) {
  self->state.allow_non_finite = allow_non_finite;
  self->state.spawn_group = std::move(spawn_group);
  for (auto& h : runners) {
    auto e = std::make_unique<runner_entry>();
    e->handle = std::move(h);
    for (const auto& spec : e->handle.manifest.parameters)
      e->by_name.emplace(spec.name, &spec);
    for (const auto& a : e->handle.manifest.aliases)
      e->aliases.emplace(a.alias, a.target);
    self->state.runners.push_back(std::move(e));
  }
  self->state.session = policy::update_session{std::move(initial_version)};
  // A runner that dies holding a request would leave the operation (and the scheduler, which
  // runs one at a time) waiting forever: its requests fail now, later ones fail when sent.
  for (auto& r : self->state.runners)
    self->monitor(r->handle.actor);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (auto& r : st.runners)
      if (dm.source == r->handle.actor.address())
        st.waits.peer_down(dm.source, "the " + r->handle.manifest.role + " runner stopped (" +
                                        self->system().render(dm.reason) + ")");
    // A weight-update group's actor ends after a failed join or a destroy; its requests fail.
    st.waits.peer_down(dm.source, "its thread ended (" + self->system().render(dm.reason) + ")");
    for (auto it = st.groups.begin(); it != st.groups.end();)
      it = it->second->actor.address() == dm.source ? st.groups.erase(it) : std::next(it);
  });

  using policy::session_op;
  return guarded_behavior<weight_updater_actor::behavior_type>(
    updater_state::name,
    [self](BeginWeightUpdateReqInput& req) -> caf::result<BeginWeightUpdateReqOutput> {
      return begin_session(self, req);
    },
    [self](UpdateWeightsFromTensorReqInput& req) -> caf::result<UpdateWeightsFromTensorReqOutput> {
      auto rp = self->make_response_promise<UpdateWeightsFromTensorReqOutput>();
      tensor_update(self, req, rp);
      return rp;
    },
    [self](UpdateWeightsFromDistributedReqInput& req) -> caf::result<UpdateWeightsFromDistributedReqOutput> {
      auto rp = self->make_response_promise<UpdateWeightsFromDistributedReqOutput>();
      distributed_update(self, req, status_answer(rp));
      return rp;
    },
    [self](receive_atom, UpdateWeightsFromDistributedReqInput& req) -> caf::result<ReceivedBroadcast> {
      auto rp = self->make_response_promise<ReceivedBroadcast>();
      receive_distributed(self, std::move(req), [rp](ReceivedBroadcast r) mutable { rp.deliver(std::move(r)); });
      return rp;
    },
    [self](UpdateWeightFromDiskReqInput& req) -> caf::result<UpdateWeightFromDiskReqOutput> {
      auto rp = self->make_response_promise<UpdateWeightFromDiskReqOutput>();
      disk_update(self, req, rp);
      return rp;
    },
    [self](EndWeightUpdateReqInput& req) -> caf::result<EndWeightUpdateReqOutput> {
      auto rp = self->make_response_promise<EndWeightUpdateReqOutput>();
      auto io = std::make_shared<plan_io>();
      io->op = session_op::end;
      start_plan(self, io, self->state.session.end(req.abort, req.weight_version, req.requester),
                 end_answer(self, rp));
      return rp;
    },
    [self](settle_atom) -> caf::result<EndWeightUpdateReqOutput> {
      auto rp = self->make_response_promise<EndWeightUpdateReqOutput>();
      auto io = std::make_shared<plan_io>();
      io->op = session_op::settle;
      start_plan(self, io, self->state.session.settle(), end_answer(self, rp));
      return rp;
    },
    [self](PostProcessWeightsReqInput& req) -> caf::result<PostProcessWeightsReqOutput> {
      auto& st = self->state;
      auto targets = select(st, req.selector);
      if (!targets)
        return PostProcessWeightsReqOutput{false, targets.error()};
      auto rp = self->make_response_promise<PostProcessWeightsReqOutput>();
      auto io = std::make_shared<plan_io>();
      io->op = session_op::post_process;
      start_plan(self, io,
                 st.session.post_process(req.restore_weights_before_loading,
                                         req.post_process_quantization, req.selector),
                 status_answer(rp));
      return rp;
    },
    [self](InitWeightsUpdateGroupReqInput& req) -> caf::result<InitWeightsUpdateGroupReqOutput> {
      return join_group(self, req);
    },
    [self](DestroyWeightsUpdateGroupReqInput& req) -> caf::result<DestroyWeightsUpdateGroupReqOutput> {
      auto it = self->state.groups.find(req.group_name);
      if (it == self->state.groups.end())
        return DestroyWeightsUpdateGroupReqOutput{
          false, "weight-update group \"" + req.group_name + "\" does not exist"};
      auto rp = self->make_response_promise<DestroyWeightsUpdateGroupReqOutput>();
      destroy_group(self, it->second, rp);
      return rp;
    },
    [self](CheckWeightsReqInput& req) -> caf::result<CheckWeightsReqOutput> {
      return check_weights(self, req);
    },
    [self](GetWeightsByNameReqInput& req) -> caf::result<GetWeightsByNameReqOutput> {
      auto sel = req.selector == runner_selector::all ? runner_selector::target : req.selector;
      auto targets = select(self->state, sel);
      if (!targets) {
        GetWeightsByNameReqOutput out;
        out.success = false;
        out.message = targets.error();
        return out;
      }
      return self->delegate(targets->front()->handle.actor, std::move(req));
    },
    [self](UpdateWeightVersionReqInput& req) {
      auto& s = self->state.session;
      auto v = s.relabel(req.new_version);
      return UpdateWeightVersionReqOutput{v.success, v.message, s.version()};
    },
    [self](version_atom) {
      const auto& s = self->state.session;
      return WeightUpdaterStatus{s.version(), s.open(), s.open() ? selector_name(s.selector()) : "",
                                 s.commits()};
    });
}

} // namespace

weight_updater_actor spawn_weight_updater(caf::actor_system& sys, std::vector<runner_handle> runners,
                                          std::string initial_version, bool allow_non_finite,
                                          weight_group_spawner spawn_group) {
  return sys.spawn(updater, std::move(runners), std::move(initial_version), allow_non_finite,
                   std::move(spawn_group));
}

} // namespace rlserve
