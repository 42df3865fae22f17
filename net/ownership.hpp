// Which connection opened the weight-update session and which one paused generation, so that a
// client that disconnects does not leave the engine locked or paused:
//
//   - a websocket connection whose begin_weight_update succeeded owns the session until an
//     end_weight_update closes it (the engine's weight updater refuses updates and ends from
//     anyone else, when they execute; this class only follows); if it disconnects while it
//     owns the session, the server sends EndWeightUpdateReqInput{abort = true} on its behalf:
//     what was staged is dropped and the old weights keep serving;
//   - a connection whose pause_generation succeeded owns the pause until anyone sends
//     continue_generation; if it disconnects while it owns the pause, the server sends
//     continue_generation for it (after the session abort, which the continue waits for).
//
// HTTP requests are owner 0: one request per call, nothing to clean up after; a session begun
// over HTTP has no connection whose end could abort it, so it is aborted after an idle
// deadline instead (take_idle_http_session). The per-session
// tensor byte budget lives here too, since it is reset by the same begin and end events.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>

namespace rlserve::net {

class ownership {
public:
  using clock = std::chrono::steady_clock;

  // ---- weight-update session ----
  // A begin_weight_update by `owner` succeeded: a session is open (its byte budget restarts).
  void begin_succeeded(uint64_t owner);
  // An end_weight_update from `requester` is on its way to the engine. Returns whether it counts
  // as an end in flight: one from a connection that does not own the open session is refused
  // by the engine and changes nothing here.
  bool end_sent(uint64_t requester);
  // Its reply arrived. Returns the session's length (begin reply to end reply) when one was open.
  std::optional<double> end_finished();
  // Its reply said the engine kept the session open (the end came from someone who does not
  // own it): the session stays with its owner.
  void end_refused();
  // Whether `owner` (now disconnected) holds the session with no end in flight. When true, the
  // caller sends the aborting end at once; it counts as an end in flight.
  bool take_session_for_abort(uint64_t owner);
  bool session_open() const;

  // Adds `bytes` of tensor payload to the session's budget; false (and nothing added) when the
  // total would pass `limit`. Outside a session only the message itself is checked. `epoch_out`
  // receives the session's epoch, for refund_tensor_bytes.
  bool add_tensor_bytes(uint64_t bytes, uint64_t limit, uint64_t* epoch_out = nullptr);
  // The engine refused that message (nothing of it was staged): its bytes leave the budget, if
  // the session they were counted in (`epoch`) is still the open one.
  void refund_tensor_bytes(uint64_t bytes, uint64_t epoch);

  // ---- idle deadline of sessions begun over HTTP ----
  // A request of the session is on its way / was answered: the idle clock stops / restarts.
  void session_request_sent();
  void session_request_answered();
  // Whether a session begun over HTTP (owner 0) has had no request in flight or arriving for
  // `limit`; when true the caller sends the aborting end at once (it counts as an end in flight).
  bool take_idle_http_session(std::chrono::milliseconds limit, clock::time_point now = clock::now());

  // ---- pause ----
  void pause_succeeded(uint64_t owner);
  void continue_sent();
  // Whether `owner` holds the pause; when true the caller sends continue_generation at once.
  bool take_pause_for_resume(uint64_t owner);

private:
  mutable std::mutex mtx_;
  std::optional<uint64_t> session_owner_; // set while a session is open
  clock::time_point session_start_{};
  int ends_in_flight_ = 0;
  uint64_t session_bytes_ = 0;
  uint64_t session_epoch_ = 0; // changes at every begin and end
  int session_requests_in_flight_ = 0;
  clock::time_point last_session_activity_{};
  std::optional<uint64_t> pause_owner_;
};

} // namespace rlserve::net
