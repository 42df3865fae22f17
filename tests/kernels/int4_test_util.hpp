// Shared pieces of the INT4 tests (CPU and GPU): a seeded generator, BF16 weight fills that hit
// the recipes' corner cases, an independent double-precision oracle of the recipes, a Marlin
// packer ported from its published Python (the executable spec of the serving layout), 0xD5
// poisoning and failure dumps. Header-only; no Boost here so the .cu tests can include it too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/int4_format.hpp"

namespace rlserve::int4_test {

using kernels::int4_recipe;
using kernels::int4_shape;

// ---- named tolerances -----------------------------------------------------------------------------

// |x - (q - z) * scale| <= k_max_error_steps * scale: every recipe rounds to the nearest step and
// its range covers the group (the asymmetric clamp costs at most the half step the zero point
// rounding moved). k_fp32_slack absorbs the one rounding of x / scale in FP32.
constexpr double k_max_error_steps = 0.5;
constexpr double k_fp32_slack = 1e-6;
// Relative RMS error of dequant(quant(w)) against w for Gaussian weights. Measured: ~0.06 (g32
// asym) to ~0.12 (per-channel sym); anything near 1 means a wrong scale or a scrambled layout.
constexpr double k_int4_roundtrip_max_rel_rmse = 0.2;

// ---- generator ------------------------------------------------------------------------------------

struct rng {
  uint64_t state;
  explicit rng(uint64_t seed) : state(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() { // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double gaussian() { // sum of 4 uniforms: bounded, close enough to a bell
    double s = 0;
    for (int i = 0; i < 4; ++i)
      s += uniform();
    return (s - 2.0) * 1.7320508;
  }
};

inline uint16_t bf16(double v) { return kernels::float_to_bf16(static_cast<float>(v)); }

// Plain Gaussian weights of typical magnitude.
inline std::vector<uint16_t> gaussian_weights(std::size_t count, uint64_t seed, double sigma = 0.02) {
  rng r(seed);
  std::vector<uint16_t> w(count);
  for (auto& x : w)
    x = bf16(sigma * r.gaussian());
  return w;
}

// Weights whose groups each pick one adversarial pattern: Gaussian, all zero, constant > 0,
// constant < 0, all positive, all negative, exact .5 ties, small integers, denormals, +-0 mix,
// values under the 1e-5 scale floor, and huge values. `glen` is the group length along k.
inline std::vector<uint16_t> adversarial_weights(const int4_shape& s, uint64_t seed) {
  rng r(seed);
  const int64_t glen = kernels::int4_group_len(s);
  std::vector<uint16_t> w(static_cast<std::size_t>(s.batch * s.n * s.k));
  for (int64_t row = 0; row < s.batch * s.n; ++row)
    for (int64_t g0 = 0; g0 < s.k; g0 += glen) {
      uint16_t* x = w.data() + row * s.k + g0;
      const int mode = static_cast<int>(r.below(12));
      const double c = (1 + r.below(100)) * 0.01;
      for (int64_t i = 0; i < glen; ++i) {
        double v = 0;
        switch (mode) {
          case 0: v = 0.05 * r.gaussian(); break;
          case 1: v = 0; break;
          case 2: v = c; break;
          case 3: v = -c; break;
          case 4: v = 0.01 + 0.1 * r.uniform(); break;
          case 5: v = -0.01 - 0.1 * r.uniform(); break;
          case 6: // amax 7 -> QAT scale 1, range 15 -> asym scale 1: every x.5 is a tie
            v = i == 0 ? 7.0 : (i == 1 ? -7.5 : (i == 2 ? 7.5 : (r.below(15) - 7) + 0.5));
            break;
          case 7: v = static_cast<double>(r.below(16) - 8) / 16.0; break;
          case 8: x[i] = static_cast<uint16_t>(r.below(0x80) | (r.below(2) << 15)); continue;
          case 9: x[i] = r.below(2) ? 0x8000 : (r.below(2) ? 0x0000 : bf16(0.25 * r.gaussian())); continue;
          case 10: v = 1e-6 * r.gaussian(); break;
          case 11: v = 1e30 * r.gaussian(); break;
        }
        x[i] = bf16(v);
      }
    }
  return w;
}

template <class T>
void poison(std::vector<T>& v) {
  // An empty vector's data() may be null, and memset(nullptr, ..., 0) is undefined (UBSan).
  if (!v.empty())
    std::memset(v.data(), 0xD5, v.size() * sizeof(T));
}

template <class T>
bool all_poison(const std::vector<T>& v) {
  std::vector<T> p(v.size());
  poison(p);
  return std::memcmp(p.data(), v.data(), v.size() * sizeof(T)) == 0;
}

// Non-zero "norm" of raw words: the oracle guard against comparing two empty or zero buffers.
template <class T>
double word_norm(const std::vector<T>& v) {
  double s = 0;
  for (auto x : v)
    s += static_cast<double>(x) * static_cast<double>(x);
  return std::sqrt(s);
}

inline std::string shape_tag(const int4_shape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + "_g" +
         std::to_string(s.group_size);
}

// On a mismatch: writes the first differing index and a window of both buffers to
// failure_<what>_<shape>.txt in the working directory; returns the index or -1 when equal.
template <class T>
int64_t compare_or_dump(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                        const int4_shape& s) {
  if (got.size() != want.size())
    return 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      std::ofstream f("failure_" + what + "_" + shape_tag(s) + ".txt");
      f << what << " " << shape_tag(s) << ": first mismatch at " << i << " of " << got.size() << "\n";
      for (std::size_t j = (i > 8 ? i - 8 : 0); j < std::min(got.size(), i + 24); ++j)
        f << j << ": got 0x" << std::hex << static_cast<uint64_t>(got[j]) << " want 0x"
          << static_cast<uint64_t>(want[j]) << std::dec << "\n";
      return static_cast<int64_t>(i);
    }
  return -1;
}

// ---- independent oracle of the recipes ------------------------------------------------------------
// Double precision, then one rounding to float: for a single +, -, / of two floats this is the
// correctly rounded FP32 result (53 >= 2*24 + 2), so it must agree with the FP32 code bit for bit
// without sharing a line of it.

struct oracle_group {
  float scale;  // FP32 scale used for the codes
  int zero;     // 8 for symmetric
  std::vector<uint8_t> codes;
};

inline float f32(double v) { return static_cast<float>(v); }

inline oracle_group oracle_quantize_group(int4_recipe r, const uint16_t* x, int64_t len) {
  double amax = 0, lo = 0, hi = 0;
  for (int64_t i = 0; i < len; ++i) {
    double v = kernels::bf16_to_float(x[i]);
    amax = std::max(amax, std::fabs(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  oracle_group g;
  if (r == int4_recipe::asym)
    g.scale = f32(static_cast<double>(f32(hi - lo)) / 15.0);
  else
    g.scale = f32(amax / (r == int4_recipe::sym_qat ? 7.0 : 7.5));
  g.scale = std::max(g.scale, 1e-5f);
  g.zero = 8;
  if (r == int4_recipe::asym)
    g.zero = static_cast<int>(std::clamp(std::nearbyint(static_cast<double>(f32(-lo / g.scale))), 0.0, 15.0));
  for (int64_t i = 0; i < len; ++i) {
    double q = std::nearbyint(static_cast<double>(f32(kernels::bf16_to_float(x[i]) / static_cast<double>(g.scale))));
    int code;
    if (r == int4_recipe::asym)
      code = static_cast<int>(std::clamp(q + g.zero, 0.0, 15.0));
    else
      code = static_cast<int>(std::clamp(q, r == int4_recipe::sym_qat ? -7.0 : -8.0, 7.0)) + 8;
    g.codes.push_back(static_cast<uint8_t>(code));
  }
  return g;
}

// ---- Marlin's packer, ported from IST-DASLab/marlin `marlin/__init__.py` (_get_perms, Layer.pack)
// codes: [k, n] (math orientation, one code per byte) -> int32 [k/16, 2n].

inline std::vector<int> marlin_perm() {
  std::vector<int> perm;
  for (int i = 0; i < 32; ++i) {
    std::vector<int> perm1;
    const int col = i / 4;
    for (int block = 0; block < 2; ++block)
      for (int row : {2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1})
        perm1.push_back(16 * row + col + 8 * block);
    for (int j = 0; j < 4; ++j)
      for (int p : perm1)
        perm.push_back(p + 256 * j);
  }
  const int interleave[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  std::vector<int> out(perm.size());
  for (std::size_t b = 0; b < perm.size() / 8; ++b)
    for (int s = 0; s < 8; ++s)
      out[8 * b + s] = perm[8 * b + interleave[s]];
  return out;
}

inline std::vector<int32_t> marlin_pack(const std::vector<uint8_t>& codes_kn, int64_t k, int64_t n) {
  const auto perm = marlin_perm();
  // w.reshape((k/16, 16, n/16, 16)).permute((0, 2, 1, 3)).reshape((k/16, n*16))
  std::vector<uint8_t> tiled(static_cast<std::size_t>(k * n));
  for (int64_t kt = 0; kt < k / 16; ++kt)
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t nt = 0; nt < n / 16; ++nt)
        for (int64_t c = 0; c < 16; ++c)
          tiled[kt * n * 16 + nt * 256 + r * 16 + c] = codes_kn[(kt * 16 + r) * n + nt * 16 + c];
  // res.reshape((-1, 1024))[:, perm]
  std::vector<uint8_t> res(tiled.size());
  for (std::size_t chunk = 0; chunk < tiled.size() / 1024; ++chunk)
    for (int p = 0; p < 1024; ++p)
      res[chunk * 1024 + p] = tiled[chunk * 1024 + perm[p]];
  // q |= res[:, i::8] << 4 * i
  std::vector<int32_t> q(res.size() / 8);
  for (std::size_t j = 0; j < q.size(); ++j) {
    uint32_t word = 0;
    for (int i = 0; i < 8; ++i)
      word |= static_cast<uint32_t>(res[8 * j + i]) << (4 * i);
    q[j] = static_cast<int32_t>(word);
  }
  return q;
}

// marlin_permute_scales: s [groups, n] -> same shape, columns permuted.
inline std::vector<uint16_t> marlin_permute_scales(const std::vector<uint16_t>& s, int64_t groups,
                                                   int64_t n, bool grouped) {
  std::vector<int> perm;
  if (grouped) {
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j)
        perm.push_back(i + 8 * j);
  } else {
    for (int i = 0; i < 4; ++i)
      for (int j : {0, 1, 8, 9, 16, 17, 24, 25})
        perm.push_back(2 * i + j);
  }
  std::vector<uint16_t> out(s.size());
  const std::size_t bl = perm.size();
  for (std::size_t b = 0; b < static_cast<std::size_t>(groups * n) / bl; ++b)
    for (std::size_t p = 0; p < bl; ++p)
      out[b * bl + p] = s[b * bl + static_cast<std::size_t>(perm[p])];
  return out;
}

// marlin_zero_points: zp codes [groups, n] -> int32 [groups, n/8].
inline std::vector<int32_t> marlin_zero_points(const std::vector<uint8_t>& zp, int64_t groups, int64_t n) {
  std::vector<int> perm;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j)
      perm.push_back(i + 8 * j);
  std::vector<uint8_t> permuted(zp.size()), inter(zp.size());
  for (std::size_t b = 0; b < zp.size() / 64; ++b)
    for (int p = 0; p < 64; ++p)
      permuted[b * 64 + p] = zp[b * 64 + perm[p]];
  const int interleave[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (std::size_t b = 0; b < zp.size() / 8; ++b)
    for (int s = 0; s < 8; ++s)
      inter[b * 8 + s] = permuted[b * 8 + interleave[s]];
  std::vector<int32_t> out(static_cast<std::size_t>(groups * n / 8));
  for (std::size_t j = 0; j < out.size(); ++j) {
    uint32_t word = 0;
    for (int i = 0; i < 8; ++i)
      word |= static_cast<uint32_t>(inter[8 * j + i]) << (4 * i);
    out[j] = static_cast<int32_t>(word);
  }
  return out;
}

} // namespace rlserve::int4_test
