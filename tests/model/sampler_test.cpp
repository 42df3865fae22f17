// model/sampler: greedy, seeded determinism, the support top-k / top-p / min-p leave, reported
// logprobs, and the sampled frequencies against the distribution (chi-square).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kernels/logprob_norm.hpp"
#include "kernels/sampler.hpp"
#include "model/sampler.hpp"

using rlserve::model::rng;
using rlserve::model::sampled_token;
using rlserve::model::sampler;
using rlserve::model::sampling_config;

namespace {

constexpr float k_logprob_tolerance = 1e-5f;
// Chi-square critical value for 7 degrees of freedom at p = 0.001: a correct sampler fails this
// once in a thousand seeds; the seeds below are fixed, so the test is deterministic.
constexpr double k_chi2_7dof_p001 = 24.32;

// Direct log_softmax(logits / T)[i] in long double.
double direct_logprob(const std::vector<float>& logits, double t, int i) {
  long double m = -INFINITY;
  for (float l : logits)
    m = std::max<long double>(m, l / t);
  long double s = 0;
  for (float l : logits)
    s += std::exp(l / t - m);
  return double(logits[i] / t - (m + std::log(s)));
}

// Logits whose softmax is exactly `probs` (up to rounding).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs)
    l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<int32_t, int> histogram(sampler& s, const std::vector<float>& logits,
                                 const sampling_config& cfg, int draws) {
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i)
    ++h[s.sample(logits, cfg).token];
  return h;
}

std::set<int32_t> support(const std::map<int32_t, int>& h) {
  std::set<int32_t> s;
  for (const auto& [id, n] : h)
    s.insert(id);
  return s;
}

double chi_square(const std::map<int32_t, int>& h, const std::vector<double>& expected_probs,
                  int draws) {
  double chi2 = 0;
  for (std::size_t i = 0; i < expected_probs.size(); ++i) {
    const double e = expected_probs[i] * draws;
    const double o = h.count(int32_t(i)) ? h.at(int32_t(i)) : 0;
    chi2 += (o - e) * (o - e) / e;
  }
  return chi2;
}

} // namespace

BOOST_AUTO_TEST_SUITE(sampler_test)

BOOST_AUTO_TEST_CASE(greedy_is_argmax_with_lowest_id_on_ties) {
  sampler s(1);
  std::vector<float> logits{0.5f, 3.0f, -1.0f, 3.0f, 2.0f};
  for (float t : {0.0f, 1e-7f}) {
    sampling_config cfg{t};
    auto out = s.sample(logits, cfg);
    BOOST_TEST(out.token == 1);
    BOOST_TEST(std::abs(out.logprob - direct_logprob(logits, 1.0, 1)) < k_logprob_tolerance);
  }
  // Greedy ignores top-k/top-p/min-p and never touches the generator.
  sampler a(9), b(9);
  sampling_config greedy{0.0f, 1, 0.1f, 0.9f};
  a.sample(logits, greedy);
  sampling_config t1{};
  BOOST_TEST(a.sample(logits, t1).token == b.sample(logits, t1).token);
}

BOOST_AUTO_TEST_CASE(nan_and_empty_inputs) {
  sampler s(2);
  auto empty = s.sample(std::vector<float>{}, sampling_config{});
  BOOST_TEST(empty.token == -1);
  BOOST_TEST(std::isinf(empty.logprob));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> logits{nan, 1.0f, nan, 0.0f};
  BOOST_TEST(s.sample(logits, sampling_config{0.0f}).token == 1);
  auto h = histogram(s, logits, sampling_config{}, 500);
  BOOST_TEST((support(h) == std::set<int32_t>{1, 3}));
}

BOOST_AUTO_TEST_CASE(same_seed_same_tokens_other_seed_other_tokens) {
  std::vector<float> logits(64);
  std::mt19937 g(3);
  std::normal_distribution<float> normal;
  for (auto& l : logits)
    l = normal(g);
  sampling_config cfg{0.8f, 20, 0.95f, 0.0f};
  sampler a(1234), b(1234), c(1235);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 200; ++i) {
    auto x = a.sample(logits, cfg), y = b.sample(logits, cfg);
    ta.push_back(x.token);
    tb.push_back(y.token);
    BOOST_TEST(x.logprob == y.logprob);
    tc.push_back(c.sample(logits, cfg).token);
  }
  BOOST_TEST(ta == tb);
  BOOST_TEST((ta != tc));
}

BOOST_AUTO_TEST_CASE(rng_uniforms_are_24_bit_and_in_range) {
  rng r(0);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const float u = r.uniform();
    BOOST_REQUIRE(u >= 0.0f);
    BOOST_REQUIRE(u < 1.0f);
    BOOST_REQUIRE(u * 16777216.0f == std::floor(u * 16777216.0f)); // k * 2^-24
    sum += u;
  }
  BOOST_TEST(std::abs(sum / 100000 - 0.5) < 0.01);
}

BOOST_AUTO_TEST_CASE(top_k_restricts_the_support) {
  std::vector<float> logits{1.0f, 4.0f, 2.0f, 3.5f, 0.0f, 3.9f};
  sampler s(5);
  auto h = histogram(s, logits, sampling_config{1.0f, 3}, 3000);
  BOOST_TEST((support(h) == std::set<int32_t>{1, 3, 5}));
  h = histogram(s, logits, sampling_config{1.0f, 1}, 200);
  BOOST_TEST((support(h) == std::set<int32_t>{1}));
  h = histogram(s, logits, sampling_config{1.0f, 100}, 5000); // k > vocab: no filter
  BOOST_TEST(support(h).size() == logits.size());
}

BOOST_AUTO_TEST_CASE(top_p_keeps_the_smallest_set_reaching_p) {
  auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  sampler s(6);
  BOOST_TEST((support(histogram(s, logits, {1.0f, -1, 0.1f}, 500)) == std::set<int32_t>{0}));
  BOOST_TEST((support(histogram(s, logits, {1.0f, -1, 0.7f}, 2000)) == std::set<int32_t>{0, 1}));
  BOOST_TEST((support(histogram(s, logits, {1.0f, -1, 0.9f}, 4000)) ==
              std::set<int32_t>{0, 1, 2}));
  BOOST_TEST((support(histogram(s, logits, {1.0f, -1, 0.0f}, 200)) == std::set<int32_t>{0}));
  // Combined with top-k: top-k first, then top-p on what is left.
  BOOST_TEST((support(histogram(s, logits, {1.0f, 2, 0.99f}, 2000)) == std::set<int32_t>{0, 1}));
}

BOOST_AUTO_TEST_CASE(min_p_drops_tokens_below_a_fraction_of_the_max) {
  auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  sampler s(7);
  // Threshold 0.2 * 0.5 = 0.1: the 0.05 token goes.
  BOOST_TEST((support(histogram(s, logits, {1.0f, -1, 1.0f, 0.2f}, 4000)) ==
              std::set<int32_t>{0, 1, 2}));
  // Threshold 0.7 * 0.5 = 0.35: only the top token.
  BOOST_TEST((support(histogram(s, logits, {1.0f, -1, 1.0f, 0.7f}, 500)) ==
              std::set<int32_t>{0}));
  // min_p > 1 would drop everything: the top token stays.
  BOOST_TEST((support(histogram(s, logits, {1.0f, -1, 1.0f, 1.5f}, 100)) ==
              std::set<int32_t>{0}));
}

BOOST_AUTO_TEST_CASE(logprob_is_log_softmax_of_scaled_logits_before_filtering) {
  std::vector<float> logits(50);
  std::mt19937 g(8);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (auto& l : logits)
    l = normal(g);
  sampler s(9);
  for (float t : {0.3f, 0.7f, 1.0f, 1.8f}) {
    for (const sampling_config& cfg : {sampling_config{t}, sampling_config{t, 5, 0.8f, 0.05f}}) {
      for (int i = 0; i < 50; ++i) {
        sampled_token out = s.sample(logits, cfg);
        BOOST_REQUIRE(out.token >= 0);
        BOOST_REQUIRE(out.token < 50);
        // Not renormalized over the filtered set: the policy's probability, as SGLang reports.
        BOOST_TEST(std::abs(out.logprob - direct_logprob(logits, t, out.token)) <
                     k_logprob_tolerance, "T=" << t << " token " << out.token);
      }
    }
  }
}

// A peaked row: the top token's logprob is about -1e-14, which float holds exactly. The device
// sums the same terms in another order (per thread, then a block reduction); the reported float
// must not depend on that order, and must be the true value rounded (long double reference).
BOOST_AUTO_TEST_CASE(peaked_row_logprob_does_not_depend_on_the_order_of_the_sum) {
  std::mt19937 g(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int old_formula_disagreements = 0;
  for (int row = 0; row < 64; ++row) {
    std::vector<float> logits(4096);
    for (auto& l : logits)
      l = normal(g);
    const int top = row * 61 % 4096;
    logits[top] = 36.0f + 0.1f * static_cast<float>(row % 10);
    const double m = logits[top];
    const float reported = rlserve::model::token_logprob(logits, 1.0f, top);
    BOOST_TEST(reported == sampler(1).sample(logits, sampling_config{0.0f}).logprob);
    // The same terms in the device's order: 1024 threads striding the row, then the threads'
    // sums in index order (a stand-in for the warp and block reduction: any order will do).
    std::vector<double> part(1024, 0.0), part_old(1024, 0.0);
    int ties = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      const double d = double(logits[i]) - m;
      part_old[i % 1024] += std::exp(d);
      if (d == 0.0)
        ++ties;
      else
        part[i % 1024] += std::exp(d);
    }
    double rest = 0.0, total_old = 0.0;
    for (int t = 1023; t >= 0; --t) {
      rest += part[t];
      total_old += part_old[t];
    }
    const float strided = rlserve::kernels::scaled_logprob(m, m, rlserve::kernels::log_norm(ties, rest));
    BOOST_TEST(strided == reported, "row " << row);
    long double rest_l = 0;
    for (float l : logits)
      if (l != logits[top])
        rest_l += std::exp(static_cast<long double>(l) - static_cast<long double>(m));
    BOOST_TEST(reported == static_cast<float>(-std::log1p(rest_l)), "row " << row);
    // m - (m + log(1 + rest)) in two orders: what the split and log1p exist to avoid.
    double total_seq = 0.0;
    for (float l : logits)
      total_seq += std::exp(double(l) - m);
    old_formula_disagreements +=
      static_cast<float>(m - (m + std::log(total_old))) != static_cast<float>(m - (m + std::log(total_seq)));
  }
  BOOST_TEST_MESSAGE("m - (m + log(1 + rest)) differs between the two orders in " << old_formula_disagreements
                                                                                  << " of 64 rows");
}

// Top logprobs are what a client compares the sampled token's logprob with: the same bits for the
// same token, most likely first (ties to the lower id), NaN logits last, at any temperature.
BOOST_AUTO_TEST_CASE(top_logprobs_have_the_sampled_tokens_bits) {
  std::mt19937 g(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int row = 0; row < 40; ++row) {
    std::vector<float> logits(3000);
    for (auto& l : logits)
      l = normal(g);
    if (row % 4 == 1)
      logits[7] = 40.0f; // peaked: the top logprob is about -1e-14
    if (row % 4 == 2)
      logits[11] = logits[5] = 9.0f, logits[3] = NAN; // a tie at the top, a NaN
    const float t = row % 3 == 0 ? 0.0f : row % 3 == 1 ? 0.7f : 1.3f;
    const auto top = rlserve::model::top_logprobs(logits, t, 5);
    BOOST_REQUIRE(top.size() == 5u);
    for (std::size_t i = 0; i < top.size(); ++i) {
      BOOST_TEST(top[i].logprob == rlserve::model::token_logprob(logits, t, top[i].token), "row " << row << " rank " << i);
      if (i > 0)
        BOOST_TEST((logits[top[i - 1].token] > logits[top[i].token] ||
                    (logits[top[i - 1].token] == logits[top[i].token] && top[i - 1].token < top[i].token)));
    }
    if (row % 4 == 2)
      BOOST_TEST((top[0].token == 5 && top[1].token == 11));
    if (t == 0.0f) // greedy: the sampled token and its logprob are the first entry's
      BOOST_TEST(sampler(1).sample(logits, sampling_config{t}).logprob == top[0].logprob);
  }
  std::vector<float> nans(4, NAN);
  const auto none = rlserve::model::top_logprobs(nans, 1.0f, 2);
  BOOST_REQUIRE(none.size() == 2u);
  BOOST_TEST((none[0].token == 0 && none[1].token == 1 && std::isinf(none[0].logprob) && none[0].logprob < 0));
  BOOST_TEST(rlserve::model::top_logprobs(nans, 1.0f, 0).empty());
  BOOST_TEST(rlserve::model::top_logprobs({}, 1.0f, 3).empty());
}

BOOST_AUTO_TEST_CASE(frequencies_follow_the_distribution_at_t1) {
  const std::vector<double> probs{0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02};
  const auto logits = logits_of(probs);
  const int draws = 40000;
  for (uint64_t seed : {11u, 12u, 13u}) {
    sampler s(seed);
    auto h = histogram(s, logits, sampling_config{}, draws);
    const double chi2 = chi_square(h, probs, draws);
    BOOST_TEST_MESSAGE("seed " << seed << ": chi-square " << chi2 << " (7 dof)");
    BOOST_TEST(chi2 < k_chi2_7dof_p001, "seed " << seed << ": chi-square " << chi2);
  }
  // Temperature 2 flattens: p ~ sqrt(probs), renormalized.
  std::vector<double> flat;
  double z = 0;
  for (double p : probs)
    z += std::sqrt(p);
  for (double p : probs)
    flat.push_back(std::sqrt(p) / z);
  sampler s(14);
  auto h = histogram(s, logits, sampling_config{2.0f}, draws);
  BOOST_TEST(chi_square(h, flat, draws) < k_chi2_7dof_p001);
  // top-k renormalizes over the kept tokens: 0.3, 0.2, 0.15 -> /0.65.
  h = histogram(s, logits, sampling_config{1.0f, 3}, draws);
  double chi2 = 0;
  for (int i = 0; i < 3; ++i) {
    const double e = probs[i] / 0.65 * draws;
    chi2 += (h[i] - e) * (h[i] - e) / e;
  }
  BOOST_TEST(chi2 < 13.82); // 2 dof, p = 0.001
}

// The GPU sampler's CPU twin (kernels::sample_ref, which the CUDA kernel is held to in
// tests/kernels/decoder_ops_gpu_test.cu) draws what sampler::sample draws from the same uniform:
// same token and logprob, bit for bit, over greedy rows, every filter and their mixes.
BOOST_AUTO_TEST_CASE(gpu_sampler_reference_equals_the_host_sampler) {
  std::mt19937_64 gen(2026);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t V = 3000;
  int64_t rows_checked = 0;
  for (int trial = 0; trial < 120; ++trial) {
    std::vector<float> logits(static_cast<std::size_t>(V));
    for (auto& l : logits)
      l = normal(gen);
    if (trial % 10 == 3)
      logits[7] = std::numeric_limits<float>::quiet_NaN(); // NaN counts as -inf on both sides
    sampling_config cfg;
    cfg.temperature = trial % 6 == 0 ? 0.0f : 0.2f + 0.02f * static_cast<float>(trial % 50);
    cfg.top_k = trial % 3 == 0 ? 1 + trial % 40 : -1;
    cfg.top_p = trial % 4 == 1 ? 0.6f + 0.003f * static_cast<float>(trial) : 1.0f;
    cfg.min_p = trial % 5 == 2 ? 0.02f : 0.0f;
    sampler host(1000 + static_cast<uint64_t>(trial));
    const float u = host.peek_uniform();
    const sampled_token want = host.sample(logits, cfg);
    const float temperature = cfg.temperature;
    const int32_t top_k = cfg.top_k;
    float token_logprob = 0.0f;
    int32_t token = -2;
    rlserve::kernels::sample_args a{logits.data(), &temperature, &top_k, &cfg.top_p, &cfg.min_p, &u,
                                    &token, &token_logprob, 1, V};
    BOOST_REQUIRE(rlserve::kernels::sample_ref(a) == rlserve::kernels::kernel_status::ok);
    BOOST_TEST_INFO("trial " << trial << " T " << cfg.temperature << " top-k " << cfg.top_k << " top-p "
                             << cfg.top_p << " min-p " << cfg.min_p);
    BOOST_TEST(token == want.token);
    BOOST_TEST(token_logprob == want.logprob);
    ++rows_checked;
  }
  // A padding row (temperature < 0) yields -1 and reads no uniform.
  std::vector<float> logits(16, 0.0f);
  const float temperature = -1.0f, top_p = 1.0f, min_p = 0.0f, u = 0.5f;
  const int32_t top_k = 0;
  float lp = 0.0f;
  int32_t token = 3;
  rlserve::kernels::sample_args pad{logits.data(), &temperature, &top_k, &top_p, &min_p, &u, &token, &lp, 1, 16};
  BOOST_REQUIRE(rlserve::kernels::sample_ref(pad) == rlserve::kernels::kernel_status::ok);
  BOOST_TEST(token == -1);
  BOOST_TEST(rows_checked == 120);
}

// Top-p replay: the twin lists the kept set model::sampler::sample draws from (same ids, same
// order) and reports the same logprob over it, bit for bit; a set beyond kept_cap is -1 there
// with the unfiltered logprob.
BOOST_AUTO_TEST_CASE(gpu_sampler_reference_lists_the_host_samplers_kept_set) {
  std::mt19937_64 gen(77);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t V = 2000;
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<float> logits(static_cast<std::size_t>(V));
    for (auto& l : logits)
      l = normal(gen);
    sampling_config cfg;
    cfg.temperature = trial % 7 == 0 ? 0.0f : 0.3f + 0.03f * static_cast<float>(trial % 40);
    cfg.top_k = trial % 3 == 0 ? 1 + trial % 30 : -1;
    cfg.top_p = trial % 3 == 0 && trial % 2 == 0 ? 1.0f : 0.5f + 0.008f * static_cast<float>(trial);
    cfg.min_p = trial % 5 == 2 ? 0.03f : 0.0f;
    sampler host(500 + static_cast<uint64_t>(trial));
    const float u = host.peek_uniform();
    std::vector<int32_t> kept;
    const sampled_token want = host.sample(logits, cfg, &kept);
    BOOST_TEST_INFO("trial " << trial << " T " << cfg.temperature << " top-k " << cfg.top_k << " top-p "
                             << cfg.top_p << " min-p " << cfg.min_p);
    BOOST_TEST((std::find(kept.begin(), kept.end(), want.token) != kept.end()));
    for (int32_t cap : {static_cast<int32_t>(V), 4}) {
      const float temperature = cfg.temperature;
      const int32_t top_k = cfg.top_k, ask = 1;
      float lp = 0.0f;
      int32_t token = -2, count = -2;
      std::vector<int32_t> ids(static_cast<std::size_t>(cap), -2);
      rlserve::kernels::sample_args a{logits.data(), &temperature, &top_k, &cfg.top_p, &cfg.min_p, &u,
                                      &token, &lp, 1, V};
      a.want_kept = &ask;
      a.kept_ids = ids.data();
      a.kept_count = &count;
      a.kept_cap = cap;
      BOOST_REQUIRE(rlserve::kernels::sample_ref(a) == rlserve::kernels::kernel_status::ok);
      BOOST_TEST(token == want.token);
      if (static_cast<int64_t>(kept.size()) <= cap) {
        BOOST_TEST(count == static_cast<int32_t>(kept.size()));
        BOOST_TEST((std::vector<int32_t>(ids.begin(), ids.begin() + count) == kept));
        BOOST_TEST(lp == want.logprob);
      } else {
        BOOST_TEST(count == -1);
        BOOST_TEST(lp == rlserve::model::token_logprob(logits, cfg.temperature, want.token));
      }
    }
  }
}

// SGLang's penalties over generated tokens, worked by hand: frequency and presence subtract,
// then repetition divides positive logits and multiplies negative ones; min_new_tokens masks
// the stop ids until enough tokens are generated.
BOOST_AUTO_TEST_CASE(penalties_change_only_generated_tokens) {
  rlserve::model::generation_history h;
  h.add(1);
  h.add(1);
  h.add(2);
  h.add(7); // outside the vocabulary: ignored
  sampling_config cfg;
  cfg.frequency_penalty = 0.5f;
  cfg.presence_penalty = 0.25f;
  cfg.repetition_penalty = 2.0f;
  std::vector<float> logits = {1.0f, 3.0f, -1.0f, 0.5f};
  rlserve::model::apply_penalties(logits, h, cfg);
  BOOST_TEST(logits[0] == 1.0f);                         // never generated
  BOOST_TEST(logits[1] == (3.0f - 2 * 0.5f - 0.25f) / 2); // 0.875
  BOOST_TEST(logits[2] == (-1.0f - 0.5f - 0.25f) * 2);    // -3.5
  BOOST_TEST(logits[3] == 0.5f);

  sampling_config none;
  std::vector<float> same = {1.0f, 3.0f, -1.0f, 0.5f};
  rlserve::model::apply_penalties(same, h, none);
  BOOST_TEST((same == std::vector<float>{1.0f, 3.0f, -1.0f, 0.5f}));

  sampling_config min_new;
  min_new.min_new_tokens = 5;
  min_new.stop_ids = {3, 0};
  BOOST_TEST(min_new.uses_history());
  std::vector<float> masked = {1.0f, 3.0f, -1.0f, 9.0f};
  rlserve::model::apply_penalties(masked, h, min_new); // 4 generated < 5
  BOOST_TEST(std::isinf(masked[0]));
  BOOST_TEST(std::isinf(masked[3]));
  BOOST_TEST(masked[1] == 3.0f);
  h.add(0);
  std::vector<float> open = {1.0f, 3.0f, -1.0f, 9.0f};
  rlserve::model::apply_penalties(open, h, min_new); // 5 generated: stop ids allowed again
  BOOST_TEST(open[3] == 9.0f);

  // Greedy over penalized logits picks what the penalty leaves on top.
  sampler s(1);
  sampling_config greedy = cfg;
  greedy.temperature = 0.0f;
  std::vector<float> row = {2.0f, 3.0f, -1.0f, 1.0f}; // 0.625, 0.875, -3.5, 1.0 after
  rlserve::model::apply_penalties(row, h, greedy);
  BOOST_TEST(s.sample(row, greedy).token == 3);
}

BOOST_AUTO_TEST_SUITE_END()
