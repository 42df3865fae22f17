// CPU reference of kernels/gemm_bf16_invariant.hpp (plain loops, sums in double, one rounding per
// stored value); the CUDA twin is kernels/cuda/gemm_bf16_invariant.cu. Rows are independent here
// by construction: the property the CUDA twin has to keep.
#include "kernels/bf16.hpp"
#include "kernels/gemm_bf16_invariant.hpp"

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

} // namespace rlserve::kernels
