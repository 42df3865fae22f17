#include <cmath>
#include <vector>

#include "kernels/cpu_ops.hpp"

namespace rlserve::kernels {

kernel_status rope_can_implement(const rope_args& args) {
  if (args.tokens < 0 || args.heads < 0 || args.head_dim <= 0 || args.head_dim % 2 != 0 ||
      args.first_position < 0 || !(args.theta > 0.0))
    return kernel_status::invalid_problem;
  if (args.tokens > 0 && args.heads > 0 && args.x == nullptr)
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status rope_cpu(const rope_args& args) {
  if (auto s = rope_can_implement(args); s != kernel_status::ok)
    return s;
  const int64_t half = args.head_dim / 2;
  // inv_freq[i] = theta^(-2i/d), as transformers' default RoPE init computes it.
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(args.theta, -2.0 * double(i) / double(args.head_dim));
  std::vector<float> cos_t(half), sin_t(half); // [half] for the current token
  for (int64_t t = 0; t < args.tokens; ++t) {
    const double pos = double(args.first_position + t);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * inv_freq[i];
      cos_t[i] = static_cast<float>(std::cos(angle));
      sin_t[i] = static_cast<float>(std::sin(angle));
    }
    for (int64_t h = 0; h < args.heads; ++h) {
      float* x = args.x + (t * args.heads + h) * args.head_dim; // [head_dim]
      // rotate_half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), x1 = x[:d/2], x2 = x[d/2:]
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cos_t[i] - x2 * sin_t[i];
        x[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
      }
    }
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
