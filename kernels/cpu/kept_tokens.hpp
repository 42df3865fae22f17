// The kept set of model::sampler's rule, shared by the CPU twins that need it (the sampler's,
// kernels/cpu/sampler.cpp, and speculative verification's, kernels/cpu/spec_verify.cpp): top-k
// (k most probable, ties to the lower id), then top-p (the shortest most-probable-first prefix
// whose mass reaches top_p, at least one token), then min-p (p >= min_p * p_max; if none, the
// most probable). Private to kernels/cpu/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace rlserve::kernels::cpu {

// Fills `order` (size V) so that its first n ids, the returned count, are the kept tokens: most
// probable first when top-k or top-p is on, else in id order (the order the sampler walks).
inline int64_t kept_tokens(const float* probs, int64_t V, int32_t top_k, float top_p, float min_p, float p_max,
                           std::vector<int32_t>& order) {
  std::iota(order.begin(), order.end(), 0);
  int64_t n = V;
  auto more_probable = [&](int32_t x, int32_t y) { return probs[x] > probs[y] || (probs[x] == probs[y] && x < y); };
  const bool use_k = top_k > 0 && top_k < V;
  const bool use_p = top_p < 1.0f;
  if (use_k) {
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), more_probable);
    n = top_k;
  } else if (use_p) {
    std::sort(order.begin(), order.end(), more_probable);
  }
  if (use_p) {
    double before = 0.0;
    int64_t keep = 0;
    while (keep < n && (keep == 0 || before < double(top_p)))
      before += probs[order[keep++]];
    n = keep;
  }
  if (min_p > 0.0f) {
    const float threshold = min_p * p_max;
    const auto last = order.begin() + n;
    const int32_t top = *std::min_element(order.begin(), last, more_probable);
    auto end = std::stable_partition(order.begin(), last, [&](int32_t id) { return probs[id] >= threshold; });
    n = end - order.begin();
    if (n == 0) {
      order[0] = top;
      n = 1;
    }
  }
  return n;
}

} // namespace rlserve::kernels::cpu
