// The weight updater's session rules (actors/policy/update_session.hpp) as a table of event
// sequences, checked without actors: what each request plans, what each runner outcome decides,
// and where the session and the weight version stand afterwards.
//
// An event is a line of words: a request ("begin 1" = begin_weight_update from connection 1,
// "update 0", "end 2", "abort 1", "settle", "disk", "pp restore" / "pp quant" / "pp both",
// "relabel v9", "distributed 2") or a step's outcome ("prepared", "prepared fail", "staged 3",
// "staged 3 v9" (the update named weight_version v9), "staged fail" (intact), "staged broken"
// (some runner staged part), "committed", "committed fail"), or a look at the state
// ("serving 7": the version outputs report now; "pending v9" / "pending none": what the commit
// will publish). What it must give: a plan ("refused", "nothing", or its steps
// "prepare stage commit discard"), a verdict ("ok", "fail", "go on"; "+discard" when the
// session's runners must drop what they staged), or "yes" for a look that holds. `text`: a part
// of the answer's message.
#include <boost/test/unit_test.hpp>

#include <sstream>

#include "actors/policy/update_session.hpp"

using namespace rlserve;
using namespace rlserve::policy;

namespace {

struct event {
  std::string what;
  std::string expect;
  std::string text = "";
};

struct scenario {
  std::string name;
  std::vector<event> events;
  std::string phase_after; // closed | preparing | open | committing
  std::string version_after;
};

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;)
    out.push_back(w);
  return out;
}

std::string describe(const session_plan& p) {
  if (p.refused)
    return "refused";
  if (p.steps.empty())
    return "nothing";
  std::string out;
  for (auto s : p.steps) {
    out += out.empty() ? "" : " ";
    out += s == session_step::prepare ? "prepare"
           : s == session_step::stage ? "stage"
           : s == session_step::commit ? "commit"
                                       : "discard";
  }
  return out;
}

std::string describe(const session_verdict& v) {
  std::string out = !v.done ? "go on" : v.success ? "ok" : "fail";
  return v.discard ? out + " +discard" : out;
}

std::string phase_name(update_session::phase p) {
  switch (p) {
    case update_session::phase::closed: return "closed";
    case update_session::phase::preparing: return "preparing";
    case update_session::phase::open: return "open";
    case update_session::phase::committing: return "committing";
  }
  return "?";
}

// Runs one scenario; a step's outcome belongs to the latest request whose plan had that step.
void run(const scenario& sc) {
  update_session s{"7"};
  session_op op = session_op::begin;
  session_op prepare_op = op, stage_op = op, commit_op = op;
  for (std::size_t i = 0; i < sc.events.size(); ++i) {
    const auto& e = sc.events[i];
    auto w = words(e.what);
    auto who = w.size() > 1 && std::isdigit(static_cast<unsigned char>(w[1][0])) ? std::stoull(w[1]) : 0;
    std::string got;
    std::string message;
    auto plan = [&](const session_plan& p) {
      got = describe(p);
      message = p.message;
      for (auto step : p.steps) {
        if (step == session_step::prepare)
          prepare_op = op;
        else if (step == session_step::stage)
          stage_op = op;
        else if (step == session_step::commit)
          commit_op = op;
      }
    };
    auto verdict = [&](const session_verdict& v) {
      got = describe(v);
      message = v.message;
    };
    if (w[0] == "begin") {
      op = session_op::begin;
      plan(s.begin(runner_selector::all, who));
    } else if (w[0] == "update") {
      op = session_op::tensor_update;
      plan(s.update(runner_selector::all, who));
    } else if (w[0] == "end" || w[0] == "abort") {
      op = session_op::end;
      plan(s.end(w[0] == "abort", std::nullopt, who));
    } else if (w[0] == "end-as") { // end with a version label: "end-as v10 1"
      op = session_op::end;
      plan(s.end(false, w[1], std::stoull(w[2])));
    } else if (w[0] == "settle") {
      op = session_op::settle;
      plan(s.settle());
    } else if (w[0] == "disk") {
      op = session_op::disk_update;
      plan(s.disk(runner_selector::all, std::nullopt));
    } else if (w[0] == "pp") {
      op = session_op::post_process;
      plan(s.post_process(w[1] == "restore" || w[1] == "both", w[1] == "quant" || w[1] == "both",
                          runner_selector::all));
    } else if (w[0] == "relabel") {
      verdict(s.relabel(w.size() > 1 ? w[1] : ""));
    } else if (w[0] == "distributed") {
      auto why = s.update_refusal(runner_selector::all, who);
      got = why ? "refused" : "nothing";
      message = why.value_or("");
    } else if (w[0] == "prepared") {
      verdict(s.prepared(prepare_op, w.size() > 1 ? std::optional<std::string>{"runner said no"} : std::nullopt, 2));
    } else if (w[0] == "staged") {
      stage_outcome o;
      if (w[1] == "fail" || w[1] == "broken") {
        o.error = "target: bad bytes";
        o.intact = w[1] == "fail";
      } else {
        o.tensors = std::stoull(w[1]);
        if (w.size() > 2)
          o.version = w[2];
      }
      verdict(s.staged(stage_op, o));
    } else if (w[0] == "committed") {
      verdict(s.committed(commit_op, w.size() > 1 ? std::optional<std::string>{"target runner failed to commit"}
                                            : std::nullopt));
    } else if (w[0] == "serving") {
      got = s.version() == w[1] ? "yes" : "no";
      message = "serving " + s.version();
    } else if (w[0] == "pending") {
      got = s.pending_version().value_or("none") == w[1] ? "yes" : "no";
      message = "pending " + s.pending_version().value_or("none");
    } else {
      BOOST_FAIL("unknown event " + e.what);
    }
    BOOST_TEST(got == e.expect, sc.name << ", event " << i << " (" << e.what << "): " << got
                                        << " (" << message << ")");
    if (!e.text.empty())
      BOOST_TEST(message.find(e.text) != std::string::npos,
                 sc.name << ", event " << i << ": \"" << message << "\" lacks \"" << e.text << "\"");
  }
  BOOST_TEST(phase_name(s.current_phase()) == sc.phase_after, sc.name);
  BOOST_TEST(s.version() == sc.version_after, sc.name);
}

const std::vector<scenario> scenarios = {
  {"a begun session commits and the version counts up",
   {{"begin 1", "prepare"}, {"prepared", "ok", "session open"}, {"update 1", "stage"},
    {"staged 3", "ok", "after end_weight_update"}, {"end 1", "commit"},
    {"committed", "ok", "weight version 7 -> 8"}},
   "closed", "8"},
  {"an end names the version",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"update 0", "stage"}, {"staged 1", "ok"},
    {"end-as v10 0", "commit"}, {"committed", "ok", "7 -> v10"}},
   "closed", "v10"},
  {"an empty session closes without a new version",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"end 0", "commit"},
    {"committed", "ok", "nothing staged"}},
   "closed", "7"},
  {"abort drops what was staged",
   {{"begin 1", "prepare"}, {"prepared", "ok"}, {"update 1", "stage"}, {"staged 4", "ok"},
    {"abort 1", "discard", "4 staged tensors dropped"}},
   "closed", "7"},
  {"a failed restore opens no session",
   {{"begin 1", "prepare"}, {"prepared fail", "fail +discard", "no session is open"},
    {"update 1", "prepare stage"}},
   "preparing", "7"},
  {"a second begin is refused, open or preparing",
   {{"begin 1", "prepare"}, {"begin 2", "refused", "already open"}, {"prepared", "ok"},
    {"begin 1", "refused", "already open"}},
   "open", "7"},
  {"updates and the end may follow a begin before its restore answered (runner mailboxes are FIFO)",
   {{"begin 1", "prepare"}, {"update 1", "stage"}, {"end 1", "commit"}, {"prepared", "ok"},
    {"staged 2", "ok"}, {"committed", "ok"}},
   "closed", "8"},
  // Ownership, checked when the request executes.
  {"another connection can neither stage into nor end nor abort a connection's session",
   {{"begin 1", "prepare"}, {"prepared", "ok"},
    {"update 2", "refused", "another websocket connection"},
    {"update 0", "refused", "an HTTP or in-process request"},
    {"end 2", "refused", "another websocket connection"}, {"abort 0", "refused"},
    {"distributed 2", "refused"}, {"distributed 1", "nothing"},
    {"update 1", "stage"}, {"staged 1", "ok"}},
   "open", "7"},
  {"ownership holds while the begin's restore is in flight",
   {{"begin 1", "prepare"}, {"update 2", "refused"}, {"end 2", "refused"}, {"prepared", "ok"}},
   "open", "7"},
  {"a session begun over HTTP is anyone's",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"update 3", "stage"}, {"staged 1", "ok"},
    {"end 4", "commit"}, {"committed", "ok"}},
   "closed", "8"},
  {"the owner's disconnect aborts its session",
   {{"begin 5", "prepare"}, {"prepared", "ok"}, {"update 5", "stage"}, {"staged 2", "ok"},
    {"abort 5", "discard"}, {"begin 6", "prepare"}},
   "preparing", "7"},
  // Staging failures.
  {"a bucket refused whole leaves the session open",
   {{"begin 1", "prepare"}, {"prepared", "ok"}, {"update 1", "stage"},
    {"staged fail", "fail", "the session stays open"}, {"update 1", "stage"}, {"staged 1", "ok"}},
   "open", "7"},
  {"a bucket staged in part aborts the session",
   {{"begin 1", "prepare"}, {"prepared", "ok"}, {"update 1", "stage"}, {"staged 2", "ok"},
    {"update 1", "stage"}, {"staged broken", "fail +discard", "session was aborted"},
    {"end 1", "refused", "no weight-update session is open"}},
   "closed", "7"},
  {"a failed commit closes the session and keeps the version",
   {{"begin 1", "prepare"}, {"prepared", "ok"}, {"update 1", "stage"}, {"staged 2", "ok"},
    {"end 1", "commit"}, {"committed fail", "fail", "failed to commit"}},
   "closed", "7"},
  {"while committing every session request is refused",
   {{"begin 1", "prepare"}, {"prepared", "ok"}, {"end 1", "commit"},
    {"update 1", "refused", "being committed"}, {"end 1", "refused", "already being committed"},
    {"begin 2", "refused", "being committed"}, {"pp quant", "refused"}, {"settle", "nothing"},
    {"distributed 1", "refused"}, {"committed", "ok"}},
   "closed", "7"},
  // Implicit sessions (updates outside begin/end).
  {"an update outside begin/end opens an implicit session that settle commits",
   {{"update 2", "prepare stage"}, {"prepared", "go on"},
    {"staged 3", "ok", "sent outside begin/end"}, {"update 3", "stage"}, {"staged 1", "ok"},
    {"settle", "commit"}, {"committed", "ok", "committed 4 tensors"}},
   "closed", "8"},
  {"an implicit session is anyone's and end_weight_update commits it",
   {{"update 2", "prepare stage"}, {"prepared", "go on"}, {"staged 1", "ok"}, {"end 9", "commit"},
    {"committed", "ok"}},
   "closed", "8"},
  {"begin is refused while an implicit update waits for its commit",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged 1", "ok"},
    {"begin 1", "refused", "outside begin/end is staged"}, {"abort 0", "discard"}},
   "closed", "7"},
  {"settle with nothing implicit does nothing",
   {{"settle", "nothing"}, {"begin 1", "prepare"}, {"prepared", "ok"}, {"settle", "nothing"}},
   "open", "7"},
  {"the implicit update's bad bucket closes nothing",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged fail", "fail"}},
   "open", "7"},
  {"a failed restore of an implicit update",
   {{"update 0", "prepare stage"}, {"prepared fail", "fail +discard", "could not start"}},
   "closed", "7"},
  // post_process_weights, slime's generation-1 calls.
  {"restore, update, post-process quantization",
   {{"pp restore", "prepare"}, {"prepared", "go on", "ready for new weights"}, {"update 0", "stage"},
    {"staged 5", "ok"}, {"pp quant", "commit"}, {"committed", "ok", "committed 5 tensors"}},
   "closed", "8"},
  {"both flags in one call: prepare then commit",
   {{"pp both", "prepare commit"}, {"prepared", "go on"}, {"committed", "ok", "nothing staged"}},
   "closed", "7"},
  {"post-process flags around a begun session are refused",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"pp restore", "refused", "inside a weight-update session"},
    {"pp quant", "refused"}},
   "open", "7"},
  {"post-process with nothing staged or nothing asked",
   {{"pp quant", "nothing", "nothing staged to post-process"}, {"pp none", "nothing", "nothing requested"}},
   "closed", "7"},
  {"restore twice says an update is staged",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged 1", "ok"},
    {"pp restore", "nothing", "already staged"}},
   "open", "7"},
  // Disk updates: a session of their own.
  {"a disk update prepares, stages and commits",
   {{"disk", "prepare stage commit"}, {"prepared", "go on"}, {"staged 9", "go on"},
    {"committed", "ok", "committed 9 tensors"}},
   "closed", "8"},
  {"a disk update is refused while a session is open, and refuses sessions while it runs",
   {{"begin 0", "prepare"}, {"disk", "refused", "session of its own"}, {"prepared", "ok"},
    {"abort 0", "discard"}, {"disk", "prepare stage commit"}, {"begin 0", "refused"},
    {"update 0", "refused", "from_disk is loading"}, {"end 0", "refused", "from_disk is loading"},
    {"distributed 0", "refused"}},
   "preparing", "7"},
  {"a disk update whose staging fails keeps the old weights",
   {{"disk", "prepare stage commit"}, {"prepared", "go on"},
    {"staged fail", "fail +discard", "weights unchanged"}},
   "closed", "7"},
  // The version.
  {"relabel changes the serving label and refuses an empty one",
   {{"relabel v2", "ok", "7 -> v2"}, {"relabel", "fail", "must not be empty"}},
   "closed", "v2"},
  // The orders in which a trainer names the new weights' version. The named version is what
  // the commit publishes, never counted up; the old one serves until the commit.
  {"order 1: the update names it; published at the commit, as named",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged 3 v9", "ok"},
    {"serving 7", "yes"}, {"pending v9", "yes"}, {"settle", "commit"},
    {"committed", "ok", "weight version 7 -> v9"}},
   "closed", "v9"},
  {"order 2, implicit: update_weight_version after the last bucket waits for the commit",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged 3", "ok"},
    {"update 0", "stage"}, {"staged 2", "ok"},
    {"relabel v9", "ok", "published when the staged update commits (continue_generation"},
    {"serving 7", "yes"}, {"pending v9", "yes"}, {"settle", "commit"}, {"serving 7", "yes"},
    {"committed", "ok", "committed 5 tensors; weight version 7 -> v9"}},
   "closed", "v9"},
  {"order 2, begun (miles): update_weight_version before end_weight_update",
   {{"begin 1", "prepare"}, {"prepared", "ok"}, {"update 1", "stage"}, {"staged 3", "ok"},
    {"relabel v9", "ok", "outputs report 7 until then"}, {"serving 7", "yes"},
    {"end 1", "commit"}, {"serving 7", "yes"},
    {"committed", "ok", "weight version 7 -> v9"}},
   "closed", "v9"},
  {"order 2, begun: named while the begin is still preparing",
   {{"begin 0", "prepare"}, {"relabel v9", "ok", "published when"}, {"prepared", "ok"},
    {"update 0", "stage"}, {"staged 3", "ok"}, {"end 0", "commit"}, {"committed", "ok", "7 -> v9"}},
   "closed", "v9"},
  {"order 3: named after an update committed while generation runs (that commit counted up)",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged 3", "ok"},
    {"settle", "commit"}, {"committed", "ok", "7 -> 8"}, {"serving 8", "yes"},
    {"relabel v9", "ok", "weight version 8 -> v9"}},
   "closed", "v9"},
  {"order 4: end_weight_update names it",
   {{"begin 1", "prepare"}, {"prepared", "ok"}, {"update 1", "stage"}, {"staged 3", "ok"},
    {"end-as v9 1", "commit"}, {"serving 7", "yes"}, {"committed", "ok", "7 -> v9"}},
   "closed", "v9"},
  {"named twice before the commit: the last name wins (relabel after relabel)",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"update 0", "stage"}, {"staged 3", "ok"},
    {"relabel v9", "ok"}, {"relabel v10", "ok", "v10 (replacing v9)"}, {"pending v10", "yes"},
    {"end 0", "commit"}, {"committed", "ok", "7 -> v10"}},
   "closed", "v10"},
  {"named twice: end_weight_update's version comes last and wins",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"update 0", "stage"}, {"staged 3 v8", "ok"},
    {"relabel v9", "ok", "replacing v8"}, {"end-as v11 0", "commit"},
    {"committed", "ok", "7 -> v11"}},
   "closed", "v11"},
  {"named twice: a later bucket's weight_version wins over update_weight_version",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged 3", "ok"},
    {"relabel v9", "ok"}, {"update 0", "stage"}, {"staged 2 v12", "ok"}, {"pending v12", "yes"},
    {"settle", "commit"}, {"committed", "ok", "7 -> v12"}},
   "closed", "v12"},
  {"named with no session open and nothing staged: applies at once, as SGLang",
   {{"pending none", "yes"}, {"relabel v9", "ok", "7 -> v9"}, {"serving v9", "yes"},
    {"settle", "nothing"}},
   "closed", "v9"},
  {"named in a begun session that stages nothing: published at its end, weights unchanged",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"relabel v9", "ok"}, {"serving 7", "yes"},
    {"end 0", "commit"}, {"committed", "ok", "weights unchanged, weight version 7 -> v9"}},
   "closed", "v9"},
  {"a begun session aborted after a version was named drops it",
   {{"begin 1", "prepare"}, {"prepared", "ok"}, {"update 1", "stage"}, {"staged 3", "ok"},
    {"relabel v9", "ok"}, {"abort 1", "discard", "the version named for them (v9)"},
    {"pending none", "yes"}, {"serving 7", "yes"}, {"end 1", "refused"}},
   "closed", "7"},
  {"an implicit session aborted after a version was named drops it",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged 3", "ok"},
    {"relabel v9", "ok"}, {"abort 0", "discard", "unchanged (version 7)"}, {"settle", "nothing"}},
   "closed", "7"},
  {"a failed commit drops the named version",
   {{"update 0", "prepare stage"}, {"prepared", "go on"}, {"staged 3", "ok"},
    {"relabel v9", "ok"}, {"settle", "commit"}, {"committed fail", "fail"}, {"pending none", "yes"}},
   "closed", "7"},
  {"a session that broke while staging drops the named version; a later name applies at once",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"update 0", "stage"}, {"staged 3 v9", "ok"},
    {"update 0", "stage"}, {"staged broken", "fail +discard"}, {"serving 7", "yes"},
    {"relabel v10", "ok", "7 -> v10"}},
   "closed", "v10"},
  {"an empty name is refused inside a session and changes nothing",
   {{"begin 0", "prepare"}, {"prepared", "ok"}, {"relabel v9", "ok"},
    {"relabel", "fail", "must not be empty"}, {"pending v9", "yes"}, {"end 0", "commit"},
    {"committed", "ok"}},
   "closed", "v9"},
};

} // namespace

BOOST_AUTO_TEST_SUITE(update_session_test)

BOOST_AUTO_TEST_CASE(every_scenario_of_the_table) {
  for (const auto& sc : scenarios)
    run(sc);
}

BOOST_AUTO_TEST_CASE(next_weight_version_counts_the_trailing_number) {
  BOOST_TEST(next_weight_version("0") == "1");
  BOOST_TEST(next_weight_version("step-9") == "step-10");
  BOOST_TEST(next_weight_version("v1.2") == "v1.3");
  BOOST_TEST(next_weight_version("main") == "main-1");
  BOOST_TEST(next_weight_version("1234567890123456789") == "1234567890123456789-1");
}

BOOST_AUTO_TEST_CASE(commits_count_only_changes) {
  update_session s{"0"};
  (void)s.begin(runner_selector::all, 0);
  (void)s.prepared(session_op::begin, std::nullopt, 1);
  (void)s.end(false, std::nullopt, 0);
  (void)s.committed(session_op::end, std::nullopt);
  BOOST_TEST(s.commits() == 0u);
  (void)s.update(runner_selector::all, 0);
  (void)s.prepared(session_op::tensor_update, std::nullopt, 1);
  (void)s.staged(session_op::tensor_update, stage_outcome{2, std::string("v5"), std::nullopt, true});
  (void)s.settle();
  auto v = s.committed(session_op::settle, std::nullopt);
  BOOST_TEST(v.success);
  BOOST_TEST(s.commits() == 1u);
  BOOST_TEST(s.version() == "v5"); // the update named the version
  // A name with no new weights is no change of weights: the prefix cache's epoch stays.
  (void)s.begin(runner_selector::all, 0);
  (void)s.prepared(session_op::begin, std::nullopt, 1);
  (void)s.relabel("v6");
  (void)s.end(false, std::nullopt, 0);
  (void)s.committed(session_op::end, std::nullopt);
  BOOST_TEST(s.version() == "v6");
  BOOST_TEST(s.commits() == 1u);
}

BOOST_AUTO_TEST_CASE(a_draft_only_session_refuses_target_updates) {
  update_session s{"0"};
  (void)s.begin(runner_selector::draft, 0);
  (void)s.prepared(session_op::begin, std::nullopt, 1);
  auto p = s.update(runner_selector::target, 0);
  BOOST_TEST(p.refused);
  BOOST_TEST(p.message.find("did not open") != std::string::npos, p.message);
  BOOST_TEST(!s.update(runner_selector::draft, 0).refused);
  BOOST_TEST((s.selector() == runner_selector::draft));
}

BOOST_AUTO_TEST_SUITE_END()
