// actors/profiler: a profile's life (start, spans, stop or num_steps), the Chrome trace it
// writes, and its refusals (a second start, a missing or unwritable directory, a stop without a
// start, a FIFO or link at the trace's name).
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/profiler.hpp"

using rlserve::profile_options;
using rlserve::profiler;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("rlserve-profiler-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

} // namespace

BOOST_AUTO_TEST_SUITE(profiler_test)

BOOST_AUTO_TEST_CASE(spans_become_a_chrome_trace) {
  profiler p;
  auto t = profiler::clock::now();
  p.record("scheduler", "before", t, t); // not running: dropped
  BOOST_REQUIRE(p.start({fresh_dir("trace"), std::nullopt, "run"}).has_value());
  BOOST_TEST(p.active());
  auto a = profiler::clock::now();
  p.record("scheduler", "plan", a, a + std::chrono::microseconds(30), R"({"step":1})");
  p.record("runner target", "run_batch", a + std::chrono::microseconds(40), a + std::chrono::microseconds(90));
  auto second = p.start({fresh_dir("other"), std::nullopt, "x"});
  BOOST_TEST(!second.has_value()); // one at a time
  auto path = p.stop();
  BOOST_REQUIRE(path.has_value());
  BOOST_TEST(!p.active());
  BOOST_TEST(p.last_trace() == *path);
  BOOST_TEST(fs::path(*path).filename().string().starts_with("run-"));
  auto trace = read_json(*path);
  const auto& events = trace["traceEvents"];
  int spans = 0;
  for (const auto& e : events) {
    if (e["ph"] == "M")
      continue;
    ++spans;
    BOOST_TEST(e["ph"] == "X");
    if (e["name"] == "plan") {
      BOOST_TEST(e["dur"] == 30);
      BOOST_TEST(e["args"]["step"] == 1);
    } else {
      BOOST_TEST(e["name"] == "run_batch");
      BOOST_TEST(e["dur"] == 50);
    }
  }
  BOOST_TEST(spans == 2);
  BOOST_TEST(events[0]["name"] == "thread_name"); // the tracks are named
  BOOST_TEST(!p.stop().has_value());              // nothing runs now
}

BOOST_AUTO_TEST_CASE(num_steps_writes_the_trace_by_itself) {
  profiler p;
  BOOST_REQUIRE(p.start({fresh_dir("steps"), 3, "rlserve"}).has_value());
  for (int i = 0; i < 2; ++i) {
    auto t = profiler::clock::now();
    p.record("scheduler", "plan", t, t);
    p.step_done();
  }
  BOOST_TEST(p.active());
  p.step_done();
  BOOST_TEST(!p.active());
  BOOST_TEST(read_json(p.last_trace())["otherData"]["scheduler_steps"] == 3);
}

BOOST_AUTO_TEST_CASE(bad_directories_are_refused) {
  profiler p;
  auto missing = p.start({fresh_dir("gone") / "not-there", std::nullopt, "x"});
  BOOST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().find("is not an existing directory") != std::string::npos);
  BOOST_TEST(!p.start({"", std::nullopt, "x"}).has_value());
  BOOST_TEST(!p.start({fresh_dir("zero"), 0, "x"}).has_value());
  if (::geteuid() != 0) { // root writes anywhere
    auto dir = fresh_dir("readonly");
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
    auto readonly = p.start({dir, std::nullopt, "x"});
    BOOST_TEST(!readonly.has_value());
    fs::permissions(dir, fs::perms::owner_all);
  }
  BOOST_TEST(!p.active());
}

// The trace went out through std::ofstream: a FIFO a client left at the trace's name blocked the
// writing thread (the scheduler's, after num_steps) until someone read it, and a symbolic link
// there redirected the write to wherever it led. Now the file is opened at start with
// O_NONBLOCK | O_NOFOLLOW and must be a regular file of one link; the test would hang or write
// through the links otherwise. The trace's name holds start's millisecond, so every name of
// the milliseconds around start is taken.
BOOST_AUTO_TEST_CASE(traces_refuse_fifos_and_links_at_their_name) {
  auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
  };
  auto dir = fresh_dir("planted");
  auto victim = dir / "victim.txt";
  std::ofstream(victim) << "keep me";
  enum class planted { fifo, symlink, dangling_symlink, hard_link };
  auto plant = [&](planted kind, const std::string& prefix, int64_t from) {
    for (int64_t ms = from; ms <= from + 2000; ++ms) {
      auto path = dir / (prefix + "-" + std::to_string(ms) + ".trace.json");
      switch (kind) {
        case planted::fifo: BOOST_REQUIRE(::mkfifo(path.c_str(), 0600) == 0); break;
        case planted::symlink: fs::create_symlink(victim, path); break;
        case planted::dangling_symlink: fs::create_symlink(dir / "nowhere", path); break;
        case planted::hard_link: fs::create_hard_link(victim, path); break;
      }
    }
  };
  // Planting 2001 names takes long on a loaded machine; a window that start could miss is planted
  // again under a fresh prefix, so start always falls inside the window it is tested against.
  auto plant_window = [&](planted kind, const std::string& base) {
    for (int attempt = 0;; ++attempt) {
      const std::string prefix = base + "t" + std::to_string(attempt);
      const int64_t from = now_ms();
      plant(kind, prefix, from);
      if (now_ms() < from + 1000 || attempt == 9)
        return prefix;
    }
  };
  const std::pair<planted, const char*> cases[] = {
    {planted::fifo, "a FIFO"},
    {planted::symlink, "a symbolic link"},
    {planted::dangling_symlink, "a symbolic link"},
    {planted::hard_link, "hard links"},
  };
  int i = 0;
  for (auto [kind, words] : cases) {
    const std::string prefix = plant_window(kind, "p" + std::to_string(i++));
    profiler p;
    auto started = p.start({dir, 1, prefix}); // within the 2 s planted: the test takes far less
    BOOST_REQUIRE(!started.has_value());
    BOOST_TEST(started.error().find(words) != std::string::npos, started.error());
    BOOST_TEST(started.error().find(prefix + "-") != std::string::npos, started.error()); // names the file
    BOOST_TEST(!p.active());
  }
  BOOST_TEST(!fs::exists(dir / "nowhere")); // nothing created through the dangling link
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_TEST(text == "keep me"); // neither truncated nor written through a link

  // A regular file left at the name is simply replaced by the trace.
  std::string plain;
  for (int attempt = 0;; ++attempt) {
    plain = "plain" + std::to_string(attempt);
    const auto from = now_ms();
    for (int64_t ms = from; ms <= from + 2000; ++ms)
      std::ofstream(dir / (plain + "-" + std::to_string(ms) + ".trace.json")) << "old text";
    if (now_ms() < from + 1000 || attempt == 9)
      break;
  }
  profiler p;
  BOOST_REQUIRE(p.start({dir, std::nullopt, plain}).has_value());
  auto path = p.stop();
  BOOST_REQUIRE(path.has_value());
  BOOST_TEST(read_json(*path)["otherData"]["producer"] == "rlserve");
}

BOOST_AUTO_TEST_SUITE_END()
