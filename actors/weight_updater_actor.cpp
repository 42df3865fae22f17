#include "actors/weight_updater_actor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include <xxhash.h>

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

struct session_state {
  bool open = false;
  runner_selector selector = runner_selector::all;
  bool loaded = false;        // something was staged
  std::size_t staged = 0;     // tensors staged so far (all runners)
  std::optional<std::string> version; // from the update messages, if they named one
  // Opened by an update outside begin/end (update_weights_from_tensor, or post_process_weights
  // with restore_weights_before_loading): committed by settle (continue_generation, the
  // scheduler right after the update while generation runs), post_process_weights with
  // post_process_quantization, or end_weight_update.
  bool implicit = false;
};

struct updater_state {
  // Not an aggregate: under C++20, CAF 0.17's stateful_actor would otherwise try to build the
  // state from the actor pointer (parenthesized aggregate init makes is_constructible true).
  updater_state() = default;

  std::vector<std::unique_ptr<runner_entry>> runners; // target first
  std::string version;
  uint64_t committed = 0;
  session_state session;
  bool allow_non_finite = false; // engine option allow_non_finite_weights
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
    self->request(targets[i]->handle.actor, caf::infinite, msg)
      .then(
        [acc, i, done](Reply& r) mutable {
          acc->replies[i] = std::move(r);
          if (--acc->missing == 0)
            done(std::move(acc->replies));
        },
        [self, acc, i, done, role](caf::error& err) mutable {
          acc->replies[i].success = false;
          acc->replies[i].message = "the " + role + " runner did not answer: " +
                                    self->system().render(err);
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
    int64_t numel = 1;
    for (auto d : t.tensor.shape) {
      if (d < 0 || (d > 0 && numel > INT64_MAX / 16 / d))
        return fail("device tensor '" + t.name + "': shape " + shape_string(t.tensor.shape) +
                    " has a negative or overflowing dimension");
      numel *= d;
    }
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
    auto on_error = [self, finish, role](caf::error& e) mutable {
      finish(role, RunnerReply{false, role + " runner did not answer: " + self->system().render(e), false});
    };
    auto device = std::make_shared<std::vector<NamedDeviceTensor>>(std::move(routed[i].device));
    auto send_device = [self, actor, device, finish, role, on_error]() mutable {
      if (device->empty())
        return;
      self->request(actor, caf::infinite, StageDeviceTensors{std::move(*device)})
        .then([finish, role](RunnerReply& r) mutable { finish(role, r); }, on_error);
    };
    if (routed[i].host.empty()) {
      send_device();
      continue;
    }
    self->request(actor, caf::infinite, StageTensors{std::move(routed[i].host)})
      .then([finish, role, send_device](RunnerReply& r) mutable {
              finish(role, r);
              send_device();
            },
            on_error);
  }
}

// Drops the open session on every runner it reached (the old weights keep serving).
void abort_session(updater_pointer self) {
  auto targets = select(self->state, self->state.session.selector);
  self->state.session = {};
  if (targets)
    for (auto* r : *targets)
      caf::anon_send(r->handle.actor, discard_atom_v); // its reply is not needed
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
  self->request((*targets)[i]->handle.actor, caf::infinite, commit_atom_v)
    .then(
      [self, targets, i, so_far, role, done, fail_with](RunnerReply& r) mutable {
        if (!r.success) {
          fail_with(r.message);
          return;
        }
        commit_chain(self, targets, i + 1, so_far.empty() ? role : so_far + ", " + role, done);
      },
      [self, fail_with](caf::error& e) mutable { fail_with(self->system().render(e)); });
}

// Commits (or with req.abort drops) the open session, explicit or implicit.
void end_session(updater_pointer self, const EndWeightUpdateReqInput& req,
                 caf::typed_response_promise<EndWeightUpdateReqOutput> rp) {
  auto& st = self->state;
  if (!st.session.open) {
    rp.deliver(EndWeightUpdateReqOutput{
      false, "no weight-update session is open; call begin_weight_update first", st.version});
    return;
  }
  if (req.abort) {
    auto staged = st.session.staged;
    abort_session(self);
    rp.deliver(EndWeightUpdateReqOutput{
      true, "session aborted: " + std::to_string(staged) +
              " staged tensors dropped, the weights are unchanged (version " + st.version + ")",
      st.version});
    return;
  }
  auto targets = select(st, st.session.selector);
  if (!targets) {
    abort_session(self);
    rp.deliver(EndWeightUpdateReqOutput{false, targets.error(), st.version});
    return;
  }
  auto chosen = std::make_shared<std::vector<runner_entry*>>(*targets);
  auto label = req.weight_version ? req.weight_version : st.session.version;
  auto loaded = st.session.loaded;
  auto staged = st.session.staged;
  commit_chain(self, chosen, 0, "",
               [self, rp, label, loaded, staged](std::optional<std::string> err) mutable {
                 auto& st = self->state;
                 st.session = {};
                 if (err) {
                   rp.deliver(EndWeightUpdateReqOutput{false, *err, st.version});
                   return;
                 }
                 auto before = st.version;
                 if (label)
                   st.version = *label;
                 else if (loaded)
                   st.version = next_weight_version(st.version);
                 if (loaded || label)
                   ++st.committed;
                 rp.deliver(EndWeightUpdateReqOutput{
                   true, loaded ? "committed " + std::to_string(staged) +
                                    " tensors; weight version " + before + " -> " + st.version
                                : "session closed with nothing staged; weights unchanged "
                                  "(version " + st.version + ")",
                   st.version});
               });
}

// Opens an implicit session on `targets` (an update that came outside begin/end):
// `done(error or nullopt)`.
template <class Done>
void open_implicit(updater_pointer self, runner_selector sel, std::vector<runner_entry*> targets, Done done) {
  auto& st = self->state;
  st.session = session_state{true, sel, false, 0, std::nullopt, true};
  gather<RunnerReply>(self, targets, restore_atom_v,
                      [self, targets, done](std::vector<RunnerReply> replies) mutable {
                        if (auto err = failures(targets, replies)) {
                          abort_session(self);
                          done(std::optional<std::string>{"the update could not start: " + *err});
                          return;
                        }
                        done(std::optional<std::string>{});
                      });
}

// Stages one update_weights_from_tensor message in the open session (explicit or implicit).
void stage_tensor_update(updater_pointer self, UpdateWeightsFromTensorReqInput& req,
                       caf::typed_response_promise<UpdateWeightsFromTensorReqOutput> rp) {
  auto& st = self->state;
  if (req.load_format && *req.load_format != "direct" &&
      !(*req.load_format == "flattened_bucket" && req.named_tensors.empty())) {
    rp.deliver(UpdateWeightsFromTensorReqOutput{
      false, "update_weights_from_tensor: load_format \"" + *req.load_format +
               "\" is not supported for inline tensors (use none or \"direct\")"});
    return;
  }
  if (st.session.selector != runner_selector::all && req.selector != st.session.selector) {
    rp.deliver(UpdateWeightsFromTensorReqOutput{
      false, "selector \"" + selector_name(req.selector) +
               "\" reaches runners this session did not open (it was begun with \"" +
               selector_name(st.session.selector) + "\")"});
    return;
  }
  auto targets = select(st, req.selector);
  if (!targets) {
    rp.deliver(UpdateWeightsFromTensorReqOutput{false, targets.error()});
    return;
  }
  auto routed = route_bucket(*targets, req.named_tensors, st, req.selector);
  if (!routed) {
    rp.deliver(UpdateWeightsFromTensorReqOutput{
      false, routed.error() + "; nothing from this update was staged (the session stays open)"});
    return;
  }
  auto routed_device = route_device(*targets, req.device_tensors, st, req.selector);
  if (!routed_device) {
    rp.deliver(UpdateWeightsFromTensorReqOutput{
      false, routed_device.error() + "; nothing from this update was staged (the session stays open)"});
    return;
  }
  auto n = count_tensors(*routed);
  std::vector<runner_bucket> buckets(targets->size());
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    buckets[i].host = std::move((*routed)[i]);
    n += (*routed_device)[i].size();
    buckets[i].device = std::move((*routed_device)[i]);
  }
  auto version = req.weight_version;
  stage_routed(self, *targets, std::move(buckets),
               [self, rp, n, version](stage_result r) mutable {
                 if (r.error && r.intact) {
                   rp.deliver(UpdateWeightsFromTensorReqOutput{
                     false, *r.error + " (the session stays open: resend the bucket, or end "
                            "it with abort)"});
                   return;
                 }
                 if (r.error) {
                   abort_session(self);
                   rp.deliver(UpdateWeightsFromTensorReqOutput{
                     false, "staging failed, the session was aborted and the old weights "
                            "keep serving: " + *r.error});
                   return;
                 }
                 auto& s = self->state.session;
                 s.loaded = s.loaded || n > 0;
                 s.staged += n;
                 if (version)
                   s.version = version;
                 rp.deliver(UpdateWeightsFromTensorReqOutput{
                   true, "staged " + std::to_string(n) + " tensors; " +
                           (s.implicit ? std::string("sent outside begin/end, they serve once committed "
                                                     "(at once while generation runs; else at "
                                                     "continue_generation, post_process_weights or "
                                                     "end_weight_update)")
                                       : std::string("they serve after end_weight_update"))});
               });
}

weight_updater_actor::behavior_type updater(updater_pointer self, std::vector<runner_handle> runners,
                                            std::string initial_version, bool allow_non_finite) {
  self->state.allow_non_finite = allow_non_finite;
  for (auto& h : runners) {
    auto e = std::make_unique<runner_entry>();
    e->handle = std::move(h);
    for (const auto& spec : e->handle.manifest.parameters)
      e->by_name.emplace(spec.name, &spec);
    for (const auto& a : e->handle.manifest.aliases)
      e->aliases.emplace(a.alias, a.target);
    self->state.runners.push_back(std::move(e));
  }
  self->state.version = std::move(initial_version);

  return {
    [self](BeginWeightUpdateReqInput& req) -> caf::result<BeginWeightUpdateReqOutput> {
      auto& st = self->state;
      if (st.session.open && st.session.implicit)
        return BeginWeightUpdateReqOutput{
          false, "an update sent outside begin/end is staged and not yet committed; it commits at "
                 "continue_generation, post_process_weights(post_process_quantization=true) or "
                 "end_weight_update (or drop it with end_weight_update(abort=true)) before "
                 "beginning a session"};
      if (st.session.open)
        return BeginWeightUpdateReqOutput{
          false, "a weight-update session is already open (begun with selector \"" +
                   selector_name(st.session.selector) +
                   "\"); end it with end_weight_update (or abort it) before beginning another"};
      auto targets = select(st, req.selector);
      if (!targets)
        return BeginWeightUpdateReqOutput{false, targets.error()};
      auto rp = self->make_response_promise<BeginWeightUpdateReqOutput>();
      auto sel = req.selector;
      st.session.open = true; // reserve: a second begin while runners restore is refused
      st.session.selector = sel;
      gather<RunnerReply>(self, *targets, restore_atom_v,
                          [self, rp, sel, targets = *targets](std::vector<RunnerReply> replies) mutable {
                            if (auto err = failures(targets, replies)) {
                              abort_session(self);
                              rp.deliver(BeginWeightUpdateReqOutput{
                                false, "begin_weight_update failed, no session is open: " + *err});
                              return;
                            }
                            self->state.session = session_state{true, sel, false, 0, std::nullopt};
                            rp.deliver(BeginWeightUpdateReqOutput{
                              true, "weight-update session open for selector \"" +
                                      selector_name(sel) + "\" (" + std::to_string(targets.size()) +
                                      " runner" + (targets.size() == 1 ? "" : "s") + ")"});
                          });
      return rp;
    },
    [self](UpdateWeightsFromTensorReqInput& req) -> caf::result<UpdateWeightsFromTensorReqOutput> {
      auto& st = self->state;
      if (st.session.open) {
        auto rp = self->make_response_promise<UpdateWeightsFromTensorReqOutput>();
        stage_tensor_update(self, req, rp);
        return rp;
      }
      // Outside begin/end (SGLang's way, slime's): an implicit session opens here and commits at
      // continue_generation, post_process_weights(post_process_quantization), end_weight_update,
      // or at once when generation is not paused (the scheduler settles it).
      auto targets = select(st, req.selector);
      if (!targets)
        return UpdateWeightsFromTensorReqOutput{false, targets.error()};
      auto rp = self->make_response_promise<UpdateWeightsFromTensorReqOutput>();
      open_implicit(self, req.selector, *targets, [self, rp, req](std::optional<std::string> err) mutable {
        if (err) {
          rp.deliver(UpdateWeightsFromTensorReqOutput{false, *err});
          return;
        }
        stage_tensor_update(self, req, rp);
      });
      return rp;
    },
    [self](UpdateWeightsFromDistributedReqInput& req) {
      if (!self->state.session.open)
        return UpdateWeightsFromDistributedReqOutput{
          false, "no weight-update session is open; call begin_weight_update first"};
      return UpdateWeightsFromDistributedReqOutput{
        false, "no weight-update group named \"" + req.group_name +
                 "\" exists (rlserve cannot join NCCL weight-update groups yet; send the tensors by "
                 "CUDA IPC, inline or from disk)"};
    },
    [self](UpdateWeightFromDiskReqInput& req) -> caf::result<UpdateWeightFromDiskReqOutput> {
      auto& st = self->state;
      if (st.session.open)
        return UpdateWeightFromDiskReqOutput{
          false, "update_weights_from_disk runs as a session of its own, but a session is open; "
                 "end it first", 0};
      auto targets = select(st, req.selector);
      if (!targets)
        return UpdateWeightFromDiskReqOutput{false, targets.error(), 0};
      auto ckpt = model::checkpoint::open(req.model_path);
      if (!ckpt)
        return UpdateWeightFromDiskReqOutput{false, ckpt.error(), 0};
      // Every parameter of every selected runner, read from the checkpoint (aliasing its mmap).
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
        if (!t)
          return UpdateWeightFromDiskReqOutput{
            false, req.model_path + " lacks tensor '" + name + "' (" + t.error() +
                     "); weights unchanged", 0};
        bucket.push_back({name, std::move(*t)});
      }
      for (const auto& prefix : bf16_of_int4) {
        auto t = ckpt->tensor(prefix + ".weight");
        if (!t)
          return UpdateWeightFromDiskReqOutput{false, t.error() + "; weights unchanged", 0};
        bucket.push_back({prefix + ".weight", std::move(*t)});
        wanted.insert(prefix + ".weight");
      }
      for (const auto& name : available) {
        bool tolerated = name.find("rotary_emb.inv_freq") != std::string::npos;
        for (auto* r : *targets)
          tolerated = tolerated || r->aliases.count(name);
        if (!wanted.count(name) && !tolerated)
          return UpdateWeightFromDiskReqOutput{
            false, req.model_path + " holds tensor '" + name + "', which no selected model has "
                   "(is it a checkpoint of another architecture?); weights unchanged", 0};
      }
      auto routed = route_bucket(*targets, bucket, st, req.selector);
      if (!routed)
        return UpdateWeightFromDiskReqOutput{false, routed.error() + "; weights unchanged", 0};
      auto rp = self->make_response_promise<UpdateWeightFromDiskReqOutput>();
      auto sel = req.selector;
      auto version = req.weight_version;
      auto path = req.model_path;
      st.session = session_state{true, sel, false, 0, std::nullopt};
      auto chosen = std::make_shared<std::vector<runner_entry*>>(*targets);
      gather<RunnerReply>(
        self, *chosen, restore_atom_v,
        [self, rp, chosen, routed = std::move(*routed), version, path](
          std::vector<RunnerReply> replies) mutable {
          if (auto err = failures(*chosen, replies)) {
            abort_session(self);
            rp.deliver(UpdateWeightFromDiskReqOutput{false, "restore failed: " + *err, 0});
            return;
          }
          auto n = count_tensors(routed);
          std::vector<runner_bucket> buckets(routed.size());
          for (std::size_t i = 0; i < routed.size(); ++i)
            buckets[i].host = std::move(routed[i]);
          stage_routed(self, *chosen, std::move(buckets),
                       [self, rp, chosen, n, version, path](stage_result r) mutable {
                         if (r.error) {
                           abort_session(self);
                           rp.deliver(UpdateWeightFromDiskReqOutput{
                             false, "staging failed, weights unchanged: " + *r.error, 0});
                           return;
                         }
                         commit_chain(self, chosen, 0, "",
                                      [self, rp, n, version, path](std::optional<std::string> err) mutable {
                                        auto& st = self->state;
                                        st.session = {};
                                        if (err) {
                                          rp.deliver(UpdateWeightFromDiskReqOutput{false, *err, 0});
                                          return;
                                        }
                                        st.version = version ? *version : next_weight_version(st.version);
                                        ++st.committed;
                                        rp.deliver(UpdateWeightFromDiskReqOutput{
                                          true, "loaded " + std::to_string(n) + " tensors from " +
                                                  path + "; weight version " + st.version, 0});
                                      });
                       });
        });
      return rp;
    },
    [self](EndWeightUpdateReqInput& req) -> caf::result<EndWeightUpdateReqOutput> {
      auto rp = self->make_response_promise<EndWeightUpdateReqOutput>();
      end_session(self, req, rp);
      return rp;
    },
    [self](settle_atom) -> caf::result<EndWeightUpdateReqOutput> {
      auto& st = self->state;
      if (!st.session.open || !st.session.implicit)
        return EndWeightUpdateReqOutput{true, "", st.version};
      auto rp = self->make_response_promise<EndWeightUpdateReqOutput>();
      end_session(self, EndWeightUpdateReqInput{}, rp);
      return rp;
    },
    [self](PostProcessWeightsReqInput& req) -> caf::result<PostProcessWeightsReqOutput> {
      // The generation-1 calls slime makes around its buckets: restore_weights_before_loading
      // before them, post_process_quantization after. Updates stage beside the serving weights
      // (nothing is restored in place), so restore opens an implicit session and post-process
      // commits it; the old weights serve until then.
      auto& st = self->state;
      if (st.session.open && !st.session.implicit)
        return PostProcessWeightsReqOutput{
          false, "post_process_weights is refused inside a weight-update session: "
                 "begin_weight_update prepares the runners and end_weight_update commits"};
      auto targets = select(st, req.selector);
      if (!targets)
        return PostProcessWeightsReqOutput{false, targets.error()};
      if (!req.restore_weights_before_loading && !req.post_process_quantization)
        return PostProcessWeightsReqOutput{true, "nothing requested"};
      auto rp = self->make_response_promise<PostProcessWeightsReqOutput>();
      auto post = [self, rp, pp = req.post_process_quantization](std::string before) mutable {
        if (!pp) {
          rp.deliver(PostProcessWeightsReqOutput{true, before});
          return;
        }
        auto& st = self->state;
        if (!st.session.open) {
          rp.deliver(PostProcessWeightsReqOutput{
            true, before + "nothing staged to post-process; the weights serve as they are (version " +
                    st.version + ")"});
          return;
        }
        // Commit through the same path as end_weight_update, then answer in this call's shape.
        self->request(caf::actor_cast<weight_updater_actor>(self), caf::infinite, settle_atom_v)
          .then([rp, before](EndWeightUpdateReqOutput& out) mutable {
                  rp.deliver(PostProcessWeightsReqOutput{out.success, before + out.message});
                },
                [self, rp](caf::error& e) mutable {
                  rp.deliver(PostProcessWeightsReqOutput{false, self->system().render(e)});
                });
      };
      if (req.restore_weights_before_loading && !st.session.open) {
        open_implicit(self, req.selector, *targets, [rp, post](std::optional<std::string> err) mutable {
          if (err) {
            rp.deliver(PostProcessWeightsReqOutput{false, *err});
            return;
          }
          post("ready for new weights: they are staged beside the serving ones and serve once "
               "committed (post_process_weights with post_process_quantization, "
               "continue_generation or end_weight_update); ");
        });
        return rp;
      }
      post(req.restore_weights_before_loading ? "an update is already staged; " : "");
      return rp;
    },
    [](InitWeightsUpdateGroupReqInput& req) {
      return InitWeightsUpdateGroupReqOutput{
        false, "cannot join weight-update group \"" + req.group_name +
                 "\": rlserve cannot join NCCL weight-update groups yet (send the tensors by CUDA "
                 "IPC, inline or from disk)"};
    },
    [](DestroyWeightsUpdateGroupReqInput& req) {
      return DestroyWeightsUpdateGroupReqOutput{
        false, "weight-update group \"" + req.group_name + "\" does not exist"};
    },
    [self](CheckWeightsReqInput& req) -> caf::result<CheckWeightsReqOutput> {
      auto targets = select(self->state, req.selector);
      if (!targets)
        return CheckWeightsReqOutput{false, targets.error(), {}, {}, {}};
      auto rp = self->make_response_promise<CheckWeightsReqOutput>();
      auto action = req.action;
      gather<RunnerCheckOutput>(self, *targets, req,
                                [rp, action, targets = *targets](std::vector<RunnerCheckOutput> replies) mutable {
                                  CheckWeightsReqOutput out;
                                  if (auto err = failures(targets, replies)) {
                                    out.success = false;
                                    out.message = *err;
                                    rp.deliver(std::move(out));
                                    return;
                                  }
                                  ChecksumInfo info;
                                  std::string overall;
                                  std::string messages;
                                  for (auto& r : replies) {
                                    std::string prefix = r.role == "target" ? "" : r.role + ".";
                                    std::string role_stream;
                                    for (std::size_t i = 0; i < r.names.size(); ++i) {
                                      auto digest = hex16(r.digests[i]);
                                      info.checksums[prefix + r.names[i]] = digest;
                                      role_stream += r.names[i] + ":" + digest + "\n";
                                    }
                                    for (auto& n : r.changed)
                                      out.changed.push_back(prefix + n);
                                    for (auto& n : r.unchanged)
                                      out.unchanged.push_back(prefix + n);
                                    if (action == check_weights_action::checksum)
                                      info.role_checksums[r.role] =
                                        hex16(XXH3_64bits(role_stream.data(), role_stream.size()));
                                    ParallelismInfo p;
                                    p.role = r.role;
                                    info.parallelism_info.push_back(p);
                                    messages += (messages.empty() ? "" : "; ") + r.role + ": " + r.message;
                                  }
                                  if (action == check_weights_action::checksum) {
                                    std::string all;
                                    for (auto& [name, digest] : info.checksums)
                                      all += name + ":" + digest + "\n";
                                    info.per_gpu_checksum = hex16(XXH3_64bits(all.data(), all.size()));
                                    out.payload.push_back(std::move(info));
                                  }
                                  out.message = messages;
                                  rp.deliver(std::move(out));
                                });
      return rp;
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
      if (req.new_version.empty())
        return UpdateWeightVersionReqOutput{false, "new_version must not be empty",
                                            self->state.version};
      auto before = self->state.version;
      self->state.version = req.new_version;
      return UpdateWeightVersionReqOutput{
        true, "weight version " + before + " -> " + req.new_version, req.new_version};
    },
    [self](version_atom) {
      const auto& st = self->state;
      return WeightUpdaterStatus{st.version, st.session.open,
                                 st.session.open ? selector_name(st.session.selector) : "",
                                 st.committed};
    },
  };
}

} // namespace

std::string next_weight_version(const std::string& current) {
  auto digits_begin = current.size();
  while (digits_begin > 0 && current[digits_begin - 1] >= '0' && current[digits_begin - 1] <= '9')
    --digits_begin;
  if (digits_begin == current.size() || current.size() - digits_begin > 18)
    return current + "-1";
  auto n = std::stoull(current.substr(digits_begin));
  return current.substr(0, digits_begin) + std::to_string(n + 1);
}

weight_updater_actor spawn_weight_updater(caf::actor_system& sys, std::vector<runner_handle> runners,
                                          std::string initial_version, bool allow_non_finite) {
  return sys.spawn(updater, std::move(runners), std::move(initial_version), allow_non_finite);
}

} // namespace rlserve
