#include <cmath>

#include "kernels/cpu_ops.hpp"

namespace rlserve::kernels {

kernel_status silu_mul_can_implement(const silu_mul_args& a) {
  if (a.rows < 0 || a.cols < 0)
    return kernel_status::invalid_problem;
  if (a.rows > 0 && a.cols > 0 && (a.gate_up == nullptr || a.out == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status silu_mul_cpu(const silu_mul_args& a) {
  if (auto s = silu_mul_can_implement(a); s != kernel_status::ok)
    return s;
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* gate = a.gate_up + r * 2 * a.cols; // [cols]
    const float* up = gate + a.cols;                // [cols]
    float* out = a.out + r * a.cols;                // [cols]
    for (int64_t c = 0; c < a.cols; ++c) {
      const float g = gate[c];
      out[c] = g / (1.0f + std::exp(-g)) * up[c]; // silu(g) = g * sigmoid(g)
    }
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
