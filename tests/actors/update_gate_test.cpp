// The pause-aware update lock as a table of orderings (docs/sglang-contract.md, 'The pause-aware
// update lock'): every ordering of generate / pause / begin / update / end / continue that SGLang
// got wrong at some point, checked without actors.
#include <boost/test/unit_test.hpp>

#include "actors/policy/update_gate.hpp"

using rlserve::policy::gate_op;
using rlserve::policy::update_gate;

namespace {

std::vector<uint64_t> ids(const std::vector<update_gate::started>& s) {
  std::vector<uint64_t> out;
  for (auto& x : s)
    out.push_back(x.id);
  return out;
}

using v = std::vector<uint64_t>;

} // namespace

BOOST_AUTO_TEST_SUITE(update_gate_test)

BOOST_AUTO_TEST_CASE(generates_run_concurrently_when_nothing_else_happens) {
  update_gate g;
  g.submit(1, gate_op::generate);
  g.submit(2, gate_op::generate);
  BOOST_TEST(ids(g.ready()) == (v{1, 2}));
  BOOST_TEST(g.running_generates() == 2);
}

BOOST_AUTO_TEST_CASE(unpaused_update_waits_for_running_generates_and_blocks_new_ones) {
  update_gate g;
  g.submit(1, gate_op::generate);
  BOOST_TEST(ids(g.ready()) == (v{1}));
  g.submit(2, gate_op::session_begin);
  g.submit(3, gate_op::generate); // arrives after the writer: waits behind it
  BOOST_TEST(g.ready().empty());
  g.finished(gate_op::generate);
  BOOST_TEST(ids(g.ready()) == (v{2}));
  g.finished(gate_op::session_begin, true);
  BOOST_TEST(g.ready().empty()); // the session holds the lock: 3 still waits
  g.submit(4, gate_op::session_update);
  BOOST_TEST(ids(g.ready()) == (v{4})); // inside the session: runs at once
  g.finished(gate_op::session_update);
  g.submit(5, gate_op::session_end);
  BOOST_TEST(ids(g.ready()) == (v{5}));
  g.finished(gate_op::session_end);
  BOOST_TEST(ids(g.ready()) == (v{3}));
}

BOOST_AUTO_TEST_CASE(paused_update_does_not_wait_for_frozen_requests) {
  // in_place / retract: requests still hold the shared lock while frozen; taking the writer
  // lock would deadlock (SGLang #22211, #29670).
  update_gate g;
  g.submit(1, gate_op::generate);
  BOOST_TEST(ids(g.ready()) == (v{1}));
  g.pause();
  g.submit(2, gate_op::session_begin);
  BOOST_TEST(ids(g.ready()) == (v{2}));
  g.finished(gate_op::session_begin, true);
  g.submit(3, gate_op::session_update);
  BOOST_TEST(ids(g.ready()) == (v{3}));
  g.finished(gate_op::session_update);
  g.submit(4, gate_op::session_end);
  BOOST_TEST(ids(g.ready()) == (v{4}));
  g.finished(gate_op::session_end);
  BOOST_TEST(g.running_generates() == 1);
}

BOOST_AUTO_TEST_CASE(a_writer_waiting_goes_when_a_pause_arrives) {
  update_gate g;
  g.submit(1, gate_op::generate);
  (void)g.ready();
  g.submit(2, gate_op::standalone);
  BOOST_TEST(g.ready().empty());
  g.pause();
  BOOST_TEST(ids(g.ready()) == (v{2}));
}

BOOST_AUTO_TEST_CASE(continue_waits_for_a_running_update_op) {
  // The TOCTOU of SGLang #22304: continue must not unpause in the middle of an update.
  update_gate g;
  g.pause();
  g.submit(1, gate_op::standalone);
  BOOST_TEST(ids(g.ready()) == (v{1}));
  g.submit(2, gate_op::resume);
  BOOST_TEST(g.ready().empty());
  BOOST_TEST(g.paused());
  g.finished(gate_op::standalone);
  BOOST_TEST(ids(g.ready()) == (v{2}));
  BOOST_TEST(!g.paused());
}

BOOST_AUTO_TEST_CASE(continue_waits_for_the_whole_session_but_does_not_block_its_end) {
  update_gate g;
  g.pause();
  g.submit(1, gate_op::session_begin);
  (void)g.ready();
  g.finished(gate_op::session_begin, true);
  g.submit(2, gate_op::resume);    // sent too early by the trainer
  g.submit(3, gate_op::generate);  // a new request while paused
  g.submit(4, gate_op::session_end);
  BOOST_TEST(ids(g.ready()) == (v{4})); // the end overtakes the blocked continue
  BOOST_TEST(g.paused());
  g.finished(gate_op::session_end);
  BOOST_TEST(ids(g.ready()) == (v{2, 3})); // then continue, then the new request
  BOOST_TEST(!g.paused());
}

BOOST_AUTO_TEST_CASE(failed_begin_opens_no_session) {
  update_gate g;
  g.submit(1, gate_op::session_begin);
  (void)g.ready();
  g.finished(gate_op::session_begin, false);
  BOOST_TEST(!g.session_open());
  g.submit(2, gate_op::generate);
  BOOST_TEST(ids(g.ready()) == (v{2}));
}

BOOST_AUTO_TEST_CASE(requests_arriving_while_paused_wait_in_order) {
  update_gate g;
  g.pause();
  for (uint64_t i = 1; i <= 5; ++i)
    g.submit(i, gate_op::generate);
  BOOST_TEST(g.ready().empty());
  BOOST_TEST(g.queued_generates() == 5u);
  g.submit(6, gate_op::resume);
  BOOST_TEST(ids(g.ready()) == (v{6, 1, 2, 3, 4, 5}));
}

BOOST_AUTO_TEST_CASE(update_ops_run_one_at_a_time_in_order) {
  update_gate g;
  g.pause();
  g.submit(1, gate_op::standalone);
  g.submit(2, gate_op::standalone);
  BOOST_TEST(ids(g.ready()) == (v{1}));
  BOOST_TEST(g.ready().empty());
  g.finished(gate_op::standalone);
  BOOST_TEST(ids(g.ready()) == (v{2}));
}

BOOST_AUTO_TEST_CASE(cancelled_queued_request_never_starts) {
  update_gate g;
  g.pause();
  g.submit(1, gate_op::generate);
  g.submit(2, gate_op::generate);
  BOOST_TEST(g.cancel(1));
  BOOST_TEST(!g.cancel(42));
  g.submit(3, gate_op::resume);
  BOOST_TEST(ids(g.ready()) == (v{3, 2}));
}

BOOST_AUTO_TEST_CASE(a_later_pause_cancels_a_continue_that_has_not_taken_effect) {
  update_gate g;
  g.pause();
  g.submit(1, gate_op::session_begin);
  (void)g.ready();
  g.finished(gate_op::session_begin, true);
  g.submit(2, gate_op::resume); // deferred to the session's end
  BOOST_TEST(g.ready().empty());
  BOOST_TEST(g.pause() == (v{2}));
  g.submit(3, gate_op::session_end);
  BOOST_TEST(ids(g.ready()) == (v{3}));
  g.finished(gate_op::session_end);
  BOOST_TEST(g.ready().empty());
  BOOST_TEST(g.paused());
}

BOOST_AUTO_TEST_CASE(double_pause_and_continue_without_pause_are_harmless) {
  update_gate g;
  g.submit(1, gate_op::resume); // continue without pause
  BOOST_TEST(ids(g.ready()) == (v{1}));
  g.pause();
  g.pause();
  g.submit(2, gate_op::resume);
  BOOST_TEST(ids(g.ready()) == (v{2}));
  BOOST_TEST(!g.paused());
}

BOOST_AUTO_TEST_CASE(a_closed_session_releases_waiting_requests) {
  // A client that vanished mid-session (network issue) has its session aborted for it.
  update_gate g;
  g.submit(1, gate_op::session_begin);
  (void)g.ready();
  g.finished(gate_op::session_begin, true);
  g.submit(2, gate_op::generate);
  BOOST_TEST(g.ready().empty());
  g.close_session();
  BOOST_TEST(ids(g.ready()) == (v{2}));
}

BOOST_AUTO_TEST_SUITE_END()
