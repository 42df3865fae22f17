// CPU references of the fused MoE (kernels/fused_moe.hpp): router top-k, token-to-expert
// alignment, and the whole layer built from per-expert unfused W4A16 GEMM references.
#include "kernels/fused_moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/gemm_w4a16.hpp"

namespace rlserve::kernels {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
constexpr int64_t k_max_experts = 256; // the CUDA top-k keeps 8 logits per lane
constexpr int32_t k_max_top_k = 32;

float silu(float g) { return g / (1.0f + std::exp(-g)); }

} // namespace

// ---- top-k ------------------------------------------------------------------------------------------

kernel_status moe_topk_can_implement(const moe_topk_args& a) {
  if (a.tokens < 0 || a.experts < 1 || a.experts > k_max_experts || a.top_k < 1 || a.top_k > k_max_top_k ||
      a.top_k > a.experts || a.tokens > (int64_t{1} << 31) / a.top_k)
    return kernel_status::invalid_problem;
  if (a.tokens > 0 && (a.router_logits == nullptr || a.topk_ids == nullptr || a.topk_weights == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status moe_topk_ref(const moe_topk_args& a) {
  if (auto st = moe_topk_can_implement(a); st != kernel_status::ok)
    return st;
  std::vector<int32_t> order(static_cast<std::size_t>(a.experts));
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float* l = a.router_logits + t * a.experts;
    for (int32_t e = 0; e < a.experts; ++e)
      order[static_cast<std::size_t>(e)] = e;
    // Selection on the logits (softmax is monotonic): larger first, ties to the lower id.
    std::partial_sort(order.begin(), order.begin() + a.top_k, order.end(),
                      [l](int32_t x, int32_t y) { return l[x] > l[y] || (l[x] == l[y] && x < y); });
    const float mx = l[order[0]];
    float denom = 0.0f;
    if (a.norm_topk_prob) {
      for (int32_t s = 0; s < a.top_k; ++s)
        denom += std::exp(l[order[static_cast<std::size_t>(s)]] - mx);
    } else {
      for (int32_t e = 0; e < a.experts; ++e)
        denom += std::exp(l[e] - mx);
    }
    for (int32_t s = 0; s < a.top_k; ++s) {
      const int32_t e = order[static_cast<std::size_t>(s)];
      a.topk_ids[t * a.top_k + s] = e;
      a.topk_weights[t * a.top_k + s] = std::exp(l[e] - mx) / denom;
    }
  }
  return kernel_status::ok;
}

// ---- alignment -----------------------------------------------------------------------------------

int64_t moe_align_capacity(int64_t num_ids, int64_t experts, int32_t block) {
  if (block < 1)
    return 0;
  return block * (num_ids / block + std::min(experts, num_ids));
}

kernel_status moe_align_can_implement(const moe_align_args& a) {
  if (a.num_ids < 0 || a.experts < 1 || a.experts > 1024 || a.block < 1 || a.block % 8 != 0 ||
      a.num_ids >= (int64_t{1} << 30))
    return kernel_status::invalid_problem;
  if (a.topk_ids == nullptr || a.sorted_ids == nullptr || a.block_expert == nullptr || a.num_padded == nullptr)
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status moe_align_ref(const moe_align_args& a) {
  if (auto st = moe_align_can_implement(a); st != kernel_status::ok)
    return st;
  std::vector<int64_t> count(static_cast<std::size_t>(a.experts), 0);
  for (int64_t i = 0; i < a.num_ids; ++i) {
    const int32_t e = a.topk_ids[i];
    if (e < 0 || e >= a.experts)
      return kernel_status::invalid_problem;
    ++count[static_cast<std::size_t>(e)];
  }
  int64_t pos = 0;
  for (int64_t e = 0; e < a.experts; ++e) {
    const int64_t start = pos;
    for (int64_t i = 0; i < a.num_ids; ++i)
      if (a.topk_ids[i] == e)
        a.sorted_ids[pos++] = static_cast<int32_t>(i);
    const int64_t padded = (count[static_cast<std::size_t>(e)] + a.block - 1) / a.block * a.block;
    while (pos < start + padded)
      a.sorted_ids[pos++] = static_cast<int32_t>(a.num_ids);
    for (int64_t b = start / a.block; b < pos / a.block; ++b)
      a.block_expert[b] = static_cast<int32_t>(e);
  }
  *a.num_padded = static_cast<int32_t>(pos);
  return kernel_status::ok;
}

// ---- the layer -----------------------------------------------------------------------------------

kernel_status fused_moe_can_implement(const fused_moe_args& a) {
  if (a.tokens < 0 || a.hidden <= 0 || a.intermediate <= 0 || a.experts < 1 || a.experts > k_max_experts ||
      a.top_k < 1 || a.top_k > k_max_top_k || a.top_k > a.experts || a.max_tokens < 0 ||
      (a.max_tokens > 0 && a.tokens > a.max_tokens) || (a.block_rows != 0 && a.block_rows != 8 && a.block_rows != 16 && a.block_rows != 32 &&
       a.block_rows != 48 && a.block_rows != 64) ||
      a.max_ctas < 0 || a.gemv < -1 || a.gemv > 1 || (a.gemv == 1 && (a.tokens * a.top_k > k_moe_gemv_max_ids || a.hidden > k_moe_gemv_max_dim ||
                                  a.intermediate > k_moe_gemv_max_dim)) ||
      (a.batch_invariant && ((a.block_rows != 0 && a.block_rows != 8) || a.gemv == 1)))
    return kernel_status::invalid_problem;
  if (!int4_group_size_supported(a.group_size))
    return kernel_status::invalid_problem;
  // W13: n = 2I (gate and up 64-column tiles pair up: I % 64), k = H; W2: n = H, k = I.
  if (a.hidden % 64 != 0 || a.intermediate % 64 != 0 ||
      (a.group_size > 0 && (a.hidden % a.group_size != 0 || a.intermediate % a.group_size != 0)))
    return kernel_status::invalid_problem;
  const int64_t cap = a.max_tokens > 0 ? a.max_tokens : a.tokens;
  if (cap * a.top_k >= (int64_t{1} << 30) || a.hidden >= (int64_t{1} << 24) || a.intermediate >= (int64_t{1} << 24))
    return kernel_status::invalid_problem;
  if (a.tokens == 0)
    return kernel_status::ok;
  if (a.router_logits == nullptr || a.x == nullptr || a.w13 == nullptr || a.w13_scale == nullptr ||
      a.w2 == nullptr || a.w2_scale == nullptr || a.out == nullptr ||
      (a.has_zero_point && (a.w13_zero_point == nullptr || a.w2_zero_point == nullptr)))
    return kernel_status::invalid_problem;
  if (!aligned16(a.x) || !aligned16(a.w13) || !aligned16(a.w13_scale) || !aligned16(a.w2) ||
      !aligned16(a.w2_scale) || !aligned16(a.out) ||
      (a.has_zero_point && (!aligned16(a.w13_zero_point) || !aligned16(a.w2_zero_point))))
    return kernel_status::misaligned_operand;
  return kernel_status::ok;
}

kernel_status fused_moe_ref(const fused_moe_args& a) {
  if (auto st = fused_moe_can_implement(a); st != kernel_status::ok)
    return st;
  const int64_t T = a.tokens, H = a.hidden, I = a.intermediate, K = a.top_k;
  if (T == 0)
    return kernel_status::ok;
  std::vector<int32_t> ids(static_cast<std::size_t>(T * K));
  std::vector<float> wts(ids.size());
  moe_topk_args r{T, a.experts, a.top_k, a.norm_topk_prob, a.router_logits, ids.data(), wts.data()};
  if (auto st = moe_topk_ref(r); st != kernel_status::ok)
    return st;

  const int4_shape s13{1, 2 * I, H, a.group_size}, s2{1, H, I, a.group_size};
  std::vector<float> y(static_cast<std::size_t>(T * K * H), 0.0f);
  std::vector<int64_t> rows;
  for (int64_t e = 0; e < a.experts; ++e) {
    rows.clear();
    for (int64_t i = 0; i < T * K; ++i)
      if (ids[static_cast<std::size_t>(i)] == e)
        rows.push_back(i);
    if (rows.empty())
      continue;
    const int64_t ne = static_cast<int64_t>(rows.size());
    // Unfused per-expert pipeline: gather, w13 GEMM (bf16 out), SiLU-mul (bf16), w2 GEMM (FP32 out).
    std::vector<uint16_t> xe(static_cast<std::size_t>(ne * H)), gu(static_cast<std::size_t>(ne * 2 * I)),
      he(static_cast<std::size_t>(ne * I));
    for (int64_t r0 = 0; r0 < ne; ++r0)
      std::copy_n(a.x + (rows[static_cast<std::size_t>(r0)] / K) * H, H, xe.data() + r0 * H);
    gemm_w4a16_args g1;
    g1.m = ne, g1.n = 2 * I, g1.k = H, g1.group_size = a.group_size, g1.has_zero_point = a.has_zero_point;
    g1.a = xe.data();
    g1.b = a.w13 + e * serving_weight_words(s13);
    g1.scale = a.w13_scale + e * serving_scale_count(s13);
    g1.zero_point = a.has_zero_point ? a.w13_zero_point + e * serving_zero_point_words(s13) : nullptr;
    g1.c = gu.data();
    if (auto st = gemm_w4a16_ref(g1); st != kernel_status::ok)
      return st;
    for (int64_t r0 = 0; r0 < ne; ++r0)
      for (int64_t j = 0; j < I; ++j) {
        const float g = bf16_to_float(gu[static_cast<std::size_t>(r0 * 2 * I + j)]);
        const float u = bf16_to_float(gu[static_cast<std::size_t>(r0 * 2 * I + I + j)]);
        he[static_cast<std::size_t>(r0 * I + j)] = float_to_bf16(silu(g) * u);
      }
    std::vector<float> ye(static_cast<std::size_t>(ne * H));
    gemm_w4a16_args g2;
    g2.m = ne, g2.n = H, g2.k = I, g2.group_size = a.group_size, g2.has_zero_point = a.has_zero_point;
    g2.a = he.data();
    g2.b = a.w2 + e * serving_weight_words(s2);
    g2.scale = a.w2_scale + e * serving_scale_count(s2);
    g2.zero_point = a.has_zero_point ? a.w2_zero_point + e * serving_zero_point_words(s2) : nullptr;
    if (auto st = gemm_w4a16_ref_f32(g2, ye.data()); st != kernel_status::ok)
      return st;
    for (int64_t r0 = 0; r0 < ne; ++r0)
      std::copy_n(ye.data() + r0 * H, H, y.data() + rows[static_cast<std::size_t>(r0)] * H);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H; ++j) {
      float acc = 0.0f;
      for (int64_t s = 0; s < K; ++s)
        acc += wts[static_cast<std::size_t>(t * K + s)] * y[static_cast<std::size_t>((t * K + s) * H + j)];
      a.out[t * H + j] = float_to_bf16(acc);
    }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
