// Checks of sampled output against an exact distribution, for the speculative-decoding tests
// (the CPU runners' and the GPU runners'): what top-k sampling draws from, computed from logits
// without the engine's sampler, and Pearson's chi-square against counts of outcomes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

namespace rlserve::test {

// softmax(logits / T) over the `k` largest logits (ties to the lower id), zero elsewhere.
inline std::map<int32_t, double> top_k_distribution(const std::vector<float>& logits, int k, double t) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  double m = logits[ids[0]] / t, z = 0;
  for (int i = 0; i < k; ++i)
    z += std::exp(logits[ids[i]] / t - m);
  std::map<int32_t, double> out;
  for (int i = 0; i < k; ++i)
    out[ids[i]] = std::exp(logits[ids[i]] / t - m) / z;
  return out;
}

// Upper 0.1% point of chi-square with `df` degrees of freedom (Wilson–Hilferty).
inline double chi2_critical_p001(int df) {
  double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Pearson's statistic of `counts` against `expected` probabilities (n draws), cells with an
// expected count below 5 pooled into one (with any outcome the distribution never produces);
// returns {statistic, degrees of freedom}.
inline std::pair<double, int> chi_square(const std::map<std::vector<int32_t>, double>& expected,
                                         const std::map<std::vector<int32_t>, int>& counts, int n) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (auto& [key, p] : expected) {
    auto it = counts.find(key);
    double o = it == counts.end() ? 0 : it->second, e = p * n;
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  for (auto& [key, c] : counts)
    if (!expected.count(key))
      pooled_o += c;
  if (pooled_e > 0 || pooled_o > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9);
    ++cells;
  }
  return {stat, cells - 1};
}

} // namespace rlserve::test
