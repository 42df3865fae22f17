// The weight updater's session rules as a pure state machine (no CAF), so every sequence of
// begin / update / end / abort / settle / post-process / disk update, and every runner outcome,
// can be table-tested without actors. The weight updater actor owns one: it asks for a plan per
// request, performs the plan's steps on its runners (the I/O), reports each step's outcome, and
// answers with the verdict it gets back.
//
// A session is the unit of atomicity: tensors are staged beside the serving weights and serve
// only when the session commits, all runners target first; an aborted or failed session leaves
// the old weights serving and the version unchanged. Sessions come three ways:
//  - begun: begin_weight_update ... end_weight_update. Owned by the requester that began it
//    when that is a websocket connection (requester != 0): its updates and its end are refused
//    from anyone else, checked here, when the request executes, so no ordering of requests
//    from two connections can stage into or close another's session. A session begun by HTTP or
//    in process (requester 0) is anyone's.
//  - implicit: an update_weights_from_tensor outside begin/end, or post_process_weights with
//    restore_weights_before_loading (SGLang's and slime's way). Anyone's. Committed by settle
//    (continue_generation, or at once while generation runs), post_process_weights with
//    post_process_quantization, or end_weight_update.
//  - disk: update_weights_from_disk, a session of its own (prepare, stage, commit in one call).
//
// Phases: closed -> preparing (runners restore) -> open -> committing -> closed. Runner
// mailboxes are FIFO, so updates and an end may follow a begin before its restore answered;
// while committing, every session request is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "messages/enums.hpp"
#include "messages/weight_update.hpp"

namespace rlserve::policy {

// Who sent a session request: 0 for HTTP and in-process callers, else a websocket connection.
using requester_id = uint64_t;

enum class session_op : uint8_t { begin, tensor_update, disk_update, end, settle, post_process };

// What the actor does, in order, for one request.
enum class session_step : uint8_t {
  prepare, // restore on the session's runners; report prepared()
  stage,   // stage the request's tensors on its runners; report staged()
  commit,  // commit the session's runners, target first; report committed()
  discard, // drop what the session's runners staged (no reply awaited)
};

struct session_plan {
  bool refused = false;           // answer `message` with success = false; run nothing
  std::vector<session_step> steps;
  std::string message;            // the answer when no step's verdict ends the request
  runner_selector selector = runner_selector::all; // the session's runners
};

// The answer to a step's outcome.
struct session_verdict {
  bool done = false;    // answer now with `success` and `message`; skip the remaining steps
  bool success = true;
  std::string message;  // when not done: text that precedes the final answer
  bool discard = false; // the session was dropped: discard on its runners before answering
};

// How staging one message went: `error` empty on success; `intact`: every runner that failed
// refused the message whole and none staged any of it (the session may go on).
struct stage_outcome {
  std::size_t tensors = 0;
  std::optional<std::string> version; // the update's weight_version, if it named one
  std::optional<std::string> error;
  bool intact = true;
};

class update_session {
public:
  enum class phase : uint8_t { closed, preparing, open, committing };
  enum class kind : uint8_t { begun, implicit, disk };

  explicit update_session(std::string initial_version) : version_(std::move(initial_version)) {}

  // ---- requests ----
  session_plan begin(runner_selector sel, requester_id who);
  // update_weights_from_tensor (its tensors already validated against the manifests).
  session_plan update(runner_selector sel, requester_id who);
  session_plan end(bool abort, std::optional<std::string> version, requester_id who);
  // Commits an implicit session if one is open; nothing otherwise.
  session_plan settle();
  // Why a disk update cannot start now (before the checkpoint is read), or nothing.
  std::optional<std::string> disk_refusal() const;
  session_plan disk(runner_selector sel, std::optional<std::string> version);
  session_plan post_process(bool restore, bool post_process_quantization, runner_selector sel);
  // Why update(sel, who) would be refused now, or nothing; changes nothing. An NCCL update asks
  // before it receives, so that a refused one still takes (and drops) the trainer's broadcast.
  std::optional<std::string> update_refusal(runner_selector sel, requester_id who) const;
  // update_weight_version. With no session open it relabels the serving weights at once, as
  // SGLang does (nothing is staged, so the label is all that changes). While a session is open
  // the weights the trainer is naming are the staged ones, which do not serve yet: the name
  // becomes the version the commit publishes, the serving version stays until then, and an
  // abort or a failed commit drops it. Whichever name comes last before the commit wins: this
  // one, a later update's weight_version, or end_weight_update's.
  session_verdict relabel(const std::string& new_version);

  // ---- outcomes of steps ----
  // `runners`: how many the session reaches (for the begin's answer).
  session_verdict prepared(session_op op, const std::optional<std::string>& error, std::size_t runners);
  session_verdict staged(session_op op, const stage_outcome& outcome);
  session_verdict committed(session_op op, const std::optional<std::string>& error);

  // ---- state ----
  phase current_phase() const { return phase_; }
  bool open() const { return phase_ != phase::closed; }
  bool implicit() const { return open() && kind_ == kind::implicit; }
  runner_selector selector() const { return selector_; }
  requester_id owner() const { return owner_; }
  std::size_t staged_tensors() const { return staged_; }
  const std::string& version() const { return version_; }
  // The version the open session's commit will publish when a request named one.
  const std::optional<std::string>& pending_version() const { return label_; }
  uint64_t commits() const { return commits_; }

private:
  session_plan refuse(std::string why) const;
  std::optional<std::string> foreign(requester_id who) const;
  void open_as(kind k, runner_selector sel, requester_id who);
  void close();

  std::string version_;
  uint64_t commits_ = 0;
  phase phase_ = phase::closed;
  kind kind_ = kind::begun;
  runner_selector selector_ = runner_selector::all;
  requester_id owner_ = 0;
  bool loaded_ = false;     // something was staged
  std::size_t staged_ = 0;  // tensors staged (all runners)
  std::optional<std::string> label_; // the version the commit gets, when a request named one
  bool commit_follows_prepare_ = false; // post_process_weights with both flags
};

// The version a commit gets when the caller named none: the trailing number incremented
// ("7" -> "8", "step-9" -> "step-10"), or "-1" appended when there is none.
std::string next_weight_version(const std::string& current);

} // namespace rlserve::policy
