#include "net/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace rlserve::net {

namespace {

log_level initial_level() {
  const char* env = std::getenv("RLSERVE_LOG_LEVEL");
  if (!env)
    return log_level::info;
  std::string_view v = env;
  if (v == "debug")
    return log_level::debug;
  if (v == "warn")
    return log_level::warn;
  if (v == "error")
    return log_level::error;
  if (v == "off")
    return log_level::off;
  return log_level::info;
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

const char* name(log_level l) {
  switch (l) {
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warning";
    case log_level::error: return "error";
    case log_level::off: return "off";
  }
  return "?";
}

} // namespace

void set_log_level(log_level level) { level_ref() = static_cast<int>(level); }

log_level current_log_level() { return static_cast<log_level>(level_ref().load()); }

void log(log_level level, std::string_view text) {
  if (static_cast<int>(level) < level_ref().load() || level == log_level::off)
    return;
  static std::mutex mtx;
  std::string line = "rlserve serve: ";
  line += name(level);
  line += ": ";
  line += text;
  line += '\n';
  std::lock_guard<std::mutex> guard{mtx};
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

} // namespace rlserve::net
