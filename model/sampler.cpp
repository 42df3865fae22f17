#include "model/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/logprob_norm.hpp"

namespace rlserve::model {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();

// Below this temperature sampling is argmax (dividing by it would overflow to inf anyway).
constexpr float k_greedy_temperature = 1e-6f;

float logit_at(std::span<const float> logits, std::size_t i) {
  return std::isnan(logits[i]) ? k_neg_inf : logits[i];
}

// probs = softmax(logits * inv_t), in double up to the final rounding, given m, the largest
// scaled logit (finite). Returns the row's log_norm (kernels/logprob_norm.hpp).
double scaled_softmax(std::span<const float> logits, double inv_t, double m,
                      std::vector<float>& probs) {
  const auto V = logits.size();
  const double norm = kernels::row_log_norm(static_cast<int64_t>(V), m, [&](int64_t i) {
    return double(logit_at(logits, static_cast<std::size_t>(i))) * inv_t;
  });
  probs.resize(V);
  for (std::size_t i = 0; i < V; ++i)
    probs[i] = static_cast<float>(std::exp((double(logit_at(logits, i)) * inv_t - m) - norm));
  return norm;
}

// The candidates top-k, then top-p, then min-p leave of `probs`, written to order[0, n); returns
// n. Most probable first where an order is needed, ties to the lower id. `p_max` is the largest
// probability (min-p's reference). sample() and distribution() share it, so the draft's q and
// the target's p in speculative decoding are exactly what plain sampling draws from.
std::size_t keep_candidates(const std::vector<float>& probs, std::vector<int32_t>& order,
                            const sampling_config& cfg, float p_max) {
  const auto V = probs.size();
  order.resize(V);
  std::iota(order.begin(), order.end(), 0);
  std::size_t n = V;
  auto more_probable = [&](int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  };
  const bool top_k = cfg.top_k > 0 && static_cast<std::size_t>(cfg.top_k) < V;
  const bool top_p = cfg.top_p < 1.0f;
  if (top_k) {
    std::partial_sort(order.begin(), order.begin() + cfg.top_k, order.end(), more_probable);
    n = static_cast<std::size_t>(cfg.top_k);
  } else if (top_p) {
    std::sort(order.begin(), order.end(), more_probable);
  }
  if (top_p) {
    // Keep tokens while the probability of those before them is below top_p: the smallest
    // prefix reaching top_p (the first token always stays).
    double before = 0.0;
    std::size_t keep = 0;
    while (keep < n && (keep == 0 || before < double(cfg.top_p)))
      before += probs[order[keep++]];
    n = keep;
  }
  if (cfg.min_p > 0.0f) {
    const float threshold = cfg.min_p * p_max;
    const auto last = order.begin() + static_cast<std::ptrdiff_t>(n);
    const int32_t top = *std::min_element(order.begin(), last, more_probable);
    auto end = std::stable_partition(order.begin(), last,
                                     [&](int32_t id) { return probs[id] >= threshold; });
    n = static_cast<std::size_t>(end - order.begin());
    if (n == 0) { // min_p > 1: nothing reaches the bar; keep the most probable token
      order[0] = top;
      n = 1;
    }
  }
  return n;
}

} // namespace

rng::rng(uint64_t seed) {
  for (auto& word : s_)
    word = splitmix64(seed);
}

uint64_t rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float rng::uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }

sampler::sampler(uint64_t seed) : rng_(seed) {}

sampled_token sampler::sample(std::span<const float> logits, const sampling_config& cfg,
                              std::vector<int32_t>* kept) {
  const auto V = static_cast<int64_t>(logits.size());
  if (kept)
    kept->clear();
  if (V == 0)
    return {-1, k_neg_inf};
  auto logit = [&](int64_t i) { return std::isnan(logits[i]) ? k_neg_inf : logits[i]; };

  if (!(cfg.temperature >= k_greedy_temperature)) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (logit(i) > logit(best)) // strict: the lowest id wins ties
        best = i;
    const double m = logit(best);
    if (kept) // the kept set is the token alone: its logprob over it is log(1)
      kept->push_back(static_cast<int32_t>(best));
    if (std::isinf(m))
      return {static_cast<int32_t>(best), m > 0 ? 0.0f : k_neg_inf};
    if (kept)
      return {static_cast<int32_t>(best), 0.0f};
    const double norm = kernels::row_log_norm(V, m, [&](int64_t i) { return double(logit(i)); });
    return {static_cast<int32_t>(best), kernels::scaled_logprob(m, m, norm)};
  }

  const double inv_t = 1.0 / double(cfg.temperature);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i)
    m = std::max(m, double(logit(i)) * inv_t);
  const float u = rng_.uniform(); // drawn before any early return: one draw per call
  if (!std::isfinite(m)) {
    if (kept)
      kept->push_back(0);
    return {0, k_neg_inf};
  }
  const double norm = scaled_softmax(logits, inv_t, m, probs_);
  const auto n = static_cast<int64_t>(keep_candidates(probs_, order_, cfg, static_cast<float>(std::exp(-norm))));

  double total = 0.0;
  for (int64_t i = 0; i < n; ++i)
    total += probs_[order_[i]];
  const double target = double(u) * total;
  int32_t token = order_[0]; // the most probable when filtered; replaced by the walk below
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float p = probs_[order_[i]];
    if (p <= 0.0f)
      continue; // an underflowed token is never drawn, not even by rounding at the end
    acc += p;
    token = order_[i];
    if (target < acc)
      break;
  }
  const double z = double(logit(token)) * inv_t;
  if (!kept)
    return {token, kernels::scaled_logprob(z, m, norm)};
  kept->assign(order_.begin(), order_.begin() + n);
  // The same normalizer as the row's, over the kept ids only (m, the row's largest z, is the
  // most probable token's, which every filter keeps).
  const double kept_norm = kernels::row_log_norm(
    n, m, [&](int64_t i) { return double(logit(order_[static_cast<std::size_t>(i)])) * inv_t; });
  return {token, kernels::scaled_logprob(z, m, kept_norm)};
}

void sampler::distribution(std::span<const float> logits, const sampling_config& cfg,
                           std::vector<float>& probs) {
  const auto V = logits.size();
  probs.assign(V, 0.0f);
  if (V == 0)
    return;
  auto logit = [&](std::size_t i) { return std::isnan(logits[i]) ? k_neg_inf : logits[i]; };
  if (!(cfg.temperature >= k_greedy_temperature)) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < V; ++i)
      if (logit(i) > logit(best))
        best = i;
    probs[best] = 1.0f;
    return;
  }
  const double inv_t = 1.0 / double(cfg.temperature);
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < V; ++i)
    m = std::max(m, double(logit(i)) * inv_t);
  if (!std::isfinite(m)) {
    probs[0] = 1.0f;
    return;
  }
  std::vector<float> full;
  const double norm = scaled_softmax(logits, inv_t, m, full);
  std::vector<int32_t> order;
  const auto n = keep_candidates(full, order, cfg, static_cast<float>(std::exp(-norm)));
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    total += full[order[i]];
  for (std::size_t i = 0; i < n; ++i)
    probs[order[i]] = static_cast<float>(full[order[i]] / total);
}

int32_t sampler::draw(std::span<const float> probs) { return draw(probs, rng_.uniform()); }

int32_t sampler::draw(std::span<const float> probs, float u) {
  double total = 0.0;
  for (float p : probs)
    if (p > 0.0f)
      total += p;
  if (!(total > 0.0))
    return -1;
  const double target = double(u) * total;
  double acc = 0.0;
  int32_t last = -1;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] > 0.0f))
      continue;
    acc += probs[i];
    last = static_cast<int32_t>(i);
    if (target < acc)
      break;
  }
  return last;
}

namespace {

// What every reported logprob of a row is taken against, with the same operations as sample():
// z = logit / T in double (T = 1 for greedy), m the largest z, and the row's log_norm. No finite
// z: every logprob is -inf.
struct logprob_basis {
  std::span<const float> logits;
  double inv_t = 1.0, m = 0.0, norm = 0.0;
  bool finite = false;

  logprob_basis(std::span<const float> row, float temperature) : logits(row) {
    inv_t = temperature >= k_greedy_temperature ? 1.0 / double(temperature) : 1.0;
    m = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < logits.size(); ++i)
      m = std::max(m, z(i));
    finite = std::isfinite(m);
    if (finite)
      norm = kernels::row_log_norm(static_cast<int64_t>(logits.size()), m,
                                   [&](int64_t i) { return z(static_cast<std::size_t>(i)); });
  }
  double z(std::size_t i) const { return double(logit_at(logits, i)) * inv_t; }
  float logprob(std::size_t i) const { return finite ? kernels::scaled_logprob(z(i), m, norm) : k_neg_inf; }
};

} // namespace

float token_logprob(std::span<const float> logits, float temperature, int32_t token) {
  if (logits.empty() || token < 0 || static_cast<std::size_t>(token) >= logits.size())
    return k_neg_inf;
  return logprob_basis(logits, temperature).logprob(static_cast<std::size_t>(token));
}

std::vector<token_and_logprob> top_logprobs(std::span<const float> logits, float temperature, int32_t n) {
  const auto V = logits.size();
  const auto k = std::min<std::size_t>(n > 0 ? static_cast<std::size_t>(n) : 0, V);
  if (k == 0)
    return {};
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
    const float la = logit_at(logits, static_cast<std::size_t>(a)), lb = logit_at(logits, static_cast<std::size_t>(b));
    return la > lb || (la == lb && a < b);
  });
  const logprob_basis basis(logits, temperature);
  std::vector<token_and_logprob> out;
  out.reserve(k);
  for (std::size_t i = 0; i < k; ++i)
    out.push_back({ids[i], basis.logprob(static_cast<std::size_t>(ids[i]))});
  return out;
}

void apply_penalties(std::span<float> logits, const generation_history& history,
                     const sampling_config& cfg) {
  if (!cfg.uses_history())
    return;
  const bool additive = cfg.frequency_penalty != 0.0f || cfg.presence_penalty != 0.0f;
  const bool scaling = cfg.repetition_penalty != 1.0f;
  if (additive || scaling)
    for (const auto& [token, count] : history.counts) {
      if (token < 0 || static_cast<std::size_t>(token) >= logits.size() || count <= 0)
        continue;
      float& l = logits[static_cast<std::size_t>(token)];
      if (additive)
        l -= cfg.frequency_penalty * static_cast<float>(count) + cfg.presence_penalty;
      if (scaling)
        l = l > 0.0f ? l / cfg.repetition_penalty : l * cfg.repetition_penalty;
    }
  if (history.generated < cfg.min_new_tokens)
    for (int32_t id : cfg.stop_ids)
      if (id >= 0 && static_cast<std::size_t>(id) < logits.size())
        logits[static_cast<std::size_t>(id)] = k_neg_inf;
}

} // namespace rlserve::model
