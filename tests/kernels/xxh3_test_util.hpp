// Shared pieces of the XXH3 tests (CPU and GPU): the lengths that reach every branch of the
// algorithm, seeded random bytes, the byte pattern of the committed vectors file (which the
// Python test regenerates) and digest formatting. Header-only; no Boost here so the .cu test can
// include it too.
#pragma once

#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/xxh3.hpp"

namespace rlserve::xxh3_test {

using kernels::k_xxh3_block_len;
using kernels::k_xxh3_stripe_len;

// Every length class (0, 1-3, 4-8, 9-16, 17-128 at each of its four steps, 129-240), the
// boundaries of each, and long inputs that end before, on and after stripe and block boundaries,
// with one, several and more than eight full blocks (the kernel loads 8 blocks at a time).
inline std::vector<uint64_t> class_lengths() {
  std::vector<uint64_t> out = {0,   1,   2,   3,   4,   5,   7,   8,   9,   12,  15,  16,  17,
                               31,  32,  33,  48,  63,  64,  65,  80,  96,  97,  112, 127, 128,
                               129, 130, 143, 144, 145, 160, 200, 223, 224, 239, 240, 241, 242,
                               255, 256, 257, 300, 383, 384, 385, 511, 512, 513, 1000};
  for (uint64_t blocks : {1, 2, 3, 7, 8, 9, 16, 17, 25}) {
    const uint64_t base = blocks * k_xxh3_block_len;
    for (int64_t delta : {-65, -64, -63, -1, 0, 1, 63, 64, 65, 500})
      out.push_back(base + delta);
  }
  return out;
}

inline std::vector<std::byte> random_bytes(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng();
    for (int k = 0; k < 8; ++k)
      out[i + k] = static_cast<std::byte>(r >> (8 * k));
  }
  for (uint64_t r = rng(); i < n; ++i, r >>= 8)
    out[i] = static_cast<std::byte>(r);
  return out;
}

// The committed vectors' bytes: a 64-bit LCG started at the length, one byte per step (its top
// 8 bits). tests/python/test_xxh3.py writes the same formula.
inline std::vector<std::byte> vector_bytes(uint64_t n) {
  std::vector<std::byte> out(n);
  uint64_t state = n;
  for (uint64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<std::byte>(state >> 56);
  }
  return out;
}

// The lengths of tests/data/xxh3_vectors.tsv.
inline std::vector<uint64_t> vector_lengths() {
  return {0,    1,    2,    3,    4,    5,    8,    9,    15,    16,    17,    31,    32,   33,
          63,   64,   65,   96,   97,   127,  128,  129,  200,   239,   240,   241,   255,  256,
          257,  511,  1023, 1024, 1025, 1087, 2048, 4095, 4096,  16383, 16384, 16385, 65536,
          100000, 300007};
}

inline std::string hex16(uint64_t digest) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, digest);
  return text;
}

} // namespace rlserve::xxh3_test
