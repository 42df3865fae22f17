#include <cmath>

#include "kernels/rms_norm.hpp"

namespace rlserve::kernels {

kernel_status rms_norm_can_implement(const rms_norm_args& args) {
  if (args.rows < 0 || args.cols <= 0 || !(args.eps >= 0.0f))
    return kernel_status::invalid_problem;
  if (args.rows > 0 && (args.x == nullptr || args.weight == nullptr || args.y == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status rms_norm_ref(const rms_norm_args& args) {
  if (auto s = rms_norm_can_implement(args); s != kernel_status::ok)
    return s;
  for (int64_t r = 0; r < args.rows; ++r) {
    const float* x = args.x + r * args.cols;
    float* y = args.y + r * args.cols;
    double sum_sq = 0.0;
    for (int64_t c = 0; c < args.cols; ++c)
      sum_sq += static_cast<double>(x[c]) * x[c];
    auto inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / args.cols + args.eps));
    for (int64_t c = 0; c < args.cols; ++c)
      y[c] = x[c] * inv_rms * args.weight[c];
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
