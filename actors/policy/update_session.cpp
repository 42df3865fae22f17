#include "actors/policy/update_session.hpp"

namespace rlserve::policy {

namespace {

std::string selector_name(runner_selector s) { return std::string(to_string(s)); }

const char* const implicit_commit_points =
  "continue_generation, post_process_weights(post_process_quantization=true) or end_weight_update";

const char* const disk_running =
  "update_weights_from_disk is loading a checkpoint as a session of its own; send this after it "
  "has answered";

} // namespace

session_plan update_session::refuse(std::string why) const {
  session_plan p;
  p.refused = true;
  p.message = std::move(why);
  p.selector = selector_;
  return p;
}

// Whether `who` may not touch the open session: a session begun over a websocket belongs to
// that connection alone.
std::optional<std::string> update_session::foreign(requester_id who) const {
  if (owner_ == 0 || owner_ == who)
    return std::nullopt;
  return std::string("the open weight-update session was begun on another websocket connection, "
                     "which alone may send its updates and its end (this is ") +
         (who == 0 ? "an HTTP or in-process request" : "a different connection") +
         "); wait for it to end, then begin your own";
}

void update_session::open_as(kind k, runner_selector sel, requester_id who) {
  phase_ = phase::preparing;
  kind_ = k;
  selector_ = sel;
  owner_ = k == kind::begun ? who : 0;
  loaded_ = false;
  staged_ = 0;
  label_.reset();
  commit_follows_prepare_ = false;
}

void update_session::close() {
  phase_ = phase::closed;
  kind_ = kind::begun;
  selector_ = runner_selector::all;
  owner_ = 0;
  loaded_ = false;
  staged_ = 0;
  label_.reset();
  commit_follows_prepare_ = false;
}

session_plan update_session::begin(runner_selector sel, requester_id who) {
  if (phase_ == phase::committing)
    return refuse("the open weight-update session is being committed; begin again once "
                  "end_weight_update has answered");
  if (implicit())
    return refuse(std::string("an update sent outside begin/end is staged and not yet committed; "
                              "it commits at ") +
                  implicit_commit_points +
                  " (or drop it with end_weight_update(abort=true)) before beginning a session");
  if (open())
    return refuse("a weight-update session is already open (begun with selector \"" +
                  selector_name(selector_) +
                  "\"); end it with end_weight_update (or abort it) before beginning another");
  open_as(kind::begun, sel, who);
  session_plan p;
  p.steps = {session_step::prepare};
  p.selector = sel;
  return p;
}

session_plan update_session::update(runner_selector sel, requester_id who) {
  if (phase_ == phase::committing)
    return refuse("the weight-update session is being committed; send the update after "
                  "end_weight_update has answered");
  if (phase_ == phase::closed) {
    // Outside begin/end: an implicit session opens here.
    open_as(kind::implicit, sel, who);
    session_plan p;
    p.steps = {session_step::prepare, session_step::stage};
    p.selector = sel;
    return p;
  }
  if (kind_ == kind::disk)
    return refuse(disk_running);
  if (auto why = foreign(who))
    return refuse(*why);
  if (selector_ != runner_selector::all && sel != selector_)
    return refuse("selector \"" + selector_name(sel) +
                  "\" reaches runners this session did not open (it was begun with \"" +
                  selector_name(selector_) + "\")");
  session_plan p;
  p.steps = {session_step::stage};
  p.selector = selector_;
  return p;
}

session_plan update_session::end(bool abort, std::optional<std::string> version, requester_id who) {
  if (phase_ == phase::closed)
    return refuse("no weight-update session is open; call begin_weight_update first");
  if (kind_ == kind::disk)
    return refuse(disk_running);
  if (auto why = foreign(who))
    return refuse(*why);
  if (phase_ == phase::committing)
    return refuse("the weight-update session is already being committed by an earlier call");
  session_plan p;
  p.selector = selector_;
  if (abort) {
    p.steps = {session_step::discard};
    p.message = "session aborted: " + std::to_string(staged_) +
                " staged tensors dropped" +
                (label_ ? ", and the version named for them (" + *label_ + ")" : std::string()) +
                "; the weights are unchanged (version " + version_ + ")";
    close();
    return p;
  }
  if (version)
    label_ = std::move(version);
  phase_ = phase::committing;
  p.steps = {session_step::commit};
  return p;
}

session_plan update_session::settle() {
  session_plan p;
  p.selector = selector_;
  if (!implicit() || phase_ == phase::committing)
    return p;
  phase_ = phase::committing;
  p.steps = {session_step::commit};
  return p;
}

std::optional<std::string> update_session::disk_refusal() const {
  if (open())
    return "update_weights_from_disk runs as a session of its own, but a session is open; end it "
           "first";
  return std::nullopt;
}

session_plan update_session::disk(runner_selector sel, std::optional<std::string> version) {
  if (auto why = disk_refusal())
    return refuse(*why);
  open_as(kind::disk, sel, 0);
  label_ = std::move(version);
  session_plan p;
  p.steps = {session_step::prepare, session_step::stage, session_step::commit};
  p.selector = sel;
  return p;
}

session_plan update_session::post_process(bool restore, bool post_process_quantization,
                                          runner_selector sel) {
  // The generation-1 calls slime makes around its buckets: restore_weights_before_loading
  // before them, post_process_quantization after. Updates stage beside the serving weights
  // (nothing is restored in place), so restore opens an implicit session and post-process
  // commits it; the old weights serve until then.
  if (open() && kind_ != kind::implicit)
    return refuse("post_process_weights is refused inside a weight-update session: "
                  "begin_weight_update prepares the runners and end_weight_update commits");
  if (phase_ == phase::committing)
    return refuse("the staged update is being committed; send post_process_weights after it");
  session_plan p;
  p.selector = open() ? selector_ : sel;
  if (!restore && !post_process_quantization) {
    p.message = "nothing requested";
    return p;
  }
  if (restore && !open()) {
    open_as(kind::implicit, sel, 0);
    p.steps.push_back(session_step::prepare);
  } else if (restore) {
    p.message = "an update is already staged; ";
  }
  if (post_process_quantization) {
    if (!open()) {
      p.message += "nothing staged to post-process; the weights serve as they are (version " +
                   version_ + ")";
      return p;
    }
    if (p.steps.empty())
      phase_ = phase::committing;
    else
      commit_follows_prepare_ = true; // committing starts once prepared
    p.steps.push_back(session_step::commit);
  }
  return p;
}

std::optional<std::string> update_session::update_refusal(runner_selector sel, requester_id who) const {
  if (phase_ == phase::closed)
    return std::nullopt;
  auto plan = update_session{*this}.update(sel, who);
  if (plan.refused)
    return plan.message;
  return std::nullopt;
}

session_verdict update_session::relabel(const std::string& new_version) {
  if (new_version.empty())
    return {true, false, "new_version must not be empty", false};
  if (open()) {
    // Publishing the name now would stamp it on outputs of the old weights, and the commit
    // would then move it again (miles' staleness accounting reads both as other policies).
    auto replaced = label_ && *label_ != new_version ? " (replacing " + *label_ + ")" : "";
    label_ = new_version;
    return {true, true,
            "weight version " + new_version + replaced +
              " is published when the staged update commits" +
              (kind_ == kind::implicit ? std::string(" (") + implicit_commit_points + ")"
                                       : std::string()) +
              "; outputs report " + version_ + " until then",
            false};
  }
  auto before = version_;
  version_ = new_version;
  return {true, true, "weight version " + before + " -> " + new_version, false};
}

session_verdict update_session::prepared(session_op op, const std::optional<std::string>& error,
                                         std::size_t runners) {
  if (error) {
    close();
    return {true, false,
            op == session_op::begin       ? "begin_weight_update failed, no session is open: " + *error
            : op == session_op::disk_update ? "restore failed: " + *error
                                            : "the update could not start: " + *error,
            true};
  }
  if (phase_ == phase::preparing)
    phase_ = commit_follows_prepare_ ? phase::committing : phase::open;
  commit_follows_prepare_ = false;
  switch (op) {
    case session_op::begin:
      return {true, true,
              "weight-update session open for selector \"" + selector_name(selector_) + "\" (" +
                std::to_string(runners) + " runner" + (runners == 1 ? "" : "s") + ")",
              false};
    case session_op::post_process:
      return {false, true,
              std::string("ready for new weights: they are staged beside the serving ones and "
                          "serve once committed (") + implicit_commit_points + "); ",
              false};
    default:
      return {};
  }
}

session_verdict update_session::staged(session_op op, const stage_outcome& outcome) {
  if (outcome.error && outcome.intact && op != session_op::disk_update)
    return {true, false,
            *outcome.error + " (the session stays open: resend the bucket, or end it with abort)",
            false};
  if (outcome.error) {
    close();
    return {true, false,
            op == session_op::disk_update
              ? "staging failed, weights unchanged: " + *outcome.error
              : "staging failed, the session was aborted and the old weights keep serving: " +
                  *outcome.error,
            true};
  }
  loaded_ = loaded_ || outcome.tensors > 0;
  staged_ += outcome.tensors;
  if (outcome.version)
    label_ = outcome.version;
  if (op == session_op::disk_update) {
    phase_ = phase::committing;
    return {};
  }
  return {true, true,
          "staged " + std::to_string(outcome.tensors) + " tensors; " +
            (kind_ == kind::implicit
               ? std::string("sent outside begin/end, they serve once committed (at once while "
                             "generation runs; else at ") +
                   implicit_commit_points + ")"
               : std::string("they serve after end_weight_update")),
          false};
}

session_verdict update_session::committed(session_op, const std::optional<std::string>& error) {
  auto staged = staged_;
  auto loaded = loaded_;
  auto label = label_;
  close();
  if (error)
    return {true, false, *error, false};
  auto before = version_;
  // A named version is published as named; only an unnamed change of weights counts up.
  if (label)
    version_ = *label;
  else if (loaded)
    version_ = next_weight_version(version_);
  if (loaded) // the commit count is the prefix cache's epoch: only new weights move it
    ++commits_;
  return {true, true,
          loaded  ? "committed " + std::to_string(staged) + " tensors; weight version " + before +
                      " -> " + version_
          : label ? "session closed with nothing staged; weights unchanged, weight version " +
                      before + " -> " + version_
                  : "session closed with nothing staged; weights unchanged (version " + version_ + ")",
          false};
}

std::string next_weight_version(const std::string& current) {
  auto digits_begin = current.size();
  while (digits_begin > 0 && current[digits_begin - 1] >= '0' && current[digits_begin - 1] <= '9')
    --digits_begin;
  if (digits_begin == current.size() || current.size() - digits_begin > 18)
    return current + "-1";
  auto n = std::stoull(current.substr(digits_begin));
  return current.substr(0, digits_begin) + std::to_string(n + 1);
}

} // namespace rlserve::policy
