// Who holds the weight-update session and the pause at the network front (net/ownership.hpp), as
// a table of event sequences checked without a server: what each event answers, and whether a
// session is open afterwards.
//
// An event is a line of words, as the server's code paths produce them:
//   "begin 1"        begin_weight_update from connection 1 succeeded (0: over HTTP)
//   "end 2"          an end_weight_update from connection 2 is sent: "counted" (an end in flight)
//                    or "ignored" (the engine will refuse it: someone else's session)
//   "end-reply"      a counted end was answered and closed the session: "closed" (a session was
//                    open, its length reported) or "none"
//   "end-kept"       a counted end was answered with the session still open (refused)
//   "drop 1"         connection 1 disconnected: "abort" (the server sends the aborting end) or
//                    "nothing"
//   "pause 1", "continue", "drop-paused 1" (with --resume-on-disconnect): "resume" or "nothing"
//   "bytes 60"       an update with 60 tensor bytes, against a session budget of 100: "ok" or
//                    "refused"; "refund 60": the engine refused the latest such update,
//                    "refund 60 1": it refused the first one (the session it was counted in)
//   "request", "reply"   a session request was sent / answered (the HTTP idle clock)
//   "idle 5000"      the watchdog asks 5000 ms from now, with a limit of 1000 ms: "abort" or
//                    "nothing"; "idle-off 5000": the same with the deadline turned off
// An empty expectation means the event answers nothing.
#include <boost/test/unit_test.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "net/ownership.hpp"

using namespace rlserve::net;

namespace {

constexpr uint64_t k_budget = 100;                  // tensor bytes per session
constexpr std::chrono::milliseconds k_idle{1000};   // the HTTP session's idle deadline

struct event {
  std::string what;
  std::string expect = "";
};

struct scenario {
  std::string name;
  std::vector<event> events;
  bool open_after;
};

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;)
    out.push_back(w);
  return out;
}

void run(const scenario& sc) {
  ownership o;
  std::vector<uint64_t> epochs; // of each "bytes", in order
  for (std::size_t i = 0; i < sc.events.size(); ++i) {
    const auto& e = sc.events[i];
    const auto w = words(e.what);
    const uint64_t n = w.size() > 1 ? std::stoull(w[1]) : 0;
    std::string got;
    if (w[0] == "begin") {
      o.begin_succeeded(n);
    } else if (w[0] == "end") {
      got = o.end_sent(n) ? "counted" : "ignored";
    } else if (w[0] == "end-reply") {
      got = o.end_finished() ? "closed" : "none";
    } else if (w[0] == "end-kept") {
      o.end_refused();
    } else if (w[0] == "drop") {
      got = o.take_session_for_abort(n) ? "abort" : "nothing";
    } else if (w[0] == "pause") {
      o.pause_succeeded(n);
    } else if (w[0] == "continue") {
      o.continue_sent();
    } else if (w[0] == "drop-paused") {
      got = o.take_pause_for_resume(n) ? "resume" : "nothing";
    } else if (w[0] == "bytes") {
      uint64_t epoch = 0;
      got = o.add_tensor_bytes(n, k_budget, &epoch) ? "ok" : "refused";
      epochs.push_back(epoch);
    } else if (w[0] == "refund") {
      BOOST_REQUIRE(!epochs.empty());
      o.refund_tensor_bytes(n, w.size() > 2 ? epochs.at(std::stoull(w[2]) - 1) : epochs.back());
    } else if (w[0] == "request") {
      o.session_request_sent();
    } else if (w[0] == "reply") {
      o.session_request_answered();
    } else if (w[0] == "idle" || w[0] == "idle-off") {
      const auto limit = w[0] == "idle" ? k_idle : std::chrono::milliseconds{0};
      const auto now = ownership::clock::now() + std::chrono::milliseconds(n);
      got = o.take_idle_http_session(limit, now) ? "abort" : "nothing";
    } else {
      BOOST_FAIL("unknown event " + e.what);
    }
    BOOST_TEST(got == e.expect, sc.name << ", event " << i << " (" << e.what << "): " << got);
  }
  BOOST_TEST(o.session_open() == sc.open_after, sc.name);
}

const std::vector<scenario> scenarios = {
  // The session and its end.
  {"the owner's end closes its session",
   {{"begin 1"}, {"end 1", "counted"}, {"end-reply", "closed"}, {"drop 1", "nothing"}},
   false},
  {"an end from another connection is not counted and leaves the session with its owner",
   {{"begin 1"}, {"end 2", "ignored"}, {"end 0", "ignored"}, {"drop 2", "nothing"},
    {"drop 1", "abort"}, {"end-reply", "closed"}},
   false},
  {"a session begun over HTTP takes an end from anyone",
   {{"begin 0"}, {"end 7", "counted"}, {"end-reply", "closed"}},
   false},
  {"an end with no session open counts, and its reply reports no session",
   {{"end 3", "counted"}, {"end-reply", "none"}},
   false},
  {"a reply with no end in flight does not leave a negative count behind",
   {{"end-reply", "none"}, {"end-reply", "none"}, {"begin 1"}, {"drop 1", "abort"}},
   true},
  // Refused ends: the engine kept the session open.
  {"a refused end leaves the session open with its owner, whose disconnect then aborts it",
   {{"begin 1"}, {"end 1", "counted"}, {"end-kept"}, {"drop 1", "abort"},
    {"end-reply", "closed"}},
   false},
  // Disconnects.
  {"the owner's disconnect aborts its session once",
   {{"begin 1"}, {"drop 1", "abort"}, {"drop 1", "nothing"}, {"end-reply", "closed"},
    {"drop 1", "nothing"}},
   false},
  {"no abort while the owner's own end is in flight",
   {{"begin 1"}, {"end 1", "counted"}, {"drop 1", "nothing"}, {"end-reply", "closed"}},
   false},
  {"another connection's disconnect leaves the session alone",
   {{"begin 1"}, {"drop 2", "nothing"}, {"drop 0", "nothing"}},
   true},
  {"with nothing open a disconnect does nothing",
   {{"drop 1", "nothing"}, {"drop 0", "nothing"}},
   false},
  // Owner changes.
  {"the next session belongs to the connection that began it",
   {{"begin 1"}, {"end 1", "counted"}, {"end-reply", "closed"}, {"begin 2"},
    {"drop 1", "nothing"}, {"end 1", "ignored"}, {"drop 2", "abort"}, {"end-reply", "closed"}},
   false},
  // The tensor byte budget.
  {"a session's updates share one budget",
   {{"begin 1"}, {"bytes 60", "ok"}, {"bytes 50", "refused"}, {"bytes 40", "ok"},
    {"bytes 1", "refused"}},
   true},
  {"outside a session only the message itself is checked",
   {{"bytes 100", "ok"}, {"bytes 100", "ok"}, {"bytes 101", "refused"}},
   false},
  {"a refused update gives its bytes back",
   {{"begin 1"}, {"bytes 70", "ok"}, {"refund 70"}, {"bytes 70", "ok"}, {"bytes 40", "refused"}},
   true},
  {"a refund never takes more than was counted",
   {{"begin 1"}, {"bytes 30", "ok"}, {"refund 30"}, {"refund 30"}, {"bytes 100", "ok"}},
   true},
  {"the budget restarts at every begin, and a refund from an earlier session is ignored",
   {{"begin 1"}, {"bytes 90", "ok"}, {"end 1", "counted"}, {"end-reply", "closed"},
    {"begin 2"}, {"bytes 90", "ok"}, {"refund 90 1"}, {"bytes 20", "refused"},
    {"refund 90 2"}, {"bytes 20", "ok"}},
   true},
  {"a refund after the session ended is ignored",
   {{"begin 1"}, {"bytes 90", "ok"}, {"end 1", "counted"}, {"end-reply", "closed"}, {"refund 90"},
    {"bytes 100", "ok"}},
   false},
  {"a refused end keeps the budget",
   {{"begin 1"}, {"bytes 90", "ok"}, {"end 1", "counted"}, {"end-kept"}, {"bytes 20", "refused"}},
   true},
  // The idle deadline of sessions begun over HTTP.
  {"an idle HTTP session is aborted once",
   {{"begin 0"}, {"idle 0", "nothing"}, {"idle 5000", "abort"}, {"idle 5000", "nothing"},
    {"end-reply", "closed"}, {"idle 5000", "nothing"}},
   false},
  {"a request in flight keeps an HTTP session alive; its reply restarts the clock",
   {{"begin 0"}, {"request"}, {"idle 5000", "nothing"}, {"reply"}, {"idle 0", "nothing"},
    {"idle 5000", "abort"}},
   true},
  {"an end in flight keeps the watchdog away",
   {{"begin 0"}, {"end 0", "counted"}, {"idle 5000", "nothing"}, {"end-kept"},
    {"idle 5000", "abort"}},
   true},
  {"a session begun over a websocket never idles out",
   {{"begin 1"}, {"idle 5000", "nothing"}},
   true},
  {"no deadline, no abort",
   {{"begin 0"}, {"idle-off 5000", "nothing"}},
   true},
  // The pause.
  {"the pausing connection's disconnect resumes generation once",
   {{"pause 1"}, {"drop-paused 2", "nothing"}, {"drop-paused 1", "resume"},
    {"drop-paused 1", "nothing"}},
   false},
  {"a continue from anyone ends the pause's ownership",
   {{"pause 1"}, {"continue"}, {"drop-paused 1", "nothing"}},
   false},
  {"the latest pause owns it",
   {{"pause 1"}, {"pause 2"}, {"drop-paused 1", "nothing"}, {"drop-paused 2", "resume"}},
   false},
  {"the session and the pause are held apart",
   {{"begin 1"}, {"pause 1"}, {"drop 1", "abort"}, {"drop-paused 1", "resume"},
    {"end-reply", "closed"}},
   false},
};

} // namespace

BOOST_AUTO_TEST_SUITE(ownership_test)

BOOST_AUTO_TEST_CASE(every_scenario_of_the_table) {
  for (const auto& sc : scenarios)
    run(sc);
}

BOOST_AUTO_TEST_CASE(the_session_length_runs_from_begin_to_the_end_reply) {
  ownership o;
  const auto before = ownership::clock::now();
  o.begin_succeeded(1);
  BOOST_TEST(o.end_sent(1));
  const auto length = o.end_finished();
  const auto elapsed = std::chrono::duration<double>(ownership::clock::now() - before).count();
  BOOST_REQUIRE(length.has_value());
  BOOST_TEST(*length >= 0.0);
  BOOST_TEST(*length <= elapsed);
}

BOOST_AUTO_TEST_SUITE_END()
