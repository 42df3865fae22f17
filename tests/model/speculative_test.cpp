// model/speculative: verify_draft against distributions built here. The first emitted token is
// distributed as the target's p whatever the draft's q (chi-square over many seeds, for drafts
// that agree, disagree, or never overlap); q == p accepts everything; greedy keeps exactly the
// argmax-matching prefix; logprobs are the target's log_softmax(logits / T).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "model/speculative.hpp"

using namespace rlserve::model;

namespace {

constexpr int k_vocab = 8;

std::vector<float> normalized(std::vector<double> w) {
  double z = 0;
  for (double x : w)
    z += x;
  std::vector<float> out;
  for (double x : w)
    out.push_back(static_cast<float>(x / z));
  return out;
}

// Logits whose softmax at temperature 1 is `p` (zeros become -inf).
std::vector<float> logits_for(const std::vector<float>& p) {
  std::vector<float> out;
  for (float x : p)
    out.push_back(x > 0 ? std::log(x) : -INFINITY);
  return out;
}

// Draws from `q` with the test's own generator (the draft's role).
int32_t draw(const std::vector<float>& q, std::mt19937_64& rng) {
  std::discrete_distribution<int> d(q.begin(), q.end());
  return d(rng);
}

} // namespace

BOOST_AUTO_TEST_SUITE(speculative_test)

BOOST_AUTO_TEST_CASE(first_emitted_token_follows_the_target_whatever_the_draft) {
  const auto p = normalized({30, 20, 15, 10, 10, 8, 5, 2});
  const std::vector<std::vector<float>> drafts = {
    normalized({30, 20, 15, 10, 10, 8, 5, 2}), // equal
    normalized({5, 5, 30, 30, 10, 10, 5, 5}),  // disagrees
    normalized({0, 0, 0, 0, 0, 0, 1, 0}),      // one token only
  };
  sampling_config cfg; // temperature 1, no filtering
  // Rows: p at every position; k = 2 proposals.
  std::vector<float> logits;
  for (int r = 0; r < 3; ++r) {
    auto l = logits_for(p);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  for (std::size_t d = 0; d < drafts.size(); ++d) {
    const auto& q = drafts[d];
    std::vector<float> q_rows(q);
    q_rows.insert(q_rows.end(), q.begin(), q.end());
    std::mt19937_64 rng(d + 1);
    constexpr int n = 20000;
    std::vector<int> counts(k_vocab, 0);
    int accepted = 0;
    for (int i = 0; i < n; ++i) {
      sampler target(1000 * d + i);
      std::vector<int32_t> proposals{draw(q, rng), draw(q, rng)};
      auto v = verify_draft(target, cfg, logits, k_vocab, proposals, q_rows);
      BOOST_REQUIRE(!v.tokens.empty());
      BOOST_REQUIRE_EQUAL(v.tokens.size(), static_cast<std::size_t>(v.accepted + 1));
      ++counts[v.tokens[0]];
      accepted += v.accepted;
    }
    double chi2 = 0;
    for (int t = 0; t < k_vocab; ++t) {
      double e = p[t] * n;
      chi2 += (counts[t] - e) * (counts[t] - e) / e;
    }
    BOOST_TEST_MESSAGE("draft " << d << ": chi2 " << chi2 << ", accepted " << accepted << " of " << 2 * n);
    BOOST_TEST(chi2 < 24.32); // 7 degrees of freedom, p = 0.001; fixed seeds: deterministic
    if (d == 0)
      BOOST_TEST(accepted == 2 * n); // q == p: min(1, p/q) = 1 everywhere
  }
}

BOOST_AUTO_TEST_CASE(greedy_keeps_the_matching_prefix_and_adds_the_argmax) {
  sampling_config cfg;
  cfg.temperature = 0.0f;
  // argmax per row: 3, 1, 4, 6
  std::vector<float> logits(4 * k_vocab, 0.0f);
  int best[] = {3, 1, 4, 6};
  for (int r = 0; r < 4; ++r)
    logits[r * k_vocab + best[r]] = 5.0f;
  sampler s(1);
  auto all = verify_draft(s, cfg, logits, k_vocab, std::vector<int32_t>{3, 1, 4}, {});
  BOOST_TEST(all.tokens == (std::vector<int32_t>{3, 1, 4, 6}));
  BOOST_TEST(all.accepted == 3);
  auto some = verify_draft(s, cfg, logits, k_vocab, std::vector<int32_t>{3, 2, 4}, {});
  BOOST_TEST(some.tokens == (std::vector<int32_t>{3, 1}));
  BOOST_TEST(some.accepted == 1);
  auto none = verify_draft(s, cfg, logits, k_vocab, std::vector<int32_t>{0, 1, 4}, {});
  BOOST_TEST(none.tokens == (std::vector<int32_t>{3}));
  // logprob at temperature 1 for greedy: log(e^5 / (e^5 + 7))
  BOOST_TEST(none.logprobs[0] == std::log(std::exp(5.0) / (std::exp(5.0) + 7)),
             boost::test_tools::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(a_draft_outside_the_targets_support_is_always_rejected) {
  sampling_config cfg;
  cfg.top_k = 2; // target support {0, 1}
  auto p = normalized({40, 30, 10, 10, 4, 3, 2, 1});
  std::vector<float> logits;
  for (int r = 0; r < 2; ++r) {
    auto l = logits_for(p);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  auto q = normalized({0, 0, 0, 0, 0, 0, 0, 1});
  int counts[2] = {0, 0};
  for (int i = 0; i < 4000; ++i) {
    sampler s(i);
    auto v = verify_draft(s, cfg, logits, k_vocab, std::vector<int32_t>{7}, q);
    BOOST_REQUIRE_EQUAL(v.accepted, 0);
    BOOST_REQUIRE(v.tokens[0] == 0 || v.tokens[0] == 1);
    ++counts[v.tokens[0]];
  }
  // top-2 renormalized: 4/7 and 3/7
  double e0 = 4000.0 * 4 / 7, e1 = 4000.0 * 3 / 7;
  double chi2 = (counts[0] - e0) * (counts[0] - e0) / e0 + (counts[1] - e1) * (counts[1] - e1) / e1;
  BOOST_TEST(chi2 < 10.83); // 1 degree of freedom, p = 0.001
}

BOOST_AUTO_TEST_SUITE_END()
