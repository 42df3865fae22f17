// The normalizer behind every logprob the engine reports, logprob_i = z_i - log(sum_j exp(z_j)),
// z = logit / T in double. model::sampler, the CPU kernels' twins and the device samplers
// (kernels/cuda/sampler_device.cuh) all finish it here, so the host and the device report the same
// float for the same row although they add the terms in different orders.
//
// It is kept relative to m = max z: log_norm = log(sum_j exp(z_j - m)), logprob_i = (z_i - m) -
// log_norm. When the top token holds nearly all the mass (a low temperature, a peaked row) its
// logprob is -log_norm, about -1e-14, a number float holds exactly. Two roundings would decide it
// otherwise: 1 + rest keeps only the leading bits of a small rest (and which bits depends on the
// order of the additions), and m + log_norm loses whatever lies below m's last bit. So the top
// terms (z_j == m, exactly 1 each) are counted apart, the others summed, log1p taken of the rest,
// and m never added.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RLSERVE_HOST_DEVICE __host__ __device__
#else
#define RLSERVE_HOST_DEVICE
#endif

namespace rlserve::kernels {

// The products and differences below are written with the device's explicitly rounded operations:
// nvcc would otherwise contract double(l) * inv_t - m into one fma, which keeps the product's
// rounding error, so the top token's z - m would not be 0 on the device (it is on the host, where
// the product is rounded first) and the device would count no ties.
RLSERVE_HOST_DEVICE inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
RLSERVE_HOST_DEVICE inline double sub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

// z of a logit (NaN and masked logits are -inf before they get here).
RLSERVE_HOST_DEVICE inline double scaled_logit(float logit, double inv_t) { return mul_rn(double(logit), inv_t); }

// log(sum_j exp(z_j - m)) from `ties`, how many z_j equal m (at least 1), and `rest`, the sum of
// exp(z_j - m) over the others.
RLSERVE_HOST_DEVICE inline double log_norm(int64_t ties, double rest) {
  return log1p(static_cast<double>(ties - 1) + rest);
}

// The logprob of a token whose scaled logit is z.
RLSERVE_HOST_DEVICE inline float scaled_logprob(double z, double m, double log_norm_of_row) {
  return static_cast<float>(sub_rn(sub_rn(z, m), log_norm_of_row));
}

// The host's log_norm of a row: `scaled(i)` is z_i (double; -inf for a masked or NaN logit).
template <class Scaled>
double row_log_norm(int64_t n, double m, Scaled&& scaled) {
  int64_t ties = 0;
  double rest = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = sub_rn(scaled(i), m);
    if (d == 0.0)
      ++ties;
    else
      rest += std::exp(d);
  }
  return log_norm(ties, rest);
}

} // namespace rlserve::kernels

#undef RLSERVE_HOST_DEVICE
