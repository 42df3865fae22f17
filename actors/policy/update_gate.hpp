// The front door's pause-aware update lock (docs/sglang-contract.md, 'The pause-aware update lock')
// as a pure state machine, so every ordering of generate / pause / begin / update / end / continue
// can be table-tested without actors. The tokenizer actor owns one and asks it, after every event,
// which waiting operations may start.
//
// The rules:
//  - A generate request holds the lock shared for its whole life. It is admitted only while
//    generation is not paused, no weight-update session is open and no update operation is
//    waiting for the lock (writer preference); otherwise it waits, in arrival order.
//  - An update operation (begin / update_weights_* / end / a standalone disk update or
//    post-process) runs one at a time. While generation is paused it runs at once, under the
//    pause: requests frozen by retract or in_place still hold their shared lock, and waiting
//    for them would deadlock (the bug of SGLang #22211 / #29670). While not paused it takes the
//    lock exclusively: it waits until no generate request is running. Inside an open session
//    it runs at once (the session already holds the lock).
//  - A session holds the lock from a successful begin until its end, whatever the end's result.
//  - continue_generation never unpauses while an update operation runs or a session is open
//    (the TOCTOU of SGLang #22304 / #22754): it waits for the running operation, and inside an
//    open session it is deferred to the session's end. The front door answers a deferred continue
//    at once, so a trainer that sends continue before end (from one thread) does not hang. A
//    pause that arrives before the deferred continue took effect cancels it: the latest call wins.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace rlserve::policy {

enum class gate_op : uint8_t {
  generate,
  session_begin,  // begin_weight_update
  session_update, // update_weights_from_{tensor,distributed}, inside a session
  session_end,    // end_weight_update
  standalone,     // update_weights_from_disk, post_process_weights (a session of their own)
  resume,         // continue_generation
};

class update_gate {
public:
  using ticket = uint64_t;

  struct started {
    ticket id;
    gate_op op;
  };

  // Queues an operation; call ready() to learn what may start.
  void submit(ticket id, gate_op op) { queue_.push_back({id, op}); }

  // Removes a queued (not yet started) operation, e.g. an aborted generate request. Returns
  // whether it was queued.
  bool cancel(ticket id) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->id == id) {
        queue_.erase(it);
        return true;
      }
    }
    return false;
  }

  // Everything that may start now, in the order to start it. Started operations leave the
  // queue; the caller reports their end with finished().
  [[nodiscard]] std::vector<started> ready() {
    std::vector<started> out;
    for (;;) {
      if (update_running_)
        return out;
      bool resumed = false;
      // Control operations in arrival order. The oldest update operation that cannot take the
      // lock yet blocks everything behind it (writer preference).
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (it->op == gate_op::generate)
          continue;
        if (it->op == gate_op::resume) {
          if (session_open_)
            continue; // waits for the session's end, which a later queued op may bring
          paused_ = false;
          out.push_back(*it);
          queue_.erase(it);
          resumed = true;
          break;
        }
        if (!(paused_ || session_open_ || running_generates_ == 0))
          return out; // an exclusive writer waits for the shared holders to finish
        update_running_ = true;
        out.push_back(*it);
        queue_.erase(it);
        return out;
      }
      if (resumed)
        continue; // unpausing changes what the rest of the queue may do
      if (paused_ || session_open_)
        return out;
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->op != gate_op::generate) {
          ++it;
          continue;
        }
        ++running_generates_;
        out.push_back(*it);
        it = queue_.erase(it);
      }
      return out;
    }
  }

  // Reports the end of a started operation. `success` matters for session_begin only: a
  // session is open after a successful begin. After an end, `still_open` says whether the
  // weight updater kept the session open (it refuses an end from a requester that does not own
  // the session); any other end closes it.
  void finished(gate_op op, bool success = true, bool still_open = false) {
    switch (op) {
      case gate_op::generate:
        if (running_generates_ > 0)
          --running_generates_;
        return;
      case gate_op::session_begin:
        update_running_ = false;
        if (success)
          session_open_ = true;
        return;
      case gate_op::session_end:
        update_running_ = false;
        session_open_ = still_open;
        return;
      case gate_op::session_update:
      case gate_op::standalone:
        update_running_ = false;
        return;
      case gate_op::resume:
        return;
    }
  }

  // pause_generation: takes effect at once (it takes no lock). Returns the continue operations
  // still queued, which it cancels (the caller answers them).
  std::vector<ticket> pause() {
    paused_ = true;
    std::vector<ticket> cancelled;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->op == gate_op::resume) {
        cancelled.push_back(it->id);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return cancelled;
  }
  // Ends a session the caller can no longer finish (its client went away and the session was
  // aborted on its behalf).
  void close_session() { session_open_ = false; }

  bool paused() const { return paused_; }
  bool session_open() const { return session_open_; }
  bool update_running() const { return update_running_; }
  int64_t running_generates() const { return running_generates_; }
  std::size_t queued() const { return queue_.size(); }
  std::size_t queued_generates() const {
    std::size_t n = 0;
    for (const auto& q : queue_)
      n += q.op == gate_op::generate;
    return n;
  }

private:
  std::deque<started> queue_;
  int64_t running_generates_ = 0;
  bool paused_ = false;
  bool session_open_ = false;
  bool update_running_ = false;
};

} // namespace rlserve::policy
