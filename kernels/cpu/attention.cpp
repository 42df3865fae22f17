#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/dot.hpp"
#include "kernels/cpu_ops.hpp"

namespace rlserve::kernels {

kernel_status attention_can_implement(const attention_args& a) {
  if (a.tq < 0 || a.tk < a.tq || a.n_heads <= 0 || a.n_kv_heads <= 0 || a.head_dim <= 0 ||
      a.n_heads % a.n_kv_heads != 0 || !(a.scale > 0.0f))
    return kernel_status::invalid_problem;
  if (a.tq > 0 && (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.out == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status attention_cpu(const attention_args& a) {
  if (auto s = attention_can_implement(a); s != kernel_status::ok)
    return s;
  const int64_t d = a.head_dim;
  const int64_t group = a.n_heads / a.n_kv_heads; // query heads per kv head
  const int64_t past = a.tk - a.tq;               // keys before the first new query
  std::vector<float> scores(a.tk);                // [tk] for one (query, head)
  std::vector<float> acc(d);                      // [head_dim]
  for (int64_t t = 0; t < a.tq; ++t) {
    const int64_t visible = past + t + 1; // causal: keys 0 .. past + t
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const int64_t g = h / group;
      const float* q = a.q + (t * a.n_heads + h) * d; // [head_dim]
      // Keys of kv head g are rows n_kv_heads * head_dim apart in the cache.
      const float* k = a.k + g * d; // [tk, (n_kv_heads * head_dim) stride]
      const int64_t ldk = a.n_kv_heads * d;
      int64_t j = 0;
      for (; j + 4 <= visible; j += 4)
        cpu::dot_rows<4>(q, k + j * ldk, ldk, d, &scores[j]);
      for (; j < visible; ++j)
        cpu::dot_rows<1>(q, k + j * ldk, ldk, d, &scores[j]);
      float max_score = -INFINITY;
      for (j = 0; j < visible; ++j) {
        scores[j] *= a.scale;
        max_score = std::max(max_score, scores[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        sum += scores[j];
      }
      const float inv_sum = static_cast<float>(1.0 / sum);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < visible; ++j) {
        const float p = scores[j] * inv_sum;
        const float* v = a.v + (j * a.n_kv_heads + g) * d; // [head_dim]
        for (int64_t c = 0; c < d; ++c)
          acc[c] += p * v[c];
      }
      float* out = a.out + (t * a.n_heads + h) * d; // [head_dim]
      for (int64_t c = 0; c < d; ++c)
        out[c] = acc[c];
    }
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
