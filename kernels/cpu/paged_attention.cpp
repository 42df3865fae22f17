// CPU reference of kernels/paged_attention.hpp (plain loops, sums in double, one bf16 rounding per stored
// value); the CUDA twin is kernels/cuda/paged_attention.cu.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/paged_attention.hpp"

namespace rlserve::kernels {

// ---- paged attention -----------------------------------------------------------------------------

kernel_status paged_attention_can_implement(const paged_attention_args& a) {
  if (a.tokens < 0 || a.sequences < 0 || a.max_blocks <= 0 || (a.block_size != 16 && a.block_size != 32) ||
      a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || (a.head_dim != 64 && a.head_dim != 128) ||
      a.max_context < 0 || a.max_context > a.max_blocks * a.block_size || !(a.scale > 0.0f) ||
      a.q_heads / a.kv_heads > 16 || a.max_tokens < 0 || (a.max_tokens > 0 && a.tokens > a.max_tokens))
    return kernel_status::invalid_problem;
  if (a.tokens > 0 && (a.q == nullptr || a.k_cache == nullptr || a.v_cache == nullptr || a.block_table == nullptr ||
                       a.row_seq == nullptr || a.row_pos == nullptr || a.out == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status paged_attention_ref(const paged_attention_args& a) {
  if (auto s = paged_attention_can_implement(a); s != kernel_status::ok)
    return s;
  const int64_t D = a.head_dim, group = a.q_heads / a.kv_heads;
  const int64_t context = a.max_context > 0 ? a.max_context : a.max_blocks * a.block_size;
  std::vector<double> score, acc(static_cast<std::size_t>(D));
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t seq = a.row_seq[t], pos = a.row_pos[t];
    uint16_t* out_row = a.out + t * a.q_heads * D;
    if (seq < 0) {
      std::fill_n(out_row, a.q_heads * D, uint16_t{0});
      continue;
    }
    if (seq >= a.sequences || pos < 0 || pos >= context)
      return kernel_status::invalid_problem;
    const int32_t* table = a.block_table + seq * a.max_blocks;
    score.assign(static_cast<std::size_t>(pos + 1), 0.0);
    for (int64_t h = 0; h < a.q_heads; ++h) {
      const int64_t kvh = h / group;
      const uint16_t* q = a.q + (t * a.q_heads + h) * D;
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= pos; ++j) {
        const int64_t slot = int64_t{table[j / a.block_size]} * a.block_size + j % a.block_size;
        const uint16_t* k = a.k_cache + (slot * a.kv_heads + kvh) * D;
        double dot = 0.0;
        for (int64_t i = 0; i < D; ++i)
          dot += double(bf16_to_float(q[i])) * bf16_to_float(k[i]);
        score[j] = dot * a.scale;
        m = std::max(m, score[j]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j <= pos; ++j) {
        const double p = std::exp(score[j] - m);
        sum += p;
        const int64_t slot = int64_t{table[j / a.block_size]} * a.block_size + j % a.block_size;
        const uint16_t* v = a.v_cache + (slot * a.kv_heads + kvh) * D;
        for (int64_t i = 0; i < D; ++i)
          acc[i] += p * bf16_to_float(v[i]);
      }
      for (int64_t i = 0; i < D; ++i)
        out_row[h * D + i] = float_to_bf16(static_cast<float>(acc[i] / sum));
    }
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
