// Reproducible rollouts on the CPU runner, bit for bit (tokens and logprobs), for a dense and a
// MoE model, with seeded sampling:
//   - run to run: two engine instances given the same requests;
//   - batch invariance: a request alone equals the same request among 31 others of random
//     lengths arriving with it;
//   - chunked prefill: a prompt prefilled in chunks of 16 tokens equals one prefilled at once.
// The CPU kernels compute each row with the same arithmetic whatever else is in the batch (the
// matmul splits work by output columns, never by the reduction), so these hold by construction;
// the tests keep them holding. The GPU runner's batch-invariant mode is separate work.
#include <boost/test/unit_test.hpp>

#include <future>
#include <random>

#include "tests/support/engine_support.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

GenerateReqInput sampled(std::vector<int32_t> prompt, int32_t n, uint64_t seed, std::string rid) {
  GenerateReqInput r;
  r.rid = std::move(rid);
  r.input_ids = std::move(prompt);
  r.sampling_params.max_new_tokens = n;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.temperature = 0.8f;
  r.sampling_params.top_p = 0.95f;
  r.sampling_params.sampling_seed = seed;
  r.return_logprob = true;
  return r;
}

std::vector<GenerateReqInput> random_batch(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerateReqInput> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(3 + rng() % 60);
    for (auto& t : prompt)
      t = static_cast<int32_t>(rng() % 500);
    out.push_back(sampled(std::move(prompt), static_cast<int32_t>(4 + rng() % 24), rng(),
                          "other-" + std::to_string(i)));
  }
  return out;
}

void same_bits(const GenerateReqOutput& a, const GenerateReqOutput& b) {
  BOOST_TEST(a.output_ids == b.output_ids);
  BOOST_TEST(a.output_token_logprobs == b.output_token_logprobs); // exact float equality
}

} // namespace

BOOST_AUTO_TEST_SUITE(determinism_sim_test)

BOOST_AUTO_TEST_CASE(rollouts_are_bitwise_reproducible_alone_batched_and_chunked) {
  for (const auto& dir : {tiny_model("target", 11), tiny_moe_model("determinism-moe", 5)}) {
    BOOST_TEST_CONTEXT("model " << dir.filename()) {
      std::vector<int32_t> prompt(90);
      for (std::size_t i = 0; i < prompt.size(); ++i)
        prompt[i] = static_cast<int32_t>((i * 37 + 11) % 500);
      auto probe = sampled(prompt, 24, 4242, "probe");

      // Run to run, and alone vs among 31 others (the probe first, so they batch with it).
      auto batch = random_batch(31, 9);
      batch.insert(batch.begin(), probe);
      auto first = start(dir);
      auto alone = first->generate(probe);
      BOOST_REQUIRE(alone.success);
      auto together = run_together(*first, batch);
      auto second = start(dir);
      auto again = run_together(*second, batch);
      same_bits(together[0], alone);
      for (std::size_t i = 0; i < batch.size(); ++i)
        BOOST_TEST_CONTEXT("request " << i) { same_bits(together[i], again[i]); }

      // Prefilled in chunks of 16 tokens (and without the prefix cache, which would reuse the
      // probe's prompt) against the unchunked run.
      engine_config chunked;
      chunked.max_batch_tokens = 16;
      chunked.disable_radix_cache = true;
      auto small_steps = start(dir, {}, chunked);
      same_bits(small_steps->generate(probe), alone);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
