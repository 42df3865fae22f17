// CPU references of kernels/decoder_ops.hpp: plain loops, sums in double, one bf16 rounding per
// stored value. The CUDA twins live in kernels/cuda/decoder_ops.cu; without CUDA their launches
// answer not_supported (kernels/no_cuda.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/decoder_ops.hpp"

namespace rlserve::kernels {

namespace {

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

// ---- SiLU-mul -----------------------------------------------------------------------------------

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

} // namespace rlserve::kernels
