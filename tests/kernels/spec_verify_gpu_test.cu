// The CUDA twins of kernels/spec_verify.hpp against their CPU references (which
// spec_verify_test.cpp holds to model::sampler::distribution and model::verify_draft), outputs
// poisoned (0xD5) on the device before every launch:
//   filtered_probs   the same kept set but for tokens on a cut (on_a_cut below), and every
//                    probability within 1e-4 relative (+1e-12): the kernel's p is expf(z - lse)
//                    in fp32 (the GPU sampler's), the twin's a double exp rounded once; a z of
//                    magnitude 40 carries ~4e-6 of argument error. Rows of
//                    vocab 1000 and 151936, every filter, greedy, padding, NaN, and flat rows under
//                    a wide top-p (the sampler's bisection fallback).
//   spec_verify      from the same p, q and uniforms: accepted counts and tokens equal (the rule is
//                    integer and fixed point on both sides), logprobs with the twin's bits (both
//                    in double; only the sum's order differs, ~1e-9 likely per row to round
//                    apart); every output row written; padding and, on the device only, a
//                    sequence whose offsets are out of range (accepted -1).
//   the chain        filtered_probs_launch into spec_verify_launch with nothing on the host, and
//                    the same launches captured in a CUDA graph and replayed: the twin's tokens.
// Needs a GPU.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/spec_verify.hpp"
#include "tests/support/device_buffer.cuh"

using namespace rlserve::kernels;
using rlserve::test::device_buffer;

namespace {

constexpr double k_prob_rel = 1e-4, k_prob_abs = 1e-12;

void require_ok(kernel_status s, const char* what) {
  BOOST_REQUIRE_MESSAGE(s == kernel_status::ok, what << ": " << to_string(s));
}

std::vector<float> gaussian(std::size_t n, std::mt19937_64& rng, double sigma) {
  std::normal_distribution<float> d(0.0f, static_cast<float>(sigma));
  std::vector<float> v(n);
  for (auto& x : v)
    x = d(rng);
  return v;
}

// Sampling parameters per row, as the CPU test draws them.
struct row_params {
  std::vector<float> temperature, top_p, min_p;
  std::vector<int32_t> top_k;
  void push(std::mt19937_64& rng, bool greedy) {
    auto coin = [&](int in) { return rng() % in == 0; };
    temperature.push_back(greedy ? 0.0f : static_cast<float>(0.3 + 1.2 * double(rng() % 1000) / 1000.0));
    top_k.push_back(coin(2) ? static_cast<int32_t>(1 + rng() % 40) : 0);
    top_p.push_back(coin(2) ? static_cast<float>(0.3 + 0.7 * double(rng() % 1000) / 1000.0) : 1.0f);
    min_p.push_back(coin(3) ? (coin(8) ? 1.5f : static_cast<float>(0.01 + 0.2 * double(rng() % 1000) / 1000.0)) : 0.0f);
  }
};

// The host side of a filtered_probs problem and its twin's answer.
struct probs_problem {
  std::vector<float> logits;
  row_params rp;
  int64_t rows = 0, V = 0;
  std::vector<float> ref() const {
    std::vector<float> out(logits.size());
    require_ok(filtered_probs_ref({logits.data(), rp.temperature.data(), rp.top_k.data(), rp.top_p.data(),
                                   rp.min_p.data(), out.data(), rows, V}),
               "filtered_probs_ref");
    return out;
  }
};

// Where a kept set may differ: a token whose place is within fp32 ulps of a cut. The kernel's p
// is expf in fp32 and the twin's a double exp rounded once, so a token that sits on the top-p
// cut (the mass of the tokens more probable than it within k_cut_mass of top_p), on the min-p
// cut (p within k_cut_rel of min_p * p_max) or tied with the k-th most probable (within
// k_cut_rel) may fall either side. Any other difference is a wrong kept set.
constexpr double k_cut_mass = 1e-5, k_cut_rel = 1e-5;

bool on_a_cut(const probs_problem& pp, int64_t r, int64_t token) {
  const int64_t V = pp.V;
  const float* row = pp.logits.data() + r * V;
  const double inv_t = 1.0 / double(pp.rp.temperature[r]);
  auto z = [&](int64_t i) { return std::isnan(row[i]) ? -INFINITY : double(row[i]) * inv_t; };
  double m = -INFINITY;
  for (int64_t i = 0; i < V; ++i)
    m = std::max(m, z(i));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i)
    sum += std::exp(z(i) - m);
  std::vector<double> p(static_cast<std::size_t>(V));
  for (int64_t i = 0; i < V; ++i)
    p[i] = std::exp(z(i) - m) / sum;
  const double pt = p[token], p_max = 1.0 / sum;
  double before = 0; // the mass of the tokens more probable than `token`
  int64_t rank = 0;  // how many are
  for (int64_t i = 0; i < V; ++i)
    if (p[i] > pt) {
      before += p[i];
      ++rank;
    }
  const int32_t k = pp.rp.top_k[r];
  const float top_p = pp.rp.top_p[r], min_p = pp.rp.min_p[r];
  if (top_p < 1.0f && std::fabs(before - double(top_p)) <= k_cut_mass)
    return true;
  if (min_p > 0.0f && std::fabs(pt - double(min_p) * p_max) <= k_cut_rel * double(min_p) * p_max)
    return true;
  if (k > 0 && k < V) {
    std::vector<double> sorted = p;
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<>());
    if (std::fabs(pt - sorted[k - 1]) <= k_cut_rel * sorted[k - 1])
      return true;
  }
  BOOST_TEST_MESSAGE("row " << r << " token " << token << ": p " << pt << ", rank " << rank << ", mass before "
                            << before << "; T " << pp.rp.temperature[r] << " top_k " << k << " top_p " << top_p
                            << " min_p " << min_p);
  return false;
}

// Compares GPU rows with the twin's: kept sets (a difference only on a cut) and entries outside the
// tolerance.
void compare_probs(const std::vector<float>& got, const std::vector<float>& want, const probs_problem& pp,
                   const char* what) {
  const int64_t V = pp.V;
  int64_t support = 0, on_cuts = 0, off = 0, finite = 0;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    finite += std::isfinite(got[i]) ? 0 : 1;
    if ((got[i] > 0) != (want[i] > 0)) {
      const auto r = static_cast<int64_t>(i) / V;
      if (on_a_cut(pp, r, static_cast<int64_t>(i) % V))
        ++on_cuts;
      else
        ++support;
      continue;
    }
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (d > k_prob_rel * want[i] + k_prob_abs)
      ++off;
    if (want[i] > 0)
      worst = std::max(worst, d / want[i]);
  }
  BOOST_TEST_MESSAGE(what << ": " << want.size() / V << " rows, worst relative difference " << worst << ", "
                          << on_cuts << " tokens on a cut kept on one side only");
  BOOST_TEST(finite == 0);
  BOOST_TEST(support == 0);
  BOOST_TEST(off == 0);
}

// A batch of sequences: target logits and p rows, draft q rows, proposals, uniforms.
struct verify_problem {
  int64_t S = 0, D = 0, V = 0;
  std::vector<float> target_logits, p, q, temperature, uniform;
  std::vector<int32_t> offset{0}, tokens;
  row_params target_params; // one row per target row (the sequence's parameters repeated)
};

verify_problem make_verify_problem(std::mt19937_64& rng, int64_t S, int64_t V) {
  verify_problem vp;
  vp.S = S;
  vp.V = V;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t k = static_cast<int64_t>(rng() % (k_spec_verify_max_draft + 1));
    row_params one;
    one.push(rng, s % 4 == 0);
    if (s == S - 1)
      one.temperature[0] = -1.0f; // padding
    auto logits = gaussian(static_cast<std::size_t>((k + 1) * V), rng, 3.0);
    if (rng() % 5 == 0)
      logits[rng() % logits.size()] = NAN;
    // The draft: the target's logits plus noise, its q rows by the twin, proposals drawn from q.
    auto draft_logits = logits;
    const double noise = rng() % 3 == 0 ? 3.0 : 0.3;
    auto eps = gaussian(draft_logits.size(), rng, noise);
    for (std::size_t i = 0; i < draft_logits.size(); ++i)
      draft_logits[i] += eps[i];
    probs_problem pp;
    pp.rows = k + 1;
    pp.V = V;
    pp.logits = logits;
    for (int64_t j = 0; j <= k; ++j) {
      pp.rp.temperature.push_back(one.temperature[0]);
      pp.rp.top_k.push_back(one.top_k[0]);
      pp.rp.top_p.push_back(one.top_p[0]);
      pp.rp.min_p.push_back(one.min_p[0]);
    }
    const auto p_rows = pp.ref();
    pp.logits = draft_logits;
    auto q_rows = pp.ref(); // k + 1 rows; the last is not used
    if (one.temperature[0] < 0)
      std::fill(q_rows.begin(), q_rows.end(), 1.0f / static_cast<float>(V));
    for (int64_t i = 0; i < k; ++i) {
      std::discrete_distribution<int> draw(q_rows.begin() + i * V, q_rows.begin() + (i + 1) * V);
      int32_t d = draw(rng);
      if (rng() % 13 == 0)
        d = static_cast<int32_t>(rng() % V);
      if (rng() % 41 == 0)
        d = -1;
      vp.tokens.push_back(d);
    }
    vp.target_logits.insert(vp.target_logits.end(), logits.begin(), logits.end());
    vp.p.insert(vp.p.end(), p_rows.begin(), p_rows.end());
    vp.q.insert(vp.q.end(), q_rows.begin(), q_rows.begin() + k * V);
    vp.temperature.push_back(one.temperature[0]);
    for (int64_t j = 0; j <= k; ++j) {
      vp.uniform.push_back(static_cast<float>(rng() >> 40) * 0x1.0p-24f);
      vp.target_params.temperature.push_back(one.temperature[0]);
      vp.target_params.top_k.push_back(one.top_k[0]);
      vp.target_params.top_p.push_back(one.top_p[0]);
      vp.target_params.min_p.push_back(one.min_p[0]);
    }
    vp.offset.push_back(static_cast<int32_t>(vp.tokens.size()));
  }
  vp.D = static_cast<int64_t>(vp.tokens.size());
  return vp;
}

struct verify_out {
  std::vector<int32_t> accepted, token;
  std::vector<float> logprob;
};

verify_out twin_verify(const verify_problem& vp) {
  verify_out o{std::vector<int32_t>(vp.S), std::vector<int32_t>(vp.D + vp.S), std::vector<float>(vp.D + vp.S)};
  require_ok(spec_verify_ref({vp.p.data(), vp.q.data(), vp.target_logits.data(), vp.temperature.data(),
                              vp.offset.data(), vp.tokens.data(), vp.uniform.data(), o.accepted.data(),
                              o.token.data(), o.logprob.data(), vp.S, vp.D, vp.V}),
           "spec_verify_ref");
  return o;
}

void compare_verify(const verify_out& got, const verify_out& want, const char* what) {
  BOOST_TEST(got.accepted == want.accepted);
  BOOST_TEST(got.token == want.token);
  double worst = 0;
  int64_t bad = 0;
  for (std::size_t i = 0; i < want.logprob.size(); ++i) {
    if (want.logprob[i] == -INFINITY) {
      bad += got.logprob[i] == -INFINITY ? 0 : 1;
      continue;
    }
    const double d = std::fabs(double(got.logprob[i]) - double(want.logprob[i]));
    bad += d == 0.0 ? 0 : 1; // NaN (poison) fails too
    worst = std::max(worst, d);
  }
  int64_t accepted = 0;
  for (int32_t a : want.accepted)
    accepted += std::max(a, 0);
  BOOST_TEST_MESSAGE(what << ": " << want.accepted.size() << " sequences, " << accepted
                          << " proposals accepted; worst logprob difference " << worst);
  BOOST_TEST(bad == 0);
}

// Device copies of a verify_problem; outputs poisoned.
struct device_verify {
  device_buffer<float> p, q, logits, temperature, uniform, logprob;
  device_buffer<int32_t> offset, tokens, accepted, token;
  explicit device_verify(const verify_problem& vp)
      : p(vp.p), q(std::max<std::size_t>(vp.q.size(), 1)), logits(vp.target_logits), temperature(vp.temperature),
        uniform(vp.uniform), logprob(static_cast<std::size_t>(vp.D + vp.S)), offset(vp.offset),
        tokens(std::max<std::size_t>(vp.tokens.size(), 1)), accepted(static_cast<std::size_t>(vp.S)),
        token(static_cast<std::size_t>(vp.D + vp.S)) {
    if (!vp.q.empty()) {
      q.upload(vp.q);
      tokens.upload(vp.tokens);
    }
  }
  spec_verify_args args(const verify_problem& vp, const float* target_probs) {
    return {target_probs, q.get(), logits.get(), temperature.get(), offset.get(), tokens.get(), uniform.get(),
            accepted.get(), token.get(), logprob.get(), vp.S, vp.D, vp.V};
  }
  verify_out download() { return {accepted.download(), token.download(), logprob.download()}; }
  void poison() {
    accepted.poison();
    token.poison();
    logprob.poison();
  }
};

} // namespace

BOOST_AUTO_TEST_SUITE(spec_verify_gpu_test)

BOOST_AUTO_TEST_CASE(filtered_probs_matches_the_twin) {
  rlserve::test::require_device();
  std::mt19937_64 rng(21);
  for (int64_t V : {1000, 151936}) {
    probs_problem pp;
    pp.V = V;
    pp.rows = V > 100000 ? 24 : 96;
    for (int64_t r = 0; r < pp.rows; ++r) {
      pp.rp.push(rng, r % 6 == 0);
      auto row = gaussian(static_cast<std::size_t>(V), rng, r % 4 == 1 ? 0.05 : 3.0);
      if (r % 10 == 3) { // flat and wide: more than 8192 candidates at the large vocab (fallback)
        pp.rp.top_p.back() = 0.9999f;
        pp.rp.top_k.back() = 0;
      }
      if (r % 5 == 2)
        for (int n = 0; n < 3; ++n)
          row[rng() % V] = n == 0 ? NAN : -INFINITY;
      pp.logits.insert(pp.logits.end(), row.begin(), row.end());
    }
    pp.rp.temperature.back() = -1.0f; // padding: zeros
    const auto want = pp.ref();
    device_buffer<float> dl(pp.logits), dt(pp.rp.temperature), dp(pp.rp.top_p), dm(pp.rp.min_p),
      out(pp.logits.size());
    device_buffer<int32_t> dk(pp.rp.top_k);
    require_ok(filtered_probs_launch({dl.get(), dt.get(), dk.get(), dp.get(), dm.get(), out.get(), pp.rows, V}, nullptr),
               "filtered_probs_launch");
    compare_probs(out.download(), want, pp, V > 100000 ? "filtered_probs V 151936" : "filtered_probs V 1000");
  }
}

BOOST_AUTO_TEST_CASE(spec_verify_matches_the_twin) {
  rlserve::test::require_device();
  std::mt19937_64 rng(22);
  for (int64_t V : {1000, 151936}) {
    const auto vp = make_verify_problem(rng, V > 100000 ? 12 : 64, V);
    const auto want = twin_verify(vp);
    device_verify dv(vp);
    require_ok(spec_verify_launch(dv.args(vp, dv.p.get()), nullptr), "spec_verify_launch");
    compare_verify(dv.download(), want, V > 100000 ? "spec_verify V 151936" : "spec_verify V 1000");
  }
}

BOOST_AUTO_TEST_CASE(a_sequence_out_of_range_is_marked_on_the_device) {
  rlserve::test::require_device();
  std::mt19937_64 rng(23);
  auto vp = make_verify_problem(rng, 4, 1000);
  vp.temperature[3] = 1.0f; // not padding
  const auto want = twin_verify(vp);
  auto bad = vp;
  bad.offset[3] = bad.offset[2] + static_cast<int32_t>(k_spec_verify_max_draft) + 1; // k_2 > max_draft
  bad.offset[4] = static_cast<int32_t>(bad.D) + 1;                                   // past the drafts
  device_verify dv(bad);
  require_ok(spec_verify_launch(dv.args(bad, dv.p.get()), nullptr), "spec_verify_launch");
  const auto got = dv.download();
  BOOST_TEST(got.accepted[2] == -1);
  BOOST_TEST(got.accepted[3] == -1);
  BOOST_TEST(got.accepted[0] == want.accepted[0]); // the others are untouched by their neighbours
  BOOST_TEST(got.accepted[1] == want.accepted[1]);
}

BOOST_AUTO_TEST_CASE(the_chain_stays_on_the_device_and_replays_in_a_graph) {
  rlserve::test::require_device();
  std::mt19937_64 rng(24);
  const int64_t V = 151936;
  const auto vp = make_verify_problem(rng, 8, V);
  const auto want = twin_verify(vp);
  const auto rows = vp.D + vp.S;
  device_verify dv(vp);
  device_buffer<float> p_dev(static_cast<std::size_t>(rows * V));
  device_buffer<float> tp(vp.target_params.top_p), mp(vp.target_params.min_p), tt(vp.target_params.temperature);
  device_buffer<int32_t> tk(vp.target_params.top_k);
  const filtered_probs_args fa{dv.logits.get(), tt.get(), tk.get(), tp.get(), mp.get(), p_dev.get(), rows, V};
  const auto va = dv.args(vp, p_dev.get());

  cudaStream_t stream;
  BOOST_REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  require_ok(filtered_probs_launch(fa, stream), "filtered_probs_launch");
  require_ok(spec_verify_launch(va, stream), "spec_verify_launch");
  BOOST_REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  // p within tolerance of the twin's; the tokens then equal unless an acceptance test falls
  // within those ulps (~1e-6 a proposal).
  probs_problem target{vp.target_logits, vp.target_params, rows, V};
  compare_probs(p_dev.download(), vp.p, target, "chain: filtered_probs");
  compare_verify(dv.download(), want, "chain: spec_verify");

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  p_dev.poison();
  dv.poison();
  BOOST_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  require_ok(filtered_probs_launch(fa, stream), "filtered_probs_launch (capture)");
  require_ok(spec_verify_launch(va, stream), "spec_verify_launch (capture)");
  BOOST_REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  BOOST_REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    dv.poison();
    BOOST_REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    BOOST_REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    compare_verify(dv.download(), want, "chain: graph replay");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Pointer tables on the device: filtered_probs writes each row where row_out points, and
// spec_verify reads p and q rows through target_rows and draft_rows; the results are those of
// the contiguous arrays bit for bit (same kernels, same inputs). Rows are stored in reverse.
BOOST_AUTO_TEST_CASE(row_tables_address_rows_where_they_are) {
  rlserve::test::require_device();
  std::mt19937_64 rng(25);
  const int64_t V = 151936;
  const auto vp = make_verify_problem(rng, 6, V);
  const auto rows = vp.D + vp.S;
  device_verify dv(vp);
  device_buffer<float> tp(vp.target_params.top_p), mp(vp.target_params.min_p), tt(vp.target_params.temperature);
  device_buffer<int32_t> tk(vp.target_params.top_k);
  device_buffer<float> p_flat(static_cast<std::size_t>(rows * V)), p_rev(static_cast<std::size_t>(rows * V));
  std::vector<float*> out_table;
  std::vector<const float*> p_table;
  for (int64_t r = 0; r < rows; ++r) {
    out_table.push_back(p_rev.get() + (rows - 1 - r) * V);
    p_table.push_back(p_rev.get() + (rows - 1 - r) * V);
  }
  device_buffer<float*> out_table_dev(out_table);
  device_buffer<const float*> p_table_dev(p_table);
  filtered_probs_args fa{dv.logits.get(), tt.get(), tk.get(), tp.get(), mp.get(), p_flat.get(), rows, V};
  require_ok(filtered_probs_launch(fa, nullptr), "filtered_probs_launch");
  fa.probs = nullptr;
  fa.row_out = out_table_dev.get();
  require_ok(filtered_probs_launch(fa, nullptr), "filtered_probs_launch (row_out)");
  const auto flat = p_flat.download(), rev = p_rev.download();
  bool same = true;
  for (int64_t r = 0; r < rows; ++r)
    same = same && std::memcmp(flat.data() + r * V, rev.data() + (rows - 1 - r) * V, V * sizeof(float)) == 0;
  BOOST_TEST(same);

  require_ok(spec_verify_launch(dv.args(vp, p_flat.get()), nullptr), "spec_verify_launch");
  const auto want = dv.download();
  // q rows reversed too.
  std::vector<float> q_rev_host(vp.q.size());
  std::vector<const float*> q_table;
  device_buffer<float> q_rev(std::max<std::size_t>(vp.q.size(), 1));
  for (int64_t i = 0; i < vp.D; ++i)
    std::copy(vp.q.begin() + i * V, vp.q.begin() + (i + 1) * V, q_rev_host.begin() + (vp.D - 1 - i) * V);
  for (int64_t i = 0; i < vp.D; ++i)
    q_table.push_back(q_rev.get() + (vp.D - 1 - i) * V);
  if (vp.D > 0)
    q_rev.upload(q_rev_host);
  device_buffer<const float*> q_table_dev(q_table.empty() ? std::vector<const float*>{nullptr} : q_table);
  dv.poison();
  auto va = dv.args(vp, nullptr);
  va.draft_probs = nullptr;
  va.target_rows = p_table_dev.get();
  va.draft_rows = q_table_dev.get();
  require_ok(spec_verify_launch(va, nullptr), "spec_verify_launch (row tables)");
  const auto got = dv.download();
  BOOST_TEST(got.accepted == want.accepted);
  BOOST_TEST(got.token == want.token);
  BOOST_TEST(std::memcmp(got.logprob.data(), want.logprob.data(), want.logprob.size() * sizeof(float)) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
