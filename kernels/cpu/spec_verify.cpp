// CPU references of kernels/spec_verify.hpp: filtered_probs is model::sampler::distribution step
// for step (double softmax, float probabilities, the same candidate orders, double kept mass), and
// spec_verify is the fixed-point rule the CUDA twin (kernels/cuda/spec_verify.cu) runs, with
// model::token_logprob's logprobs. The kernels library does not link the model one, so the few
// lines of both are repeated here; tests/kernels/spec_verify_test.cpp holds them together.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/kept_tokens.hpp"
#include "kernels/logprob_norm.hpp"
#include "kernels/spec_verify.hpp"

namespace rlserve::kernels {

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();
constexpr float k_greedy_temperature = 1e-6f; // model/sampler.cpp: below it sampling is argmax
constexpr float k_fx = 1152921504606846976.0f; // 2^60: the draws' fixed point

float logit_at(const float* row, int64_t i) { return std::isnan(row[i]) ? k_neg_inf : row[i]; }

int64_t argmax_logit(const float* row, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (logit_at(row, i) > logit_at(row, best)) // strict: the lowest id wins ties
      best = i;
  return best;
}

// One row of model::sampler::distribution.
void distribution_row(const float* row, int64_t V, float T, int32_t top_k, float top_p, float min_p,
                      std::vector<float>& full, std::vector<int32_t>& order, float* out) {
  std::fill(out, out + V, 0.0f);
  if (T < 0.0f) // padding
    return;
  if (!(T >= k_greedy_temperature)) {
    out[argmax_logit(row, V)] = 1.0f;
    return;
  }
  const double inv_t = 1.0 / double(T);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i)
    m = std::max(m, double(logit_at(row, i)) * inv_t);
  if (!std::isfinite(m)) {
    out[0] = 1.0f;
    return;
  }
  const double norm = row_log_norm(V, m, [&](int64_t i) { return double(logit_at(row, i)) * inv_t; });
  for (int64_t i = 0; i < V; ++i)
    full[i] = static_cast<float>(std::exp((double(logit_at(row, i)) * inv_t - m) - norm));
  const float p_max = static_cast<float>(std::exp(-norm));

  const int64_t n = cpu::kept_tokens(full.data(), V, top_k, top_p, min_p, p_max, order);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i)
    total += full[order[i]];
  for (int64_t i = 0; i < n; ++i)
    out[order[i]] = static_cast<float>(full[order[i]] / total);
}

// model::token_logprob: log_softmax(row / T)[token] in double (T = 1 when greedy).
float token_logprob(const float* row, int64_t V, float T, int32_t token) {
  if (token < 0 || token >= V)
    return k_neg_inf;
  const double inv_t = T >= k_greedy_temperature ? 1.0 / double(T) : 1.0;
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i)
    m = std::max(m, double(logit_at(row, i)) * inv_t);
  if (!std::isfinite(m))
    return k_neg_inf;
  return scaled_logprob(double(logit_at(row, token)) * inv_t, m,
                        row_log_norm(V, m, [&](int64_t i) { return double(logit_at(row, i)) * inv_t; }));
}

// floor(v * 2^60); entries are probabilities (contract: >= 0, a row's mass at most 15), and
// anything else is clamped rather than left to an undefined conversion.
uint64_t to_fx(float v) {
  if (!(v > 0.0f))
    return 0;
  return v < 8.0f ? static_cast<uint64_t>(v * k_fx) : uint64_t{1} << 63;
}

// The draw rule of kernels/spec_verify.hpp: the first id whose fixed-point running mass exceeds
// u * total; -1 when nothing weighs. `weight(i)` is the entry (>= 0) the walk reads.
template <class Weight>
int32_t draw_fx(int64_t V, float u, Weight weight) {
  uint64_t total = 0;
  for (int64_t i = 0; i < V; ++i)
    total += to_fx(weight(i));
  if (total == 0)
    return -1;
  const double target = double(u) * double(total);
  uint64_t acc = 0;
  for (int64_t i = 0; i < V; ++i) {
    acc += to_fx(weight(i));
    if (target < double(acc))
      return static_cast<int32_t>(i);
  }
  return -1; // unreachable: u < 1 puts the target below the total
}

// The first maximum of a probability row (std::max_element, as model::verify_draft's greedy).
int32_t argmax_prob(const float* row, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (row[i] > row[best])
      best = i;
  return static_cast<int32_t>(best);
}

} // namespace

// ---- filtered_probs ------------------------------------------------------------------------------

kernel_status filtered_probs_can_implement(const filtered_probs_args& a) {
  if (a.rows < 0 || a.vocab <= 0 || a.vocab >= (int64_t{1} << 31))
    return kernel_status::invalid_problem;
  if (a.rows > 0 && (a.logits == nullptr || a.temperature == nullptr || a.top_k == nullptr || a.top_p == nullptr ||
                     a.min_p == nullptr || (a.probs == nullptr && a.row_out == nullptr)))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status filtered_probs_ref(const filtered_probs_args& a) {
  if (auto s = filtered_probs_can_implement(a); s != kernel_status::ok)
    return s;
  const int64_t V = a.vocab;
  std::vector<float> full(static_cast<std::size_t>(V));
  std::vector<int32_t> order(static_cast<std::size_t>(V));
  for (int64_t r = 0; r < a.rows; ++r)
    distribution_row(a.logits + r * V, V, a.temperature[r], a.top_k[r], a.top_p[r], a.min_p[r], full, order,
                     a.row_out ? a.row_out[r] : a.probs + r * V);
  return kernel_status::ok;
}

// ---- spec_verify ---------------------------------------------------------------------------------

kernel_status spec_verify_can_implement(const spec_verify_args& a) {
  if (a.sequences < 0 || a.drafts < 0 || a.vocab <= 0 || a.vocab >= (int64_t{1} << 31))
    return kernel_status::invalid_problem;
  if (a.max_draft < 0 || a.max_draft > k_spec_verify_max_draft || a.drafts > a.sequences * a.max_draft ||
      a.drafts + a.sequences >= (int64_t{1} << 31))
    return kernel_status::invalid_problem;
  if (a.sequences > 0 && ((a.target_probs == nullptr && a.target_rows == nullptr) || a.target_logits == nullptr ||
                          a.temperature == nullptr ||
                          a.draft_offset == nullptr || a.uniform == nullptr || a.accepted == nullptr ||
                          a.token == nullptr || a.logprob == nullptr))
    return kernel_status::invalid_problem;
  if (a.drafts > 0 && ((a.draft_probs == nullptr && a.draft_rows == nullptr) || a.draft_tokens == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status spec_verify_ref(const spec_verify_args& a) {
  if (auto s = spec_verify_can_implement(a); s != kernel_status::ok)
    return s;
  const int64_t V = a.vocab;
  // The layout, read on the host here (the CUDA kernel marks a bad sequence instead).
  if (a.sequences > 0 && (a.draft_offset[0] != 0 || a.draft_offset[a.sequences] != a.drafts))
    return kernel_status::invalid_problem;
  for (int64_t s = 0; s < a.sequences; ++s) {
    const int64_t k = int64_t{a.draft_offset[s + 1]} - a.draft_offset[s];
    if (k < 0 || k > a.max_draft)
      return kernel_status::invalid_problem;
  }
  for (int64_t s = 0; s < a.sequences; ++s) {
    const int64_t o = a.draft_offset[s], k = a.draft_offset[s + 1] - o, row0 = o + s;
    const float T = a.temperature[s];
    auto p_row = [&](int64_t j) { return a.target_rows ? a.target_rows[row0 + j] : a.target_probs + (row0 + j) * V; };
    auto q_row = [&](int64_t i) { return a.draft_rows ? a.draft_rows[o + i] : a.draft_probs + (o + i) * V; };
    if (T < 0.0f) { // padding
      a.accepted[s] = -1;
      for (int64_t j = 0; j <= k; ++j) {
        a.token[row0 + j] = -1;
        a.logprob[row0 + j] = k_neg_inf;
      }
      continue;
    }
    const bool greedy = !(T >= k_greedy_temperature);
    int64_t n = 0;
    int32_t last = -1;
    for (; n < k; ++n) {
      const int32_t d = a.draft_tokens[o + n];
      if (greedy) {
        const int32_t best = argmax_prob(p_row(n), V);
        if (best != d) {
          last = best;
          break;
        }
        continue;
      }
      const bool in_vocab = d >= 0 && d < V;
      const float pd = in_vocab ? p_row(n)[d] : 0.0f, qd = in_vocab ? q_row(n)[d] : 0.0f;
      const float u = a.uniform[row0 + n];
      const bool keep = qd > 0.0f ? double(u) * qd < pd : double(u) < pd;
      if (!keep) {
        const float* p = p_row(n);
        const float* q = q_row(n);
        const float uf = a.uniform[row0 + k];
        last = draw_fx(V, uf, [&](int64_t j) { return std::max(0.0f, p[j] - q[j]); });
        if (last < 0)
          last = draw_fx(V, uf, [&](int64_t j) { return p[j]; });
        break;
      }
    }
    if (n == k)
      last = greedy ? argmax_prob(p_row(k), V)
                    : draw_fx(V, a.uniform[row0 + k], [&](int64_t j) { return p_row(k)[j]; });
    a.accepted[s] = static_cast<int32_t>(n);
    for (int64_t j = 0; j <= k; ++j) {
      const int32_t t = j < n ? a.draft_tokens[o + j] : j == n ? last : -1;
      a.token[row0 + j] = t;
      a.logprob[row0 + j] = j <= n ? token_logprob(a.target_logits + (row0 + j) * V, V, T, t) : k_neg_inf;
    }
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
