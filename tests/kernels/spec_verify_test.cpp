// The CPU twins of kernels/spec_verify.hpp, which the CUDA kernels are held to on the GPU machine
// (spec_verify_gpu_test.cu), against the CPU runner's own path: filtered_probs_ref equals
// model::sampler::distribution bit for bit, and spec_verify_ref, given the target's filtered rows
// and the uniforms the draw-order contract takes from the request's generator, emits the tokens,
// accepted counts and logprobs of model::verify_draft (which takes the same uniforms itself), over
// seeded random cases (greedy and sampled, every filter on and off, k = 0..6, vocab 16 to 151936).
// Then edge cases with hand-set rows and uniforms, refusals, and a chi-square test that the first
// emitted token is distributed as the target's filtered softmax computed here from the logits.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/spec_verify.hpp"
#include "model/sampler.hpp"
#include "model/speculative.hpp"

using namespace rlserve::kernels;
namespace model = rlserve::model;

namespace {

void require_ok(kernel_status s, const char* what) {
  BOOST_REQUIRE_MESSAGE(s == kernel_status::ok, what << ": " << to_string(s));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> gaussian(std::size_t n, std::mt19937_64& rng, double sigma) {
  std::normal_distribution<float> d(0.0f, static_cast<float>(sigma));
  std::vector<float> v(n);
  for (auto& x : v)
    x = d(rng);
  return v;
}

model::sampling_config random_config(std::mt19937_64& rng, bool greedy) {
  model::sampling_config c;
  auto coin = [&](int in) { return rng() % in == 0; };
  c.temperature = greedy ? 0.0f : static_cast<float>(0.3 + 1.2 * double(rng() % 1000) / 1000.0);
  if (coin(2))
    c.top_k = static_cast<int32_t>(1 + rng() % 40);
  if (coin(2))
    c.top_p = static_cast<float>(0.3 + 0.7 * double(rng() % 1000) / 1000.0);
  if (coin(3))
    c.min_p = coin(8) ? 1.5f : static_cast<float>(0.01 + 0.2 * double(rng() % 1000) / 1000.0);
  return c;
}

// filtered_probs_ref over `rows` rows that all use `c`.
std::vector<float> twin_probs(const std::vector<float>& logits, int64_t rows, int64_t V, const model::sampling_config& c) {
  std::vector<float> t(rows, c.temperature), tp(rows, c.top_p), mp(rows, c.min_p), out(logits.size());
  std::vector<int32_t> tk(rows, c.top_k);
  require_ok(filtered_probs_ref({logits.data(), t.data(), tk.data(), tp.data(), mp.data(), out.data(), rows, V}),
             "filtered_probs_ref");
  return out;
}

// One sequence of a verification case: what the CPU runner's verify() is given.
struct sequence_case {
  model::sampling_config cfg;
  uint64_t seed = 0;                // the target request's generator
  std::vector<float> target_logits; // [k + 1, V]
  std::vector<float> draft_probs;   // [k, V] (sampler::distribution of the draft's logits)
  std::vector<int32_t> draft_tokens;
};

// A draft that agrees with the target often: its logits are the target's plus noise, its tokens
// drawn from its own distribution (argmax when greedy); now and then a token the draft could not
// have drawn (q = 0) or one outside the vocabulary.
sequence_case random_sequence(std::mt19937_64& rng, int64_t V, int64_t k, bool greedy) {
  sequence_case sc;
  sc.cfg = random_config(rng, greedy);
  sc.seed = rng();
  sc.target_logits = gaussian(static_cast<std::size_t>((k + 1) * V), rng, 3.0);
  if (rng() % 7 == 0) // NaN counts as -inf everywhere
    sc.target_logits[rng() % sc.target_logits.size()] = NAN;
  model::sampler draft(rng());
  const double noise = rng() % 3 == 0 ? 3.0 : 0.3;
  auto eps = gaussian(static_cast<std::size_t>(k * V), rng, noise);
  std::vector<float> probs;
  for (int64_t i = 0; i < k; ++i) {
    std::vector<float> dl(sc.target_logits.begin() + i * V, sc.target_logits.begin() + (i + 1) * V);
    for (int64_t j = 0; j < V; ++j)
      dl[j] += eps[i * V + j];
    draft.distribution(dl, sc.cfg, probs);
    int32_t d = draft.draw(probs);
    if (rng() % 13 == 0)
      d = static_cast<int32_t>(rng() % V); // maybe q(d) = 0
    if (rng() % 41 == 0)
      d = rng() % 2 ? -1 : static_cast<int32_t>(V);
    sc.draft_tokens.push_back(d);
    if (!greedy)
      sc.draft_probs.insert(sc.draft_probs.end(), probs.begin(), probs.end());
  }
  if (greedy) // the twin reads no q rows when greedy; verify_draft ignores them
    sc.draft_probs.assign(static_cast<std::size_t>(k * V), 0.0f);
  return sc;
}

struct twin_out {
  std::vector<int32_t> accepted, token;
  std::vector<float> logprob;
  std::vector<int32_t> offset;
};

// spec_verify_ref over all cases as one flat batch: p from filtered_probs_ref, uniforms from each
// request's generator in the contract's order (k + 1 when sampling, none when greedy).
twin_out run_twin(const std::vector<sequence_case>& cases, int64_t V) {
  twin_out o;
  std::vector<float> p, q, logits, temp, uni;
  std::vector<int32_t> tokens;
  o.offset.push_back(0);
  for (const auto& sc : cases) {
    const auto k = static_cast<int64_t>(sc.draft_tokens.size());
    auto rows = twin_probs(sc.target_logits, k + 1, V, sc.cfg);
    p.insert(p.end(), rows.begin(), rows.end());
    q.insert(q.end(), sc.draft_probs.begin(), sc.draft_probs.end());
    logits.insert(logits.end(), sc.target_logits.begin(), sc.target_logits.end());
    tokens.insert(tokens.end(), sc.draft_tokens.begin(), sc.draft_tokens.end());
    temp.push_back(sc.cfg.temperature);
    model::sampler gen(sc.seed);
    for (int64_t j = 0; j <= k; ++j)
      uni.push_back(model::is_greedy(sc.cfg) ? 0.5f : gen.uniform());
    o.offset.push_back(static_cast<int32_t>(tokens.size()));
  }
  const auto S = static_cast<int64_t>(cases.size()), D = static_cast<int64_t>(tokens.size());
  o.accepted.assign(S, -7);
  o.token.assign(D + S, -7);
  o.logprob.assign(D + S, 7.0f);
  spec_verify_args a{p.data(), q.data(), logits.data(), temp.data(), o.offset.data(), tokens.data(), uni.data(),
                     o.accepted.data(), o.token.data(), o.logprob.data(), S, D, V};
  require_ok(spec_verify_ref(a), "spec_verify_ref");
  return o;
}

// Twin against verify_draft for every case: accepted, emitted tokens, logprobs (same bits), the
// rows after the emitted ones (-1, -inf), and the generator advanced by exactly the contract's count.
void check_against_verify_draft(const std::vector<sequence_case>& cases, int64_t V, int& total_accepted) {
  const auto t = run_twin(cases, V);
  for (std::size_t s = 0; s < cases.size(); ++s) {
    const auto& sc = cases[s];
    const auto k = static_cast<int64_t>(sc.draft_tokens.size());
    model::sampler target(sc.seed);
    const auto v = model::verify_draft(target, sc.cfg, sc.target_logits, V, sc.draft_tokens, sc.draft_probs);
    const int64_t row0 = t.offset[s] + static_cast<int64_t>(s);
    BOOST_TEST_CONTEXT("case " << s << " k " << k << " T " << sc.cfg.temperature << " top_k " << sc.cfg.top_k
                               << " top_p " << sc.cfg.top_p << " min_p " << sc.cfg.min_p) {
      BOOST_REQUIRE_EQUAL(t.accepted[s], v.accepted);
      for (int64_t j = 0; j <= k; ++j) {
        if (j <= v.accepted) {
          BOOST_TEST(t.token[row0 + j] == v.tokens[j]);
          BOOST_TEST(std::memcmp(&t.logprob[row0 + j], &v.logprobs[j], sizeof(float)) == 0,
                     "logprob " << t.logprob[row0 + j] << " vs " << v.logprobs[j]);
        } else {
          BOOST_TEST(t.token[row0 + j] == -1);
          BOOST_TEST(t.logprob[row0 + j] == -INFINITY);
        }
      }
      model::sampler after(sc.seed); // the contract: k + 1 uniforms when sampling, none when greedy
      for (int64_t j = 0; !model::is_greedy(sc.cfg) && j <= k; ++j)
        after.uniform();
      BOOST_TEST(target.uniform() == after.uniform());
    }
    total_accepted += v.accepted;
  }
}

// p = softmax(logits / T) over the `top_k` largest logits, zeros elsewhere, in plain double math
// (no engine code): what the first emitted token must follow.
std::vector<double> top_k_softmax(const float* logits, int V, int top_k, double T) {
  std::vector<int> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> p(V, 0.0);
  double z = 0;
  for (int i = 0; i < top_k; ++i)
    z += std::exp(logits[ids[i]] / T);
  for (int i = 0; i < top_k; ++i)
    p[ids[i]] = std::exp(logits[ids[i]] / T) / z;
  return p;
}

} // namespace

BOOST_AUTO_TEST_SUITE(spec_verify_test)

BOOST_AUTO_TEST_CASE(filtered_probs_twin_is_the_samplers_distribution) {
  std::mt19937_64 rng(11);
  model::sampler s(0);
  std::vector<float> want;
  int rows_checked = 0;
  for (int64_t V : {16, 1000, 151936}) {
    const int cases = V > 100000 ? 10 : 200;
    for (int c = 0; c < cases; ++c) {
      const bool greedy = c % 6 == 0;
      auto cfg = random_config(rng, greedy);
      if (c % 10 == 3) // a filter wide enough for the sampler's fallback path on the GPU
        cfg.top_p = 0.9999f;
      auto logits = gaussian(static_cast<std::size_t>(V), rng, c % 4 == 1 ? 0.05 : 3.0);
      if (c % 5 == 2)
        for (int n = 0; n < 3; ++n)
          logits[rng() % V] = n == 0 ? NAN : -INFINITY;
      const auto got = twin_probs(logits, 1, V, cfg);
      s.distribution(logits, cfg, want);
      BOOST_TEST_CONTEXT("V " << V << " case " << c) { BOOST_TEST(same_bits(got, want)); }
      ++rows_checked;
    }
  }
  // No finite logit: one-hot at 0, as the CPU; a padding row (temperature < 0): zeros.
  std::vector<float> dead(16, -INFINITY);
  model::sampling_config cfg;
  s.distribution(dead, cfg, want);
  BOOST_TEST(same_bits(twin_probs(dead, 1, 16, cfg), want));
  BOOST_TEST(want[0] == 1.0f);
  cfg.temperature = -1.0f;
  BOOST_TEST(twin_probs(dead, 1, 16, cfg) == std::vector<float>(16, 0.0f));
  BOOST_TEST_MESSAGE("filtered_probs: " << rows_checked << " rows equal to sampler::distribution");
}

BOOST_AUTO_TEST_CASE(spec_verify_twin_is_verify_draft) {
  std::mt19937_64 rng(12);
  int total_accepted = 0, total_proposed = 0;
  for (int64_t V : {16, 1000}) {
    for (int batch = 0; batch < 20; ++batch) {
      std::vector<sequence_case> cases;
      for (int s = 0; s < 16; ++s) {
        const int64_t k = static_cast<int64_t>(rng() % 7); // 0..6
        cases.push_back(random_sequence(rng, V, k, s % 4 == 0));
        total_proposed += static_cast<int>(k);
      }
      check_against_verify_draft(cases, V, total_accepted);
    }
  }
  BOOST_TEST_MESSAGE("spec_verify: " << total_accepted << " of " << total_proposed << " proposals accepted");
  BOOST_TEST(total_accepted > total_proposed / 5); // the cases do exercise acceptance
  BOOST_TEST(total_accepted < total_proposed);     // and rejection
}

BOOST_AUTO_TEST_CASE(spec_verify_twin_is_verify_draft_at_qwen3_vocab) {
  std::mt19937_64 rng(13);
  constexpr int64_t V = 151936;
  std::vector<sequence_case> cases;
  for (int s = 0; s < 6; ++s)
    cases.push_back(random_sequence(rng, V, 1 + s, s == 0));
  int accepted = 0;
  check_against_verify_draft(cases, V, accepted);
  BOOST_TEST_MESSAGE("spec_verify at V " << V << ": " << accepted << " of 21 accepted");
}

// Hand-set rows and uniforms: one sequence, p and q given directly.
struct hand_case {
  std::vector<float> p, q, logits; // [k + 1, V], [k, V], [k + 1, V]
  std::vector<int32_t> tokens;
  std::vector<float> uniform;      // k + 1
  float temperature = 1.0f;
  int32_t accepted = -7;
  std::vector<int32_t> out_tokens;
  std::vector<float> out_logprobs;
  void run(int64_t V) {
    const auto k = static_cast<int32_t>(tokens.size());
    std::vector<int32_t> off{0, k}, acc(1);
    out_tokens.assign(k + 1, -7);
    out_logprobs.assign(k + 1, 7.0f);
    if (logits.empty())
      for (float x : p)
        logits.push_back(x > 0 ? std::log(x) : -INFINITY);
    spec_verify_args a{p.data(), q.data(), logits.data(), &temperature, off.data(), tokens.data(), uniform.data(),
                       acc.data(), out_tokens.data(), out_logprobs.data(), 1, k, V};
    require_ok(spec_verify_ref(a), "spec_verify_ref");
    accepted = acc[0];
  }
};

BOOST_AUTO_TEST_CASE(edge_cases) {
  constexpr int64_t V = 4;
  // All kept (q == p): the bonus comes from the last row with the final uniform: 0.5 of
  // [0.1, 0.2, 0.3, 0.4] falls in id 2's span (0.3, 0.6].
  {
    hand_case h;
    const std::vector<float> row{0.1f, 0.2f, 0.3f, 0.4f};
    for (int r = 0; r < 3; ++r)
      h.p.insert(h.p.end(), row.begin(), row.end());
    h.q.assign(h.p.begin(), h.p.begin() + 2 * V);
    h.tokens = {3, 0};
    h.uniform = {0.999f, 0.999f, 0.5f};
    h.run(V);
    BOOST_TEST(h.accepted == 2);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{3, 0, 2}));
    BOOST_TEST(h.out_logprobs[2] == std::log(0.3f), boost::test_tools::tolerance(1e-6f));
  }
  // First rejected (p(d) = 0.1 < u * q(d) = 0.5 * 0.7): the correction is drawn from
  // max(0, p - q) = [0, 0.1, 0.3, 0] / 0.4 with the final uniform, not the next acceptance one.
  {
    hand_case h;
    h.p = {0.1f, 0.3f, 0.4f, 0.2f, 0.25f, 0.25f, 0.25f, 0.25f};
    h.q = {0.7f, 0.2f, 0.1f, 0.2f};
    h.tokens = {0};
    h.uniform = {0.5f, 0.2f}; // 0.2 * 0.4 = 0.08 < 0.1: id 1
    h.run(V);
    BOOST_TEST(h.accepted == 0);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{1, -1}));
    h.uniform = {0.5f, 0.3f}; // 0.12 >= 0.1: id 2
    h.run(V);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{2, -1}));
    BOOST_TEST(h.out_logprobs[1] == -INFINITY);
  }
  // q(d) = 0: p alone decides, accept iff u < p(d).
  {
    hand_case h;
    h.p = {0.0f, 0.75f, 0.25f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
    h.q = {1.0f, 0.0f, 0.0f, 0.0f};
    h.tokens = {1};
    h.uniform = {0.7f, 0.0f};
    h.run(V);
    BOOST_TEST(h.accepted == 1);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{1, 0})); // bonus at u = 0: the first positive id
    h.uniform = {0.8f, 0.0f};
    h.run(V);
    BOOST_TEST(h.accepted == 0);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{1, -1})); // residual = [0, .75, .25, 0]: id 1
  }
  // Residual all zero (p <= q everywhere, d outside p's support): the correction comes from p.
  {
    hand_case h;
    h.p = {0.5f, 0.5f, 0.0f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
    h.q = {0.5f, 0.5f, 0.0f, 0.0f};
    h.tokens = {2};
    h.uniform = {0.1f, 0.7f};
    h.run(V);
    BOOST_TEST(h.accepted == 0);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{1, -1}));
    // verify_draft agrees, with logits whose softmax is p and the same generator draws
    model::sampling_config cfg;
    std::vector<float> logits;
    for (float x : h.p)
      logits.push_back(x > 0 ? std::log(x) : -INFINITY);
    for (uint64_t seed = 0; seed < 200; ++seed) {
      model::sampler gen(seed);
      h.uniform = {gen.uniform(), gen.uniform()};
      h.logits = logits;
      h.run(V);
      model::sampler target(seed);
      const auto v = model::verify_draft(target, cfg, logits, V, h.tokens, h.q);
      BOOST_REQUIRE(v.accepted == h.accepted);
      BOOST_REQUIRE(v.tokens[0] == h.out_tokens[0]);
    }
  }
  // Proposals outside the vocabulary are rejected (p = q = 0 there).
  {
    hand_case h;
    h.p = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
    h.q = {0.25f, 0.25f, 0.25f, 0.25f};
    for (int32_t d : {-1, 4}) {
      h.tokens = {d};
      h.uniform = {0.0f, 0.0f};
      h.run(V);
      BOOST_TEST(h.accepted == 0);
      BOOST_TEST(h.out_tokens[0] == 0);
    }
  }
  // Greedy: the first mismatch is replaced by the argmax (first maximum); uniforms are not read.
  {
    hand_case h;
    h.temperature = 0.0f;
    h.p = {0, 1, 0, 0, 0, 0, 1, 0, 0.5f, 0, 0, 0.5f};
    h.q.assign(2 * V, 0.0f);
    h.tokens = {1, 3};
    h.uniform = {NAN, NAN, NAN};
    h.run(V);
    BOOST_TEST(h.accepted == 1);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{1, 2, -1}));
    h.tokens = {1, 2};
    h.run(V);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{1, 2, 0})); // bonus: tie -> lowest id
  }
  // NaN logits are -inf: the emitted token's logprob is the one of the row with -inf there.
  {
    hand_case h;
    h.p = {0.5f, 0.5f, 0.0f, 0.0f};
    h.logits = {1.0f, 1.0f, NAN, -INFINITY};
    h.uniform = {0.9f};
    h.run(V);
    BOOST_TEST(h.out_tokens[0] == 1);
    BOOST_TEST(h.out_logprobs[0] == std::log(0.5f), boost::test_tools::tolerance(1e-6f));
  }
  // A padding sequence (temperature < 0) emits nothing.
  {
    hand_case h;
    h.temperature = -1.0f;
    h.p.assign(2 * V, 0.25f);
    h.q.assign(V, 0.25f);
    h.tokens = {1};
    h.uniform = {0.0f, 0.0f};
    h.run(V);
    BOOST_TEST(h.accepted == -1);
    BOOST_TEST(h.out_tokens == (std::vector<int32_t>{-1, -1}));
    BOOST_TEST(h.out_logprobs[0] == -INFINITY);
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_refused) {
  std::vector<float> f(64, 0.25f), out(64);
  std::vector<int32_t> i32(16, 0);
  const float t = 1.0f;
  filtered_probs_args fp{f.data(), &t, i32.data(), f.data(), f.data(), out.data(), 1, 16};
  BOOST_TEST((filtered_probs_can_implement(fp) == kernel_status::ok));
  auto bad = fp;
  bad.vocab = 0;
  BOOST_TEST((filtered_probs_ref(bad) == kernel_status::invalid_problem));
  bad = fp;
  bad.logits = nullptr;
  BOOST_TEST((filtered_probs_can_implement(bad) == kernel_status::invalid_problem));
  bad = fp;
  bad.rows = -1;
  BOOST_TEST((filtered_probs_can_implement(bad) == kernel_status::invalid_problem));

  std::vector<int32_t> off{0, 1, 3}, acc(2), tok(5);
  std::vector<float> lp(5);
  spec_verify_args sv{f.data(), f.data(), f.data(), f.data(), off.data(), i32.data(), f.data(),
                      acc.data(), tok.data(), lp.data(), 2, 3, 4};
  require_ok(spec_verify_ref(sv), "a good layout");
  auto b = sv;
  b.max_draft = k_spec_verify_max_draft + 1;
  BOOST_TEST((spec_verify_can_implement(b) == kernel_status::invalid_problem));
  b = sv;
  b.vocab = 0;
  BOOST_TEST((spec_verify_can_implement(b) == kernel_status::invalid_problem));
  b = sv;
  b.draft_probs = nullptr;
  BOOST_TEST((spec_verify_can_implement(b) == kernel_status::invalid_problem));
  b = sv;
  b.uniform = nullptr;
  BOOST_TEST((spec_verify_can_implement(b) == kernel_status::invalid_problem));
  b = sv;
  b.drafts = 17; // more than sequences * max_draft
  BOOST_TEST((spec_verify_can_implement(b) == kernel_status::invalid_problem));
  // Layouts only the twin can read: a first offset not 0, a last one not `drafts`, a sequence
  // with more than max_draft proposals, offsets going back.
  for (auto o : {std::vector<int32_t>{1, 1, 3}, std::vector<int32_t>{0, 1, 2}, std::vector<int32_t>{0, 3, 3},
                 std::vector<int32_t>{0, 2, 1}}) {
    b = sv;
    b.draft_offset = o.data();
    if (o == std::vector<int32_t>{0, 3, 3})
      b.max_draft = 2;
    if (o == std::vector<int32_t>{0, 2, 1})
      b.drafts = 1;
    BOOST_TEST((spec_verify_ref(b) == kernel_status::invalid_problem));
  }
  BOOST_TEST(to_string(kernel_status::invalid_problem) == "invalid problem");
}

// The first emitted token of every sequence is distributed as the target's filtered softmax,
// whatever the draft: p here is plain double math from the logits (temperature 0.8, top-k 6), the
// draft's q is the twin's filtered_probs of other logits, its proposals drawn from q by the test's
// own generator, the uniforms too. Pearson's chi-square, 5 degrees of freedom at p = 0.001.
BOOST_AUTO_TEST_CASE(first_emitted_token_follows_the_target) {
  constexpr int V = 10, k = 3, S = 40000, top_k = 6;
  constexpr double T = 0.8;
  const std::vector<float> target_row{2.0f, 1.5f, 1.4f, 0.2f, -0.5f, 0.9f, -2.0f, 0.0f, 1.0f, -1.0f};
  const std::vector<float> draft_row{0.5f, 2.5f, 0.3f, 1.2f, -0.5f, 0.0f, 1.1f, 0.4f, -0.2f, 0.8f};
  model::sampling_config cfg;
  cfg.temperature = static_cast<float>(T);
  cfg.top_k = top_k;
  const auto want = top_k_softmax(target_row.data(), V, top_k, T);
  std::vector<float> draft_logits;
  for (int i = 0; i < k; ++i)
    draft_logits.insert(draft_logits.end(), draft_row.begin(), draft_row.end());
  const auto q_row = twin_probs(draft_logits, k, V, cfg); // top-6 of the draft: a different support
  std::vector<float> target_logits;
  for (int i = 0; i <= k; ++i)
    target_logits.insert(target_logits.end(), target_row.begin(), target_row.end());
  const auto p_rows = twin_probs(target_logits, k + 1, V, cfg);

  std::mt19937_64 rng(14);
  std::uniform_int_distribution<uint32_t> bits(0, (1u << 24) - 1);
  std::discrete_distribution<int> draft_draw(q_row.begin(), q_row.begin() + V);
  std::vector<float> p, q, logits, temp(S, cfg.temperature), uni;
  std::vector<int32_t> off{0}, tokens;
  for (int s = 0; s < S; ++s) {
    p.insert(p.end(), p_rows.begin(), p_rows.end());
    q.insert(q.end(), q_row.begin(), q_row.end());
    logits.insert(logits.end(), target_logits.begin(), target_logits.end());
    for (int i = 0; i < k; ++i)
      tokens.push_back(draft_draw(rng));
    for (int i = 0; i <= k; ++i)
      uni.push_back(static_cast<float>(bits(rng)) * 0x1.0p-24f);
    off.push_back(static_cast<int32_t>(tokens.size()));
  }
  std::vector<int32_t> acc(S), tok(tokens.size() + S);
  std::vector<float> lp(tok.size());
  require_ok(spec_verify_ref({p.data(), q.data(), logits.data(), temp.data(), off.data(), tokens.data(), uni.data(),
                              acc.data(), tok.data(), lp.data(), S, static_cast<int64_t>(tokens.size()), V}),
             "spec_verify_ref");
  std::vector<int> counts(V, 0);
  int64_t accepted = 0;
  for (int s = 0; s < S; ++s) {
    ++counts[tok[off[s] + s]];
    accepted += acc[s];
  }
  double chi2 = 0;
  for (int t = 0; t < V; ++t) {
    if (want[t] == 0) {
      BOOST_TEST(counts[t] == 0, "token " << t << " is outside the target's top-k");
      continue;
    }
    const double e = want[t] * S;
    chi2 += (counts[t] - e) * (counts[t] - e) / e;
  }
  BOOST_TEST_MESSAGE("first token chi2 " << chi2 << " (5 dof), accepted " << accepted << " of " << S * k);
  BOOST_TEST(chi2 < 20.52); // fixed seeds: deterministic
  BOOST_TEST(accepted > 0);
}

// Rows given by pointer tables (filtered_probs' row_out, spec_verify's target_rows and
// draft_rows) are read and written where the tables point, with the results of the contiguous
// arrays: the rows here are stored in reverse order.
BOOST_AUTO_TEST_CASE(row_tables_address_rows_where_they_are) {
  std::mt19937_64 rng(31);
  const int64_t V = 1000;
  std::vector<sequence_case> cases;
  for (int s = 0; s < 8; ++s)
    cases.push_back(random_sequence(rng, V, static_cast<int64_t>(rng() % 7), s % 3 == 0));
  const auto want = run_twin(cases, V);

  // filtered_probs into reversed rows.
  const auto& sc = cases[1];
  const auto k = static_cast<int64_t>(sc.draft_tokens.size()), rows = k + 1;
  const auto contiguous = twin_probs(sc.target_logits, rows, V, sc.cfg);
  std::vector<float> t(rows, sc.cfg.temperature), tp(rows, sc.cfg.top_p), mp(rows, sc.cfg.min_p);
  std::vector<int32_t> tk(rows, sc.cfg.top_k);
  std::vector<float> reversed(contiguous.size(), -1.0f);
  std::vector<float*> out_rows;
  for (int64_t r = 0; r < rows; ++r)
    out_rows.push_back(reversed.data() + (rows - 1 - r) * V);
  filtered_probs_args fa{sc.target_logits.data(), t.data(), tk.data(), tp.data(), mp.data(), nullptr, rows, V};
  fa.row_out = out_rows.data();
  require_ok(filtered_probs_ref(fa), "filtered_probs_ref (row_out)");
  for (int64_t r = 0; r < rows; ++r)
    BOOST_TEST(std::equal(contiguous.begin() + r * V, contiguous.begin() + (r + 1) * V,
                          reversed.begin() + (rows - 1 - r) * V));

  // spec_verify with p and q rows stored in reverse, found through the tables.
  std::vector<float> p, q, logits, temp, uni;
  std::vector<int32_t> tokens, offset{0};
  for (const auto& c : cases) {
    const auto kc = static_cast<int64_t>(c.draft_tokens.size());
    auto prow = twin_probs(c.target_logits, kc + 1, V, c.cfg);
    p.insert(p.end(), prow.begin(), prow.end());
    q.insert(q.end(), c.draft_probs.begin(), c.draft_probs.end());
    logits.insert(logits.end(), c.target_logits.begin(), c.target_logits.end());
    tokens.insert(tokens.end(), c.draft_tokens.begin(), c.draft_tokens.end());
    temp.push_back(c.cfg.temperature);
    model::sampler gen(c.seed);
    for (int64_t j = 0; j <= kc; ++j)
      uni.push_back(model::is_greedy(c.cfg) ? 0.5f : gen.uniform());
    offset.push_back(static_cast<int32_t>(tokens.size()));
  }
  const auto S = static_cast<int64_t>(cases.size()), D = static_cast<int64_t>(tokens.size());
  auto reverse_rows = [V](const std::vector<float>& a, std::vector<const float*>& table, std::vector<float>& store) {
    const auto n = static_cast<int64_t>(a.size()) / V;
    store.assign(a.size(), NAN);
    table.clear();
    for (int64_t r = 0; r < n; ++r) {
      std::copy(a.begin() + r * V, a.begin() + (r + 1) * V, store.begin() + (n - 1 - r) * V);
      table.push_back(store.data() + (n - 1 - r) * V);
    }
  };
  std::vector<const float*> p_table, q_table;
  std::vector<float> p_store, q_store;
  reverse_rows(p, p_table, p_store);
  reverse_rows(q, q_table, q_store);
  twin_out got;
  got.accepted.assign(S, -7);
  got.token.assign(D + S, -7);
  got.logprob.assign(D + S, 7.0f);
  spec_verify_args a{nullptr, nullptr, logits.data(), temp.data(), offset.data(), tokens.data(), uni.data(),
                     got.accepted.data(), got.token.data(), got.logprob.data(), S, D, V};
  a.target_rows = p_table.data();
  a.draft_rows = q_table.data();
  require_ok(spec_verify_ref(a), "spec_verify_ref (row tables)");
  BOOST_TEST(got.accepted == want.accepted);
  BOOST_TEST(got.token == want.token);
  BOOST_TEST(same_bits(got.logprob, want.logprob));
}

BOOST_AUTO_TEST_SUITE_END()
