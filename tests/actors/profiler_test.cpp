// actors/profiler: a profile's life (start, spans, stop or num_steps), the Chrome trace it
// writes, and its refusals (a second start, a missing or unwritable directory, a stop without a
// start).
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
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

BOOST_AUTO_TEST_SUITE_END()
