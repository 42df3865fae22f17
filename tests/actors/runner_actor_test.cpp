// actors/runner_actor: a forward batch and its answer share one index space — work entries at
// the first positions, plain decodes after them, and the answer's tokens, logprobs, errors and
// details by the same positions — checked on a CPU runner over a tiny seeded model: a sequence
// answers the same whether it runs as a work entry or as a plain decode, a prefill chunk that
// samples nothing has no token, a failed position fails alone at its own index, and a batch whose
// sequences do not match its entries is refused whole; a verification whose draft rows are on a
// device this runner does not have fails alone.
#include <boost/test/unit_test.hpp>

#include <memory>

#include "actors/runner_actor.hpp"
#include "caf/all.hpp"
#include "tests/support/engine_support.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

struct runner_fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  runner_actor runner;

  runner_fixture() {
    cfg.add_message_types<caf::id_block::rlserve>();
    sys = std::make_unique<caf::actor_system>(cfg);
    const auto dir = tiny_model("runner-actor", 17);
    runner_options o;
    o.model_path = dir;
    o.kv_block_size = 16;
    o.kv_num_blocks = 16;
    runner = spawn_cpu_runner(*sys, o, std::shared_ptr<model::qwen3_model>(load_model(dir)));
  }
  ~runner_fixture() {
    caf::anon_send_exit(runner, caf::exit_reason::user_shutdown);
    runner = runner_actor{}; // the detached runner's thread ends with its last handle
  }

  ForwardBatchOutput run(ForwardBatch batch) {
    ForwardBatchOutput out;
    caf::scoped_actor self{*sys};
    self->request(runner, caf::infinite, std::move(batch))
      .receive([&](ForwardBatchOutput& o) { out = std::move(o); },
               [&](caf::error& e) { BOOST_FAIL("the runner did not answer: " << sys->render(e)); });
    return out;
  }
};

// A new greedy sequence running `prompt` in block `block`.
SequenceWork start(std::vector<int32_t> prompt, int32_t block, bool sample = true) {
  SequenceWork w;
  w.new_sequence = true;
  w.new_blocks = {block};
  w.tokens = std::move(prompt);
  w.sample = sample;
  w.sampling_params.temperature = 0.0f;
  return w;
}

} // namespace

BOOST_FIXTURE_TEST_SUITE(runner_actor_test, runner_fixture)

BOOST_AUTO_TEST_CASE(positions_index_the_batch_and_its_answer) {
  // Sequences 1 and 2 run the same prompt; 3 prefills a chunk without sampling; 9 is unknown.
  ForwardBatch first;
  first.step = 1;
  first.seq_ids = {1, 2, 3, 9};
  first.work = {start({5, 6, 7, 8}, 0), start({5, 6, 7, 8}, 1), start({9, 10, 11}, 2, false)};
  first.decode_tokens = {4};
  auto a = run(first);
  BOOST_REQUIRE_MESSAGE(a.success, a.message);
  BOOST_REQUIRE(a.tokens.size() == 4u);
  BOOST_REQUIRE(a.logprobs.size() == 4u);
  BOOST_REQUIRE(a.details.size() == 3u);
  BOOST_REQUIRE(a.errors.size() == 4u);
  BOOST_TEST(a.tokens[0] >= 0);
  BOOST_TEST(a.tokens[1] == a.tokens[0]); // same prompt, greedy
  BOOST_TEST(a.logprobs[1] == a.logprobs[0]);
  BOOST_TEST(a.tokens[2] == -1); // a prefill chunk samples nothing
  BOOST_TEST(a.error(0).empty());
  BOOST_TEST(a.error(2).empty());
  BOOST_TEST(a.error(3).find("sequence 9 is unknown") != std::string::npos, a.error(3));
  BOOST_TEST(a.tokens[3] == -1);

  // Sequence 1 goes on as a work entry (asking for top logprobs), 2 as a plain decode, 3 samples
  // after its last prompt token: 1 and 2 still agree, at their own positions.
  const int32_t next = a.tokens[0];
  ForwardBatch second;
  second.step = 2;
  SequenceWork one;
  one.tokens = {next};
  one.top_logprobs_num = 2;
  SequenceWork three;
  three.tokens = {12};
  second.seq_ids = {1, 3, 2};
  second.work = {one, three};
  second.decode_tokens = {next};
  auto b = run(second);
  BOOST_REQUIRE_MESSAGE(b.success, b.message);
  BOOST_REQUIRE(b.tokens.size() == 3u);
  BOOST_REQUIRE(b.details.size() == 2u);
  BOOST_TEST(b.errors.empty()); // none failed
  BOOST_TEST(b.tokens[0] >= 0);
  BOOST_TEST(b.tokens[2] == b.tokens[0]);
  BOOST_TEST(b.logprobs[2] == b.logprobs[0]);
  BOOST_TEST(b.tokens[1] >= 0);
  BOOST_REQUIRE(b.details[0].top_logprobs.size() == 1u);
  BOOST_REQUIRE(b.details[0].top_logprobs[0].size() == 2u);
  BOOST_TEST(b.details[0].top_logprobs[0][0].token_id == b.tokens[0]); // greedy: the most likely
  // The same number for the same token: a client compares output_token_logprobs with the first
  // of output_top_logprobs.
  BOOST_TEST(b.details[0].top_logprobs[0][0].logprob == b.logprobs[0]);
  BOOST_TEST(b.details[1].top_logprobs.empty());
}

BOOST_AUTO_TEST_CASE(a_batch_whose_sequences_do_not_match_its_entries_is_refused) {
  ForwardBatch batch;
  batch.step = 1;
  batch.seq_ids = {1};
  batch.work = {start({5, 6}, 0)};
  batch.decode_tokens = {4};
  auto out = run(batch);
  BOOST_TEST(!out.success);
  BOOST_TEST(out.message.find("names 1 sequences for 1 work entries and 1 plain decodes") !=
               std::string::npos,
             out.message);
  BOOST_TEST(out.tokens.empty());
}

// A sampled verification that says the draft's distributions are on the device reaches a runner
// that has none there (a CPU runner): it fails alone, naming why, and changes nothing of its
// sequence, which then runs on as if the verification had never been sent.
BOOST_AUTO_TEST_CASE(a_verification_whose_draft_rows_are_not_here_fails_alone) {
  auto sampled = [](std::vector<int32_t> prompt, int32_t block) {
    auto w = start(std::move(prompt), block);
    w.sampling_params.temperature = 1.0f;
    w.sampling_seed = 5;
    return w;
  };
  ForwardBatch first;
  first.step = 1;
  first.seq_ids = {1, 2};
  first.work = {sampled({5, 6, 7, 8}, 0), sampled({5, 6, 7, 8}, 1)};
  auto a = run(first);
  BOOST_REQUIRE_MESSAGE(a.success, a.message);
  BOOST_REQUIRE(a.tokens.size() == 2u);
  const int32_t next = a.tokens[0];
  BOOST_REQUIRE(next >= 0);

  // Sequence 1 verifies two proposals whose rows would be on the device; sequence 2 runs the
  // same token with its top logprobs.
  ForwardBatch second;
  second.step = 2;
  SequenceWork verify;
  verify.tokens = {next};
  verify.draft_tokens = {3, 4};
  verify.draft_probs_on_device = true;
  SequenceWork plain;
  plain.tokens = {next};
  plain.top_logprobs_num = 3;
  second.seq_ids = {1, 2};
  second.work = {verify, plain};
  auto b = run(second);
  BOOST_REQUIRE_MESSAGE(b.success, b.message);
  BOOST_REQUIRE(b.errors.size() == 2u);
  BOOST_TEST(b.error(0).find("sequence 1: the draft's distributions are on the device") != std::string::npos,
             b.error(0));
  BOOST_TEST(b.error(1).empty());
  BOOST_TEST(b.tokens[0] == -1);
  BOOST_REQUIRE(b.details.size() == 2u);
  BOOST_REQUIRE(b.details[1].top_logprobs.size() == 1u);

  // Sequence 1's KV is as it was: the same token now gives sequence 2's top logprobs.
  ForwardBatch third;
  third.step = 3;
  third.seq_ids = {1};
  third.work = {plain};
  auto c = run(third);
  BOOST_REQUIRE_MESSAGE(c.success, c.message);
  BOOST_TEST(c.error(0).empty(), c.error(0));
  BOOST_REQUIRE(c.details.size() == 1u);
  BOOST_REQUIRE(c.details[0].top_logprobs.size() == 1u);
  const auto& want = b.details[1].top_logprobs[0];
  const auto& got = c.details[0].top_logprobs[0];
  BOOST_REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    BOOST_TEST(got[i].token_id == want[i].token_id);
    BOOST_TEST(got[i].logprob == want[i].logprob);
  }
}

BOOST_AUTO_TEST_SUITE_END()
