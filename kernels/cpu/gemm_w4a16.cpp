// CPU reference of the W4A16 GEMM (kernels/gemm_w4a16.hpp) and the argument checks shared with the
// CUDA launch: dequantize each problem's weight through serving_dequant_ref (the inverse serving
// maps, so the reference does not share the kernel's fragment arithmetic), then plain FP32 dot
// products in k order.
#include "kernels/gemm_w4a16.hpp"

#include <cstdint>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/serving_layout.hpp"

namespace rlserve::kernels {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Runs the reference, writing either bf16 C (c16) or FP32 out (c32).
kernel_status reference(const gemm_w4a16_args& a, uint16_t* c16, float* c32) {
  if (auto st = gemm_w4a16_can_implement(a); st != kernel_status::ok)
    return st;
  const int64_t lda = a.lda ? a.lda : a.k, ldc = a.ldc ? a.ldc : a.n;
  const int4_shape one{1, a.n, a.k, a.group_size};
  std::vector<uint16_t> w(static_cast<std::size_t>(a.n * a.k));
  std::vector<float> wf(w.size()), arow(static_cast<std::size_t>(a.k));
  for (int64_t b = 0; b < a.batch; ++b) {
    serving_dequant_args d;
    d.shape = one;
    d.has_zero_point = a.has_zero_point;
    d.scale_type = int4_scale_type::bf16;
    d.serving_weight = a.b + b * serving_weight_words(one);
    d.serving_scale = a.scale + b * serving_scale_count(one);
    d.serving_zero_point = a.has_zero_point ? a.zero_point + b * serving_zero_point_words(one) : nullptr;
    d.out = w.data();
    if (auto st = serving_dequant_ref(d); st != kernel_status::ok)
      return st;
    for (std::size_t i = 0; i < w.size(); ++i)
      wf[i] = bf16_to_float(w[i]);
    for (int64_t i = 0; i < a.m; ++i) {
      const uint16_t* ar = a.a + (b * a.m + i) * lda;
      for (int64_t kk = 0; kk < a.k; ++kk)
        arow[static_cast<std::size_t>(kk)] = bf16_to_float(ar[kk]);
      for (int64_t j = 0; j < a.n; ++j) {
        const float* wr = wf.data() + j * a.k;
        float acc = 0.0f;
        for (int64_t kk = 0; kk < a.k; ++kk)
          acc += arow[static_cast<std::size_t>(kk)] * wr[kk];
        if (c16)
          c16[(b * a.m + i) * ldc + j] = float_to_bf16(acc);
        else
          c32[(b * a.m + i) * a.n + j] = acc;
      }
    }
  }
  return kernel_status::ok;
}

} // namespace

kernel_status gemm_w4a16_can_implement(const gemm_w4a16_args& a) {
  if (a.m < 0 || a.n <= 0 || a.k <= 0 || a.batch < 1)
    return kernel_status::invalid_problem;
  if (a.batch_invariant && a.block_rows != 0 && a.block_rows != 8) // one variant at every m
    return kernel_status::invalid_problem;
  if (!int4_group_size_supported(a.group_size))
    return kernel_status::invalid_problem;
  if (!int4_check_serving_shape(int4_shape{a.batch, a.n, a.k, a.group_size}).empty())
    return kernel_status::invalid_problem; // n % 64, k % 16, k % G
  // The kernel indexes rows, columns and stream-K units with 32-bit integers.
  constexpr int64_t k_max32 = (int64_t{1} << 31) - 1;
  if (a.m > k_max32 / 16 || a.n > k_max32 / 16 || a.k > k_max32 / 16 || a.batch > k_max32 / 16 ||
      a.batch * ((a.m + 15) / 16) * (a.n / 64) * ((a.k + 127) / 128) > k_max32)
    return kernel_status::invalid_problem;
  const int64_t lda = a.lda ? a.lda : a.k, ldc = a.ldc ? a.ldc : a.n;
  if (lda < a.k || ldc < a.n)
    return kernel_status::invalid_problem;
  if (a.m == 0)
    return kernel_status::ok;
  if (a.a == nullptr || a.b == nullptr || a.scale == nullptr || a.c == nullptr ||
      (a.has_zero_point && a.zero_point == nullptr))
    return kernel_status::invalid_problem;
  // Every global access of the kernel is a 16-byte vector.
  if (!aligned16(a.a) || !aligned16(a.b) || !aligned16(a.scale) || !aligned16(a.c) ||
      (a.has_zero_point && !aligned16(a.zero_point)) || lda % 8 != 0 || ldc % 8 != 0)
    return kernel_status::misaligned_operand;
  if ((a.block_rows != 0 && a.block_rows != 8 && a.block_rows != 16 && a.block_rows != 32 && a.block_rows != 48 &&
       a.block_rows != 64) ||
      a.max_ctas < 0)
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status gemm_w4a16_ref(const gemm_w4a16_args& a) { return reference(a, a.c, nullptr); }

kernel_status gemm_w4a16_ref_f32(const gemm_w4a16_args& a, float* out) {
  if (out == nullptr)
    return kernel_status::invalid_problem;
  gemm_w4a16_args b = a;
  if (b.c == nullptr) // the bf16 output is not written; satisfy the checks with any aligned pointer
    b.c = reinterpret_cast<uint16_t*>(out);
  return reference(b, nullptr, out);
}

} // namespace rlserve::kernels
