// CPU reference of kernels/gemm_bf16_invariant.hpp: the BF16 GEMV's reference (sums in double, one
// rounding per stored value) over 8 rows at a time; the CUDA twin is
// kernels/cuda/gemm_bf16_invariant.cu. Rows are independent here by construction: the property the
// CUDA twin has to keep.
#include <algorithm>

#include "kernels/gemm_bf16_invariant.hpp"
#include "kernels/gemv_bf16.hpp"

namespace rlserve::kernels {

kernel_status gemm_bf16_invariant_can_implement(const gemm_bf16_invariant_args& a) {
  if (a.rows < 0 || a.n < 1 || a.k < 16 || a.k % 16 != 0 || a.ldy < a.n ||
      a.rows >= (int64_t{1} << 31) || a.n >= (int64_t{1} << 31) || a.k >= (int64_t{1} << 31))
    return kernel_status::invalid_problem;
  if (a.rows > 0 && (a.x == nullptr || a.w == nullptr || a.y == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status gemm_bf16_invariant_ref(const gemm_bf16_invariant_args& a) {
  if (auto s = gemm_bf16_invariant_can_implement(a); s != kernel_status::ok)
    return s;
  const std::size_t out_bytes = a.f32_out ? 4 : 2;
  for (int64_t r = 0; r < a.rows; r += k_gemv_max_rows) {
    const gemv_bf16_args g{a.x + r * a.k, a.w, static_cast<char*>(a.y) + r * a.ldy * out_bytes,
                           std::min(k_gemv_max_rows, a.rows - r), a.n, a.k, a.ldy, a.f32_out};
    if (auto s = gemv_bf16_ref(g); s != kernel_status::ok)
      return s;
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
