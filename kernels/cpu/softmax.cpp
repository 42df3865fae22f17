#include <algorithm>
#include <cmath>

#include "kernels/cpu_ops.hpp"

namespace rlserve::kernels {

namespace {

// max and log(sum(exp(x - max))) of one row; -inf entries contribute nothing.
void row_stats(const float* x, int64_t cols, float& max_out, double& log_sum_out) {
  float m = -INFINITY;
  for (int64_t c = 0; c < cols; ++c)
    m = std::max(m, x[c]);
  double sum = 0.0;
  for (int64_t c = 0; c < cols; ++c)
    sum += std::exp(double(x[c]) - double(m));
  max_out = m;
  log_sum_out = std::log(sum);
}

} // namespace

kernel_status softmax_can_implement(const softmax_args& a) {
  if (a.rows < 0 || a.cols <= 0)
    return kernel_status::invalid_problem;
  if (a.rows > 0 && (a.x == nullptr || a.y == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status softmax_cpu(const softmax_args& a) {
  if (auto s = softmax_can_implement(a); s != kernel_status::ok)
    return s;
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.cols; // [cols]
    float* y = a.y + r * a.cols;       // [cols]
    float m;
    double log_sum;
    row_stats(x, a.cols, m, log_sum);
    for (int64_t c = 0; c < a.cols; ++c)
      y[c] = static_cast<float>(std::exp(double(x[c]) - double(m) - log_sum));
  }
  return kernel_status::ok;
}

kernel_status log_softmax_cpu(const softmax_args& a) {
  if (auto s = softmax_can_implement(a); s != kernel_status::ok)
    return s;
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.cols; // [cols]
    float* y = a.y + r * a.cols;       // [cols]
    float m;
    double log_sum;
    row_stats(x, a.cols, m, log_sum);
    for (int64_t c = 0; c < a.cols; ++c)
      y[c] = static_cast<float>(double(x[c]) - double(m) - log_sum);
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
