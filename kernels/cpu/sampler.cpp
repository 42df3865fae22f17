// CPU reference of kernels/sampler.hpp (plain loops, sums in double, one bf16 rounding per stored
// value); the CUDA twin is kernels/cuda/sampler.cu.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cpu/kept_tokens.hpp"
#include "kernels/logprob_norm.hpp"
#include "kernels/sampler.hpp"

namespace rlserve::kernels {

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();
constexpr float k_greedy_temperature = 1e-6f; // model/sampler.cpp: below it sampling is argmax

} // namespace

// ---- sampler -------------------------------------------------------------------------------------

kernel_status sample_can_implement(const sample_args& a) {
  if (a.rows < 0 || a.vocab <= 0 || a.vocab >= (int64_t{1} << 31))
    return kernel_status::invalid_problem;
  if (a.rows > 0 && (a.logits == nullptr || a.temperature == nullptr || a.top_k == nullptr ||
                     a.top_p == nullptr || a.min_p == nullptr || a.uniform == nullptr || a.token == nullptr ||
                     a.logprob == nullptr))
    return kernel_status::invalid_problem;
  if (a.want_kept && a.rows > 0 &&
      (a.kept_ids == nullptr || a.kept_count == nullptr || a.kept_cap < 1 || a.kept_cap > k_kept_cap_max))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

// model::sampler::sample with the uniform given, step for step (same double sums, same float
// probabilities, same orders), so the two agree bit for bit.
kernel_status sample_ref(const sample_args& a) {
  if (auto s = sample_can_implement(a); s != kernel_status::ok)
    return s;
  const int64_t V = a.vocab;
  std::vector<float> probs(static_cast<std::size_t>(V));
  std::vector<int32_t> order(static_cast<std::size_t>(V));
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* logits = a.logits + r * V;
    auto logit = [&](int64_t i) { return std::isnan(logits[i]) ? k_neg_inf : logits[i]; };
    const float T = a.temperature[r];
    const bool want = a.want_kept && a.want_kept[r] != 0 && T >= 0.0f;
    // The row's kept set (top-p replay): count n of order's first ids, or -1 when it does not fit.
    auto list = [&](const int32_t* ids, int64_t n) {
      if (!a.want_kept)
        return;
      const bool fits = want && n <= a.kept_cap;
      a.kept_count[r] = !want ? 0 : fits ? static_cast<int32_t>(n) : -1;
      for (int64_t i = 0; i < a.kept_cap; ++i)
        a.kept_ids[r * a.kept_cap + i] = fits && i < n ? ids[i] : -1;
    };
    if (T < 0.0f) { // padding row
      a.token[r] = -1;
      a.logprob[r] = k_neg_inf;
      list(nullptr, 0);
      continue;
    }
    if (!(T >= k_greedy_temperature)) {
      int64_t best = 0;
      for (int64_t i = 1; i < V; ++i)
        if (logit(i) > logit(best))
          best = i;
      const double m = logit(best);
      a.token[r] = static_cast<int32_t>(best);
      list(&a.token[r], 1);
      if (std::isinf(m)) {
        a.logprob[r] = m > 0 ? 0.0f : k_neg_inf;
        continue;
      }
      a.logprob[r] = want ? 0.0f // log(1): the token is its kept set
                          : scaled_logprob(m, m, row_log_norm(V, m, [&](int64_t i) { return double(logit(i)); }));
      continue;
    }
    const double inv_t = 1.0 / double(T);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < V; ++i)
      m = std::max(m, double(logit(i)) * inv_t);
    if (!std::isfinite(m)) {
      a.token[r] = 0;
      a.logprob[r] = k_neg_inf;
      list(&a.token[r], 1);
      continue;
    }
    const double norm = row_log_norm(V, m, [&](int64_t i) { return double(logit(i)) * inv_t; });
    for (int64_t i = 0; i < V; ++i)
      probs[i] = static_cast<float>(std::exp((double(logit(i)) * inv_t - m) - norm));
    const float p_max = static_cast<float>(std::exp(-norm));

    const int64_t n = cpu::kept_tokens(probs.data(), V, a.top_k[r], a.top_p[r], a.min_p[r], p_max, order);
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i)
      total += probs[order[i]];
    const double target = double(a.uniform[r]) * total;
    int32_t token = order[0];
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float p = probs[order[i]];
      if (p <= 0.0f)
        continue;
      acc += p;
      token = order[i];
      if (target < acc)
        break;
    }
    a.token[r] = token;
    list(order.data(), n);
    // Listed: the logprob over the set (model::sampler::sample's kept normalizer).
    const double kept_norm =
      want && n <= a.kept_cap
        ? row_log_norm(n, m, [&](int64_t i) { return double(logit(order[static_cast<std::size_t>(i)])) * inv_t; })
        : norm;
    a.logprob[r] = scaled_logprob(double(logit(token)) * inv_t, m, kept_norm);
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
