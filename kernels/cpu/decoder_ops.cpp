// CPU references of kernels/decoder_ops.hpp: plain loops, sums in double, one bf16 rounding per
// stored value. The CUDA twins live in kernels/cuda/{decoder_ops,paged_attention,gemv_bf16,moe_bf16,sampler}.cu;
// without CUDA their launches answer not_supported (kernels/no_cuda.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/decoder_ops.hpp"
#include "kernels/fused_moe.hpp"

namespace rlserve::kernels {

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();
constexpr float k_greedy_temperature = 1e-6f; // model/sampler.cpp: below it sampling is argmax

float silu(float g) { return g / (1.0f + std::exp(-g)); }

} // namespace

// ---- embedding -------------------------------------------------------------------------------------

kernel_status embed_can_implement(const embed_args& a) {
  if (a.tokens < 0 || a.vocab <= 0 || a.hidden <= 0 || a.hidden % 8 != 0)
    return kernel_status::invalid_problem;
  if (a.tokens > 0 && (a.ids == nullptr || a.table == nullptr || a.residual == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status embed_ref(const embed_args& a) {
  if (auto s = embed_can_implement(a); s != kernel_status::ok)
    return s;
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t id = a.ids[t];
    float* out = a.residual + t * a.hidden;
    for (int64_t c = 0; c < a.hidden; ++c)
      out[c] = (id >= 0 && id < a.vocab) ? bf16_to_float(a.table[id * a.hidden + c]) : 0.0f;
  }
  return kernel_status::ok;
}

// ---- residual add + RMSNorm ----------------------------------------------------------------------

kernel_status add_rms_norm_can_implement(const add_rms_norm_args& a) {
  if (a.rows < 0 || a.cols <= 0 || a.cols % 8 != 0 || a.cols > 16384 || !(a.eps >= 0.0f))
    return kernel_status::invalid_problem;
  if (a.delta != nullptr && a.rows_index != nullptr)
    return kernel_status::invalid_problem;
  if (a.rows > 0 && (a.residual == nullptr || a.weight == nullptr || a.out == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status add_rms_norm_ref(const add_rms_norm_args& a) {
  if (auto s = add_rms_norm_can_implement(a); s != kernel_status::ok)
    return s;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t src = a.rows_index ? a.rows_index[r] : r;
    uint16_t* out = a.out + r * a.cols;
    if (src < 0) {
      std::fill_n(out, a.cols, uint16_t{0});
      continue;
    }
    float* x = a.residual + src * a.cols;
    if (a.delta)
      for (int64_t c = 0; c < a.cols; ++c)
        x[c] += bf16_to_float(a.delta[src * a.cols + c]);
    double ss = 0.0;
    for (int64_t c = 0; c < a.cols; ++c)
      ss += double(x[c]) * x[c];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / double(a.cols) + a.eps));
    for (int64_t c = 0; c < a.cols; ++c)
      out[c] = float_to_bf16(x[c] * inv * bf16_to_float(a.weight[c]));
  }
  return kernel_status::ok;
}

// ---- q/k RMSNorm + RoPE + paged KV write ---------------------------------------------------------

kernel_status qk_norm_rope_kv_can_implement(const qk_norm_rope_kv_args& a) {
  if (a.tokens < 0 || a.q_heads <= 0 || a.kv_heads <= 0 || (a.head_dim != 64 && a.head_dim != 128) ||
      a.max_positions <= 0 || a.num_slots < 0 || !(a.eps >= 0.0f))
    return kernel_status::invalid_problem;
  if (a.tokens > 0 && (a.qkv == nullptr || a.q_norm == nullptr || a.k_norm == nullptr || a.rope_cos == nullptr ||
                       a.rope_sin == nullptr || a.positions == nullptr || a.slots == nullptr ||
                       a.q_out == nullptr || a.k_cache == nullptr || a.v_cache == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

namespace {

// rope(rmsnorm(x) * w) of one head, rounded once to bf16.
void norm_rope_head(const uint16_t* x, const uint16_t* w, const float* cos, const float* sin, int64_t d,
                    float eps, uint16_t* out) {
  std::vector<float> y(static_cast<std::size_t>(d));
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    const float v = bf16_to_float(x[i]);
    ss += double(v) * v;
  }
  const auto inv = static_cast<float>(1.0 / std::sqrt(ss / double(d) + eps));
  for (int64_t i = 0; i < d; ++i)
    y[i] = bf16_to_float(x[i]) * inv * bf16_to_float(w[i]);
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float lo = y[i], hi = y[i + half];
    out[i] = float_to_bf16(lo * cos[i] - hi * sin[i]);
    out[i + half] = float_to_bf16(hi * cos[i] + lo * sin[i]);
  }
}

} // namespace

kernel_status qk_norm_rope_kv_ref(const qk_norm_rope_kv_args& a) {
  if (auto s = qk_norm_rope_kv_can_implement(a); s != kernel_status::ok)
    return s;
  const int64_t D = a.head_dim, half = D / 2, width = (a.q_heads + 2 * a.kv_heads) * D;
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t p = a.positions[t], slot = a.slots[t];
    if (p < 0 || p >= a.max_positions || slot >= a.num_slots)
      return kernel_status::invalid_problem;
    const uint16_t* row = a.qkv + t * width;
    const float* c = a.rope_cos + p * half;
    const float* s = a.rope_sin + p * half;
    for (int64_t h = 0; h < a.q_heads; ++h)
      norm_rope_head(row + h * D, a.q_norm, c, s, D, a.eps, a.q_out + (t * a.q_heads + h) * D);
    if (slot < 0)
      continue;
    for (int64_t h = 0; h < a.kv_heads; ++h) {
      norm_rope_head(row + (a.q_heads + h) * D, a.k_norm, c, s, D, a.eps, a.k_cache + (slot * a.kv_heads + h) * D);
      std::copy_n(row + (a.q_heads + a.kv_heads + h) * D, D, a.v_cache + (slot * a.kv_heads + h) * D);
    }
  }
  return kernel_status::ok;
}

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

// ---- SiLU-mul -----------------------------------------------------------------------------------

// ---- BF16 GEMV --------------------------------------------------------------------------------------

kernel_status gemv_bf16_can_implement(const gemv_bf16_args& a) {
  if (a.rows < 1 || a.rows > k_gemv_max_rows || a.n < 1 || a.k < 8 || a.k % 8 != 0 || a.ldy < a.n)
    return kernel_status::invalid_problem;
  if (a.x == nullptr || a.w == nullptr || a.y == nullptr)
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status gemv_bf16_ref(const gemv_bf16_args& a) {
  if (auto s = gemv_bf16_can_implement(a); s != kernel_status::ok)
    return s;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.n; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < a.k; ++j)
        acc += double(bf16_to_float(a.x[r * a.k + j])) * double(bf16_to_float(a.w[c * a.k + j]));
      if (a.f32_out)
        static_cast<float*>(a.y)[r * a.ldy + c] = static_cast<float>(acc);
      else
        static_cast<uint16_t*>(a.y)[r * a.ldy + c] = float_to_bf16(static_cast<float>(acc));
    }
  return kernel_status::ok;
}

kernel_status silu_mul_bf16_can_implement(const silu_mul_bf16_args& a) {
  if (a.rows < 0 || a.cols <= 0 || a.cols % 8 != 0)
    return kernel_status::invalid_problem;
  if (a.rows > 0 && (a.gate_up == nullptr || a.out == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status silu_mul_bf16_ref(const silu_mul_bf16_args& a) {
  if (auto s = silu_mul_bf16_can_implement(a); s != kernel_status::ok)
    return s;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) {
      const float g = bf16_to_float(a.gate_up[r * 2 * a.cols + c]);
      const float u = bf16_to_float(a.gate_up[r * 2 * a.cols + a.cols + c]);
      const float act = bf16_to_float(float_to_bf16(silu(g)));
      a.out[r * a.cols + c] = float_to_bf16(act * u);
    }
  return kernel_status::ok;
}

// ---- BF16 fused MoE ------------------------------------------------------------------------------

kernel_status moe_bf16_can_implement(const moe_bf16_args& a) {
  if (a.tokens < 0 || a.hidden <= 0 || a.intermediate <= 0 || a.hidden % 64 != 0 || a.intermediate % 64 != 0 ||
      a.experts < 1 || a.experts > 256 || a.top_k < 1 || a.top_k > 32 || a.top_k > a.experts || a.max_tokens < 0 ||
      (a.max_tokens > 0 && a.tokens > a.max_tokens))
    return kernel_status::invalid_problem;
  const int64_t cap = a.max_tokens > 0 ? a.max_tokens : a.tokens;
  if (cap * a.top_k >= (int64_t{1} << 30) || a.hidden > 16384 || a.intermediate > 16384)
    return kernel_status::invalid_problem;
  if (a.tokens > 0 && (a.router_logits == nullptr || a.x == nullptr || a.w13 == nullptr || a.w2 == nullptr ||
                       a.out == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status moe_bf16_ref(const moe_bf16_args& a) {
  if (auto s = moe_bf16_can_implement(a); s != kernel_status::ok)
    return s;
  const int64_t T = a.tokens, H = a.hidden, I = a.intermediate, K = a.top_k;
  if (T == 0)
    return kernel_status::ok;
  std::vector<int32_t> ids(static_cast<std::size_t>(T * K));
  std::vector<float> wts(ids.size());
  moe_topk_args r{T, a.experts, a.top_k, a.norm_topk_prob, a.router_logits, ids.data(), wts.data()};
  if (auto st = moe_topk_ref(r); st != kernel_status::ok)
    return st;
  std::vector<float> x(static_cast<std::size_t>(H)), gu(static_cast<std::size_t>(2 * I)),
    h(static_cast<std::size_t>(I)), y(static_cast<std::size_t>(H)), acc(static_cast<std::size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < H; ++c)
      x[c] = bf16_to_float(a.x[t * H + c]);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t s = 0; s < K; ++s) {
      const int64_t e = ids[t * K + s];
      const uint16_t* w13 = a.w13 + e * 2 * I * H;
      const uint16_t* w2 = a.w2 + e * H * I;
      for (int64_t n = 0; n < 2 * I; ++n) { // g | u, rounded to bf16 like a GEMM's bf16 output
        double d = 0.0;
        for (int64_t c = 0; c < H; ++c)
          d += double(x[c]) * bf16_to_float(w13[n * H + c]);
        gu[n] = bf16_to_float(float_to_bf16(static_cast<float>(d)));
      }
      for (int64_t i = 0; i < I; ++i)
        h[i] = bf16_to_float(float_to_bf16(silu(gu[i]) * gu[I + i]));
      for (int64_t n = 0; n < H; ++n) {
        double d = 0.0;
        for (int64_t i = 0; i < I; ++i)
          d += double(h[i]) * bf16_to_float(w2[n * I + i]);
        y[n] = static_cast<float>(d);
      }
      for (int64_t n = 0; n < H; ++n)
        acc[n] += wts[t * K + s] * y[n];
    }
    for (int64_t n = 0; n < H; ++n)
      a.out[t * H + n] = float_to_bf16(acc[n]);
  }
  return kernel_status::ok;
}

// ---- sampler -------------------------------------------------------------------------------------

kernel_status sample_can_implement(const sample_args& a) {
  if (a.rows < 0 || a.vocab <= 0 || a.vocab >= (int64_t{1} << 31))
    return kernel_status::invalid_problem;
  if (a.rows > 0 && (a.logits == nullptr || a.temperature == nullptr || a.top_k == nullptr ||
                     a.top_p == nullptr || a.min_p == nullptr || a.uniform == nullptr || a.token == nullptr ||
                     a.logprob == nullptr))
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
    if (T < 0.0f) { // padding row
      a.token[r] = -1;
      a.logprob[r] = k_neg_inf;
      continue;
    }
    if (!(T >= k_greedy_temperature)) {
      int64_t best = 0;
      for (int64_t i = 1; i < V; ++i)
        if (logit(i) > logit(best))
          best = i;
      const double m = logit(best);
      a.token[r] = static_cast<int32_t>(best);
      if (std::isinf(m)) {
        a.logprob[r] = m > 0 ? 0.0f : k_neg_inf;
        continue;
      }
      double sum = 0.0;
      for (int64_t i = 0; i < V; ++i)
        sum += std::exp(double(logit(i)) - m);
      a.logprob[r] = static_cast<float>(m - (m + std::log(sum)));
      continue;
    }
    const double inv_t = 1.0 / double(T);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < V; ++i)
      m = std::max(m, double(logit(i)) * inv_t);
    if (!std::isfinite(m)) {
      a.token[r] = 0;
      a.logprob[r] = k_neg_inf;
      continue;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < V; ++i)
      sum += std::exp(double(logit(i)) * inv_t - m);
    const double lse = m + std::log(sum);
    for (int64_t i = 0; i < V; ++i)
      probs[i] = static_cast<float>(std::exp(double(logit(i)) * inv_t - lse));
    const float p_max = static_cast<float>(std::exp(m - lse));

    std::iota(order.begin(), order.end(), 0);
    int64_t n = V;
    auto more_probable = [&](int32_t x, int32_t y) { return probs[x] > probs[y] || (probs[x] == probs[y] && x < y); };
    const int32_t k = a.top_k[r];
    const float top_p = a.top_p[r], min_p = a.min_p[r];
    const bool use_k = k > 0 && k < V;
    const bool use_p = top_p < 1.0f;
    if (use_k) {
      std::partial_sort(order.begin(), order.begin() + k, order.end(), more_probable);
      n = k;
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
    a.logprob[r] = static_cast<float>(double(logit(token)) * inv_t - lse);
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
