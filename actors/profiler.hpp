// profiler: a trace of the engine's work, for SGLang's /start_profile and /stop_profile.
//
// Not an actor: a thread-safe recorder the scheduler and the runners write spans into while a
// profile runs (one relaxed atomic load per span when none does). stop() writes a Chrome trace
// (the JSON `traceEvents` format that chrome://tracing and Perfetto open): one timeline per
// actor ("scheduler", "runner target", ...), complete events ("ph": "X") with their batch shape
// in `args`. On the GPU runner the forward spans time the device work as the host waits for it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "messages/expected.hpp"
#include "model/regular_file.hpp"

namespace rlserve {

struct profile_options {
  std::filesystem::path output_dir;  // must be an existing, writable directory
  std::optional<int32_t> num_steps;  // write the trace after this many scheduler steps
  std::string file_prefix = "rlserve"; // the trace is <prefix>-<start, ms since epoch>.trace.json
};

class profiler {
public:
  using clock = std::chrono::steady_clock;

  // Most events one profile keeps; later ones are counted, not kept (a forgotten profile must not
  // grow without bound).
  static constexpr std::size_t k_max_events = 1 << 20;

  // Refused (nothing changes) while a profile runs, or when output_dir is not a writable
  // directory. The trace file is created here, so that a path it cannot be written to (a FIFO,
  // a symbolic link, another kind of file left at its name) is refused now, naming it, rather
  // than at the write; model::output_file says how it is opened.
  status start(profile_options options);
  // Ends the running profile and writes its trace; the file's path. Refused when none runs.
  expected<std::string> stop();
  bool active() const noexcept { return active_.load(std::memory_order_relaxed); }

  // One span of work on `track` (an actor's timeline). `args`: a JSON object's text, or empty.
  void record(std::string_view track, std::string_view name, clock::time_point begin,
              clock::time_point end, std::string args = {});
  // A scheduler step ended; with num_steps, the trace is written after the last one.
  void step_done();
  // The path of the last trace written (by stop() or after num_steps), empty before the first.
  std::string last_trace() const;

private:
  struct event {
    std::size_t track;
    std::string name;
    int64_t begin_us;
    int64_t duration_us;
    std::string args;
  };
  expected<std::string> write_locked();

  std::atomic<bool> active_{false};
  mutable std::mutex mutex_;
  profile_options options_;
  clock::time_point started_;
  std::vector<std::string> tracks_;
  std::vector<event> events_;
  uint64_t dropped_ = 0;
  int64_t steps_ = 0;
  std::string last_trace_;
  std::optional<model::output_file> out_; // the running profile's trace, open since start()
};

} // namespace rlserve
