// The value rule of kernels/fill_random.hpp, shared by the CPU reference and the CUDA kernel.
#pragma once

#include <cstdint>

#include "kernels/int4_format.hpp" // RLSERVE_HD

namespace rlserve::kernels {

RLSERVE_HD inline uint64_t fill_random_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

RLSERVE_HD inline uint64_t fill_random_bits(uint64_t seed, uint64_t i) {
  return fill_random_mix(seed ^ fill_random_mix(i));
}

// lo + (hi - lo) * u with u = top 24 bits / 2^24, in fp32.
RLSERVE_HD inline float fill_random_uniform(uint64_t r, float lo, float hi) {
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

} // namespace rlserve::kernels
