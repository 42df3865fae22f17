#include "actors/profiler.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace rlserve {

status profiler::start(profile_options options) {
  std::error_code ec;
  if (options.output_dir.empty())
    return fail("output_dir: empty; name a directory");
  if (!std::filesystem::is_directory(options.output_dir, ec))
    return fail("output_dir: " + options.output_dir.string() + " is not an existing directory");
  if (::access(options.output_dir.c_str(), W_OK) != 0)
    return fail("output_dir: " + options.output_dir.string() + " is not writable by the server");
  if (options.num_steps && *options.num_steps < 1)
    return fail("num_steps: " + std::to_string(*options.num_steps) + " is not a step count (>= 1)");
  std::lock_guard lock(mutex_);
  if (active())
    return fail("a profile is already running (writing to " + options_.output_dir.string() +
                "); stop it with /stop_profile first");
  const auto epoch_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  auto out = model::output_file::create(
    options.output_dir / fmt::format("{}-{}.trace.json", options.file_prefix, epoch_ms));
  if (!out)
    return fail("output_dir: " + out.error());
  out_ = std::move(*out);
  options_ = std::move(options);
  started_ = clock::now();
  tracks_.clear();
  events_.clear();
  dropped_ = 0;
  steps_ = 0;
  active_.store(true, std::memory_order_relaxed);
  return {};
}

expected<std::string> profiler::stop() {
  std::lock_guard lock(mutex_);
  if (!active())
    return fail("no profile is running (start one with /start_profile)");
  return write_locked();
}

void profiler::record(std::string_view track, std::string_view name, clock::time_point begin,
                      clock::time_point end, std::string args) {
  if (!active())
    return;
  std::lock_guard lock(mutex_);
  if (!active() || begin < started_)
    return;
  if (events_.size() >= k_max_events) {
    ++dropped_;
    return;
  }
  auto t = std::find(tracks_.begin(), tracks_.end(), track);
  if (t == tracks_.end())
    t = tracks_.insert(tracks_.end(), std::string(track));
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  events_.push_back({static_cast<std::size_t>(t - tracks_.begin()), std::string(name),
                     duration_cast<microseconds>(begin - started_).count(),
                     duration_cast<microseconds>(std::max(end, begin) - begin).count(),
                     std::move(args)});
}

void profiler::step_done() {
  if (!active())
    return;
  std::lock_guard lock(mutex_);
  if (!active() || !options_.num_steps || ++steps_ < *options_.num_steps)
    return;
  (void)write_locked(); // a write that fails ends the profile too; last_trace() stays as it was
}

std::string profiler::last_trace() const {
  std::lock_guard lock(mutex_);
  return last_trace_;
}

expected<std::string> profiler::write_locked() {
  active_.store(false, std::memory_order_relaxed);
  using nlohmann::json;
  auto events = json::array();
  for (std::size_t i = 0; i < tracks_.size(); ++i)
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", i + 1},
                      {"args", {{"name", tracks_[i]}}}});
  for (const auto& e : events_) {
    json j = {{"ph", "X"},          {"name", e.name},          {"cat", "rlserve"}, {"pid", 1},
              {"tid", e.track + 1}, {"ts", e.begin_us},        {"dur", e.duration_us}};
    if (auto args = json::parse(e.args, nullptr, /*allow_exceptions=*/false); !args.is_discarded())
      j["args"] = std::move(args);
    events.push_back(std::move(j));
  }
  json trace = {{"traceEvents", std::move(events)},
                {"displayTimeUnit", "ms"},
                {"otherData", {{"producer", "rlserve"}, {"dropped_events", dropped_},
                               {"scheduler_steps", steps_}}}};
  events_.clear();
  events_.shrink_to_fit();
  auto out = std::move(*out_);
  out_.reset();
  if (auto ok = out.write_all(trace.dump()); !ok)
    return fail("writing the trace: " + ok.error());
  last_trace_ = out.path();
  return last_trace_;
}

} // namespace rlserve
