// CPU reference of kernels/gemv_bf16.hpp (plain loops, sums in double, one bf16 rounding per stored
// value); the CUDA twin is kernels/cuda/gemv_bf16.cu.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/gemv_bf16.hpp"

namespace rlserve::kernels {

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

} // namespace rlserve::kernels
