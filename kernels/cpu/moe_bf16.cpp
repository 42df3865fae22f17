// CPU reference of kernels/moe_bf16.hpp (plain loops, sums in double, one bf16 rounding per stored
// value); the CUDA twin is kernels/cuda/moe_bf16.cu.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/fused_moe.hpp"
#include "kernels/moe_bf16.hpp"

namespace rlserve::kernels {

namespace {

float silu(float g) { return g / (1.0f + std::exp(-g)); }

} // namespace

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

} // namespace rlserve::kernels
