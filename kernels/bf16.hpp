// bfloat16 <-> float on the host, bit-exact with CUDA's __float2bfloat16_rn (round to nearest,
// ties to even; NaN stays NaN) so CPU twins and CUDA kernels agree to the bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace rlserve::kernels {

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it quiet NaN, keep the sign
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u); // ties to even
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// IEEE half <-> float (for F16 checkpoints and scales).
inline float f16_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else { // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) // rounds to >= 65520: overflow to inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) { // below the smallest normal half: subnormal (or zero)
    float magnitude;
    std::memcpy(&magnitude, &abs, sizeof magnitude);
    // Units of 2^-24, rounded to nearest even (the default FP rounding mode); 1024 lands
    // exactly on the smallest normal's encoding.
    auto units = static_cast<uint32_t>(std::nearbyint(magnitude * 16777216.0f));
    return static_cast<uint16_t>(sign | units);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

} // namespace rlserve::kernels
