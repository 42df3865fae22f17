// Dot products of one fp32 vector against R rows at once, the inner loop of matmul_cpu and of
// attention_cpu's scores. Private to kernels/cpu/.
//
// Each dot keeps 8 partial sums in two 4-lane vectors (GCC/Clang vector extensions: plain SSE2 on
// x86-64, NEON on arm64, no intrinsics). Without -ffast-math a compiler may not split a scalar sum
// into lanes itself, and an accumulator array is kept on the stack; named vector locals stay in
// registers (R = 4 rows: 8 accumulators of the 16 SSE registers).
//
// Determinism: row r's result depends only on x and row r, never on R or on the other rows, so
// blocking and threading cannot change a single bit of the output.
#pragma once

#include <cstdint>
#include <cstring>

namespace rlserve::kernels::cpu {

using f32x4 = float __attribute__((vector_size(16)));

inline f32x4 load4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof v); // unaligned load (movups)
  return v;
}

template <int R>
inline void dot_rows(const float* __restrict x, // [k]
                     const float* __restrict w, // [R rows, row stride ldw], k used per row
                     int64_t ldw, int64_t k, float* __restrict out) {
  f32x4 lo[R], hi[R]; // lanes 0-3 and 4-7 of each row's partial sums
  for (int r = 0; r < R; ++r)
    lo[r] = hi[r] = f32x4{0, 0, 0, 0};
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    const f32x4 x_lo = load4(x + p), x_hi = load4(x + p + 4);
    for (int r = 0; r < R; ++r) {
      lo[r] += x_lo * load4(w + r * ldw + p);
      hi[r] += x_hi * load4(w + r * ldw + p + 4);
    }
  }
  if (p < k) { // tail: zero-padded copies, so lane l of the tail lands in lane l as above
    float xt[8] = {}, wt[8] = {};
    std::memcpy(xt, x + p, (k - p) * sizeof(float));
    const f32x4 x_lo = load4(xt), x_hi = load4(xt + 4);
    for (int r = 0; r < R; ++r) {
      std::memcpy(wt, w + r * ldw + p, (k - p) * sizeof(float));
      lo[r] += x_lo * load4(wt);
      hi[r] += x_hi * load4(wt + 4);
    }
  }
  for (int r = 0; r < R; ++r) {
    const f32x4 s = lo[r] + hi[r]; // lanes (0+4, 1+5, 2+6, 3+7)
    out[r] = (s[0] + s[1]) + (s[2] + s[3]);
  }
}

} // namespace rlserve::kernels::cpu
