// Counters of the network front and their Prometheus text rendering (GET /metrics).
//
// The front counts what passes through it (requests by route and result, tokens in and out,
// streamed chunks, update sessions and their phase timings, protocol errors, disconnect
// clean-ups); queue depth, running requests, pause state and the weight version come from the
// engine's GetServerInfoReqOutput at scrape time. Thread-safe; cheap enough for every request.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "messages/control.hpp"

namespace rlserve::net {

enum class request_result { ok, failed, error }; // ok / engine said success=false / protocol error

class metrics {
public:
  // One answered request. `transport`: "ws" or "http". `seconds`: from receipt to reply.
  void request_done(std::string_view transport, std::string_view route, request_result result,
                    double seconds);
  void protocol_error(std::string_view code);
  void generate_done(int64_t prompt_tokens, int64_t completion_tokens, std::string_view finish);
  void stream_chunk() { chunks_.fetch_add(1, std::memory_order_relaxed); }
  // Update phases: "begin", "update", "end", "post_process", "disk", "session" (begin reply
  // to end reply).
  void update_phase(std::string_view phase, double seconds);
  // "committed", "aborted" (asked for, or on a disconnect), "failed".
  void update_session_ended(std::string_view result);
  void tensor_bytes(uint64_t bytes, uint64_t copied_tensors);
  // "abort_request", "abort_session", "continue_generation".
  void disconnect_cleanup(std::string_view action);
  void connection_opened() { ++ws_open_; ws_total_.fetch_add(1, std::memory_order_relaxed); }
  void connection_closed() { --ws_open_; }
  void connection_refused() { ws_refused_.fetch_add(1, std::memory_order_relaxed); }
  // A connection stopped reading because its unanswered frames passed the limit.
  void reads_paused() { reads_paused_.fetch_add(1, std::memory_order_relaxed); }

  // The text exposition format (version 0.0.4). `info`: the engine's state, or null when it did
  // not answer in time (the engine gauges are then left out and rlserve_engine_up is 0).
  std::string render(const GetServerInfoReqOutput* info) const;

private:
  struct summary {
    double sum = 0;
    uint64_t count = 0;
    double last = 0;
  };
  mutable std::mutex mtx_;
  std::map<std::string, uint64_t> requests_;         // "transport\0route\0result"
  std::map<std::string, summary> request_seconds_;   // "transport\0route"
  std::map<std::string, uint64_t> protocol_errors_;
  std::map<std::string, uint64_t> finished_;         // finish reason
  std::map<std::string, summary> phases_;
  std::map<std::string, uint64_t> sessions_;
  std::map<std::string, uint64_t> cleanups_;
  uint64_t prompt_tokens_ = 0;
  uint64_t completion_tokens_ = 0;
  uint64_t tensor_bytes_ = 0;
  uint64_t copied_tensors_ = 0;
  std::atomic<uint64_t> chunks_{0};
  std::atomic<int64_t> ws_open_{0};
  std::atomic<uint64_t> ws_total_{0};
  std::atomic<uint64_t> ws_refused_{0};
  std::atomic<uint64_t> reads_paused_{0};
};

// A Prometheus label value with \, " and newline escaped.
std::string escape_label(std::string_view v);

} // namespace rlserve::net
