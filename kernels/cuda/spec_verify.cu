// CUDA twins of kernels/spec_verify.hpp. Deterministic: integer and fixed-point sums, block
// reductions in a fixed order, no float atomics; no workspace, no host synchronization.
//
//   filtered_probs_kernel  one CTA of 1024 threads per row: the GPU sampler's passes
//                          (kernels/cuda/sampler.cu) up to the kept set (pass 1: max / sum-exp and
//                          argmax; id order for min-p or nothing, else the bin histogram, the
//                          candidate sort in shared memory and its cuts, or the bisection
//                          fallback), then one pass that writes p / kept mass or 0 per id.
//   spec_verify_kernel     one CTA per sequence: the acceptance loop (scalar reads of p_i(d_i),
//                          q_i(d_i); a block argmax per row when greedy), then at most one draw
//                          over a row: per-warp fixed-point masses of 32 contiguous chunks, one
//                          warp walks the chunk where the running mass passes u * total (the
//                          sampler's id-order walk).
//   spec_logprob_kernel    one CTA per (sequence, row <= max_draft): the logprob of an emitted
//                          token with the host's arithmetic (model::token_logprob: z in double,
//                          double exp and sum; only the sum's order differs, so the host's bits
//                          but for a ~1e-9 chance per row), as the GPU sampler reports it. A
//                          second launch, so that the k + 1 rows of a sequence run in parallel
//                          and only the emitted ones are read.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/cuda/sampler_device.cuh"
#include "kernels/spec_verify.hpp"

namespace rlserve::kernels {

namespace {

using namespace sampler_device;

// floor(v * 2^60) for the draws (kernels/cpu/spec_verify.cpp: the same clamps).
__device__ __forceinline__ unsigned long long to_fx_draw(float v) {
  if (!(v > 0.0f))
    return 0;
  return v < 8.0f ? static_cast<unsigned long long>(v * k_fx) : 1ull << 63;
}

// The block's largest (b, bi) pair, the lowest id among equal values, to every thread (the "no
// value" id 0x7fffffff becomes 0). Barriers before (s_f / s_idx may still be read by an earlier
// call) and after (they are free again on return).
__device__ void block_first_max(float& b, int& bi, float* s_f, int* s_idx) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, b, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ob > b || (ob == b && oi < bi)) {
      b = ob;
      bi = oi;
    }
  }
  __syncthreads();
  if (lane == 0) {
    s_f[warp] = b;
    s_idx[warp] = bi;
  }
  __syncthreads();
  b = s_f[0];
  bi = s_idx[0];
  for (int w = 1; w < k_warps; ++w)
    if (s_f[w] > b || (s_f[w] == b && s_idx[w] < bi)) {
      b = s_f[w];
      bi = s_idx[w];
    }
  if (bi == 0x7fffffff)
    bi = 0;
  __syncthreads();
}

// What every thread learns from pass 1 (the sampler's): M, the largest finite z = logit * inv_t;
// total = sum of exp(z - M) over finite z; best / best_i, the largest logit and its lowest id.
struct row_stats {
  float M;
  double total;
  float best;
  int best_i;
};

__device__ row_stats row_pass1(const float* row, int64_t V, float inv_t, block_scratch& scr, float* s_f, int* s_idx) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
  float m = -INFINITY, s = 0.0f, best = -INFINITY;
  int best_i = 0x7fffffff;
  for_each_logit(row, tid, V, k_threads, [&](int64_t i, float l) {
    if (l > best) { // ids ascend per thread: strict keeps the lowest
      best = l;
      best_i = static_cast<int>(i);
    }
    const float z = l * inv_t;
    if (z == -INFINITY || z == INFINITY)
      return;
    if (z > m) {
      s = s * expf(m - z) + 1.0f;
      m = z;
    } else {
      s += expf(z - m);
    }
  });
  row_stats out;
  out.best = best;
  out.best_i = best_i;
  block_first_max(out.best, out.best_i, s_f, s_idx);
  float mm = m;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
  if (lane == 0)
    s_f[warp] = mm;
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < k_warps; ++w)
    M = fmaxf(M, s_f[w]);
  double part = m == -INFINITY ? 0.0 : double(s) * exp(double(m) - double(M));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    part += __shfl_xor_sync(0xffffffffu, part, o);
  if (lane == 0)
    scr.d[warp] = part;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < k_warps; ++w)
    total += scr.d[w];
  __syncthreads(); // scr and s_f are free again
  out.M = M;
  out.total = total;
  return out;
}

// ---- filtered_probs ------------------------------------------------------------------------------

__global__ void __launch_bounds__(k_threads)
filtered_probs_kernel(const float* __restrict__ logits, const float* __restrict__ temperature,
                      const int32_t* __restrict__ top_k, const float* __restrict__ top_p,
                      const float* __restrict__ min_p, float* __restrict__ probs,
                      float* const* __restrict__ row_out, int64_t V) {
  extern __shared__ unsigned long long keys[]; // [k_cap]
  __shared__ int hist_count[k_bins];
  __shared__ unsigned long long hist_mass[k_bins];
  __shared__ block_scratch scr;
  __shared__ int s_int[4];
  __shared__ unsigned long long s_u64[2];
  __shared__ float s_f[k_warps];
  __shared__ int s_idx[k_warps];

  programmatic_wait(); // the logits of the previous kernel
  programmatic_trigger();
  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
  const float* row = logits + r * V;
  float* out = row_out ? row_out[r] : probs + r * V;
  auto one_hot = [&](int64_t at) {
    for (int64_t i = tid; i < V; i += k_threads)
      out[i] = i == at ? 1.0f : 0.0f;
  };
  const float T = temperature[r];
  if (T < 0.0f) { // padding: zeros
    one_hot(-1);
    return;
  }
  const bool greedy = !(T >= k_greedy_temperature);
  const float inv_t = greedy ? 1.0f : 1.0f / T;
  const row_stats st = row_pass1(row, V, inv_t, scr, s_f, s_idx);
  if (greedy) {
    one_hot(st.best_i);
    return;
  }
  if (st.best == INFINITY || st.best == -INFINITY || !(st.M > -INFINITY)) { // no finite scaled logit
    one_hot(0);
    return;
  }
  const float m = st.M;
  const double lse_d = double(m) + log(st.total);
  const float lse = static_cast<float>(lse_d);
  const float p_max = expf(m - lse);
  const int32_t k = top_k[r];
  const float tp = top_p[r], mp = min_p[r];
  const bool use_k = k > 0 && k < V, use_p = tp < 1.0f, use_m = mp > 0.0f;
  const float thr = mp * p_max;
  auto prob_of = [&](float l) { // p of a logit (NaN already -inf)
    const float z = l * inv_t;
    return z == -INFINITY ? 0.0f : expf(z - lse);
  };
  auto key_of = [&](int64_t i, float p) {
    return (static_cast<unsigned long long>(__float_as_uint(p)) << 32) | (~static_cast<uint32_t>(i));
  };
  // The kept set's final pass: p / mass where kept(i, z, p), else 0.
  auto write_kept = [&](unsigned long long mass, auto kept) {
    const double scale = double(mass) / k_fx_d;
    for_each_logit(row, tid, V, k_threads, [&](int64_t i, float l) {
      const float z = l * inv_t;
      const float p = z == -INFINITY ? 0.0f : expf(z - lse);
      out[i] = kept(i, z, p) ? static_cast<float>(double(p) / scale) : 0.0f;
    });
  };

  if (!use_k && !use_p) {
    // ---- id order: every token, or those with p >= thr (min-p)
    unsigned long long wm = 0;
    int kept = 0;
    for_each_logit(row, tid, V, k_threads, [&](int64_t, float l) {
      const float p = prob_of(l);
      if (!use_m || p >= thr) {
        wm += to_fx(p);
        ++kept;
      }
    });
    const unsigned long long mass = block_sum_u64(wm, scr);
    const int n_kept = block_sum_int(kept, scr);
    if (n_kept == 0 || mass == 0) { // min_p > 1: the most probable alone
      one_hot(st.best_i);
      return;
    }
    write_kept(mass, [&](int64_t, float, float p) { return !use_m || p >= thr; });
    return;
  }

  // ---- sorted order: the sampler's pass 2, coarse histogram
  for (int b = tid; b < k_bins; b += k_threads) {
    hist_count[b] = 0;
    hist_mass[b] = 0;
  }
  __syncthreads();
  auto bin_of = [&](float z) {
    if (z == -INFINITY)
      return k_bins - 1;
    const float d = (m - z) * k_bins_per_unit;
    return d >= float(k_bins - 1) ? k_bins - 1 : static_cast<int>(d);
  };
  int n_minp = 0;
  for_each_logit(row, tid, V, k_threads, [&](int64_t, float l) {
    const float z = l * inv_t;
    const float p = z == -INFINITY ? 0.0f : expf(z - lse);
    const int b = bin_of(z);
    atomicAdd(&hist_count[b], 1); // integer atomics: the counts do not depend on their order
    atomicAdd(&hist_mass[b], to_fx(p));
    n_minp += p >= thr ? 1 : 0;
  });
  n_minp = use_m ? block_sum_int(n_minp, scr) : static_cast<int>(V);
  if (use_m && n_minp == 0)
    n_minp = 1;
  const double tp_fx = double(tp) * k_fx_d;
  if (tid == 0) {
    int bk = k_bins - 1, bp = k_bins - 1, bm = k_bins - 1;
    int cum = 0;
    unsigned long long cm = 0;
    bool fk = !use_k, fp = !use_p, fm = !use_m;
    for (int b = 0; b < k_bins; ++b) {
      cum += hist_count[b];
      cm += hist_mass[b];
      if (!fk && cum >= k) {
        bk = b;
        fk = true;
      }
      if (!fp && double(cm) >= tp_fx) {
        bp = b + 1 < k_bins ? b + 1 : b;
        fp = true;
      }
      if (!fm && cum >= n_minp) {
        bm = b;
        fm = true;
      }
      if (fk && fp && fm)
        break;
    }
    int bb = bk < bp ? bk : bp;
    bb = bb < bm ? bb : bm;
    int cand = 0;
    for (int b = 0; b <= bb; ++b)
      cand += hist_count[b];
    s_int[0] = bb;
    s_int[1] = cand;
    s_int[2] = 0;
  }
  __syncthreads();
  const int bb = s_int[0], cand = s_int[1];
  const int n1 = use_k ? k : static_cast<int>(V);

  if (cand <= k_cap) {
    // ---- pass 3: candidates to shared memory, sorted most probable first (the sampler's)
    int P2 = 1;
    while (P2 < cand)
      P2 <<= 1;
    for (int i = tid; i < P2; i += k_threads)
      keys[i] = 0;
    __syncthreads();
    for_each_logit(row, tid, V, k_threads, [&](int64_t i, float l) {
      const float z = l * inv_t;
      if (bin_of(z) <= bb) {
        const float p = z == -INFINITY ? 0.0f : expf(z - lse);
        const int at = atomicAdd(&s_int[2], 1); // slot order is free: the sort below fixes it
        keys[at] = key_of(i, p);
      }
    });
    __syncthreads();
    for (int kk = 2; kk <= P2; kk <<= 1)
      for (int j = kk >> 1; j > 0; j >>= 1) {
        for (int i = tid; i < P2; i += k_threads) {
          const int ixj = i ^ j;
          if (ixj > i) {
            const unsigned long long a = keys[i], b = keys[ixj];
            const bool desc = (i & kk) == 0;
            if (desc ? a < b : a > b) {
              keys[i] = b;
              keys[ixj] = a;
            }
          }
        }
        __syncthreads();
      }
    const int seg = (cand + k_threads - 1) / k_threads; // <= 8
    constexpr int k_seg_max = k_cap / k_threads;
    unsigned long long incl[k_seg_max];
    unsigned long long run = 0;
#pragma unroll
    for (int e = 0; e < k_seg_max; ++e) {
      const int i = tid * seg + e;
      if (e < seg && i < cand)
        run += to_fx(__uint_as_float(static_cast<uint32_t>(keys[i] >> 32)));
      incl[e] = run;
    }
    unsigned long long x = run;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long n = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o)
        x += n;
    }
    __syncthreads();
    if (lane == 31)
      scr.u[warp] = x;
    __syncthreads();
    unsigned long long woff = 0;
    for (int w = 0; w < warp; ++w)
      woff += scr.u[w];
    const unsigned long long off = woff + x - run;
#pragma unroll
    for (int e = 0; e < k_seg_max; ++e)
      incl[e] += off;
    int n2 = n1 < cand ? n1 : cand;
    if (use_p) {
      int first = 0x7fffffff;
#pragma unroll
      for (int e = 0; e < k_seg_max; ++e) {
        const int i = tid * seg + e;
        if (e < seg && i < cand && double(incl[e]) >= tp_fx && i < first)
          first = i;
      }
      first = block_min_int(first, scr);
      if (first != 0x7fffffff && first + 1 < n2)
        n2 = first + 1;
    }
    int n3 = n2;
    if (use_m) {
      int first = 0x7fffffff;
#pragma unroll
      for (int e = 0; e < k_seg_max; ++e) {
        const int i = tid * seg + e;
        if (e < seg && i < n2 && __uint_as_float(static_cast<uint32_t>(keys[i] >> 32)) < thr && i < first)
          first = i;
      }
      first = block_min_int(first, scr);
      if (first < n3)
        n3 = first;
      if (n3 == 0)
        n3 = 1;
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < k_seg_max; ++e)
      if (e < seg && tid * seg + e == n3 - 1)
        s_u64[0] = incl[e];
    __syncthreads();
    const unsigned long long mass = s_u64[0], kth = keys[n3 - 1];
    if (mass == 0) {
      one_hot(st.best_i);
      return;
    }
    // Kept: the candidates whose key is among the n3 largest (keys are unique: they hold the id).
    write_kept(mass, [&](int64_t i, float z, float p) { return bin_of(z) <= bb && key_of(i, p) >= kth; });
    return;
  }

  // ---- fallback: bisection on the 62-bit key over the whole row (the sampler's)
  auto max_key = [&](auto pred) { // the largest key kq with pred(count(>= kq), mass(>= kq))
    unsigned long long kq = 0;
    for (int bit = 61; bit >= 0; --bit) {
      const unsigned long long c = kq | (1ull << bit);
      int cnt;
      unsigned long long ms;
      count_mass_ge(row, V, inv_t, lse, c, scr, cnt, ms);
      if (pred(cnt, ms))
        kq = c;
    }
    return kq;
  };
  int n2 = n1;
  if (use_p) {
    int cnt0;
    unsigned long long all;
    count_mass_ge(row, V, inv_t, lse, 0, scr, cnt0, all);
    if (double(all) >= tp_fx) {
      const unsigned long long ke = max_key([&](int, unsigned long long ms) { return double(ms) >= tp_fx; });
      int c;
      unsigned long long ms;
      count_mass_ge(row, V, inv_t, lse, ke, scr, c, ms);
      n2 = c < n2 ? c : n2;
    }
  }
  const int n3 = use_m ? (n_minp < n2 ? n_minp : n2) : n2;
  const unsigned long long kn = max_key([&](int cnt, unsigned long long) { return cnt >= n3; });
  int c;
  unsigned long long mass;
  count_mass_ge(row, V, inv_t, lse, kn, scr, c, mass);
  if (mass == 0) {
    one_hot(st.best_i);
    return;
  }
  write_kept(mass, [&](int64_t i, float, float p) { return key_of(i, p) >= kn; });
}

// ---- spec_verify ---------------------------------------------------------------------------------

// The first maximum of a probability row (lowest id among equal values), to every thread.
__device__ int block_argmax(const float* row, int64_t V, float* s_f, int* s_idx) {
  const int tid = threadIdx.x;
  float b = -INFINITY;
  int bi = 0x7fffffff;
  for_each_logit(row, tid, V, k_threads, [&](int64_t i, float v) {
    if (v > b) {
      b = v;
      bi = static_cast<int>(i);
    }
  });
  block_first_max(b, bi, s_f, s_idx);
  return bi;
}

// The draw of kernels/spec_verify.hpp over weight(i) >= 0, to every thread: the first id whose
// fixed-point running mass exceeds u * total, -1 when nothing weighs. Warp w sums the contiguous
// chunk [w * chunk, (w + 1) * chunk), thread 0 finds the chunk the target falls in, and its warp
// walks it 32 ids at a time with a shuffle scan; all sums are uint64, so the order is free.
template <class Weight>
__device__ int block_draw(int64_t V, float u, Weight weight, block_scratch& scr, int* s_int,
                          unsigned long long* s_u64) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
  const int64_t chunk = ((V + k_warps - 1) / k_warps + 31) / 32 * 32;
  const int64_t c0 = warp * chunk, c1 = c0 + chunk < V ? c0 + chunk : V;
  unsigned long long wm = 0;
  for (int64_t i = c0 + lane; i < c1; i += 32)
    wm += to_fx_draw(weight(i));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    wm += __shfl_xor_sync(0xffffffffu, wm, o);
  __syncthreads();
  if (lane == 0)
    scr.u[warp] = wm;
  __syncthreads();
  if (tid == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < k_warps; ++w)
      total += scr.u[w];
    const double t = double(u) * double(total);
    int ww = -1;
    unsigned long long before = 0;
    for (int w = 0; w < k_warps && total > 0; ++w) {
      if (t < double(before + scr.u[w])) {
        ww = w;
        break;
      }
      before += scr.u[w];
    }
    s_int[0] = ww;
    s_int[1] = -1;
    s_u64[0] = before;
    s_u64[1] = total;
  }
  __syncthreads();
  const int ww = s_int[0];
  if (warp == ww) {
    const double t = double(u) * double(s_u64[1]);
    unsigned long long base = s_u64[0];
    int found = -1;
    for (int64_t i0 = c0; i0 < c1 && found < 0; i0 += 32) {
      const int64_t i = i0 + lane;
      const unsigned long long v = i < c1 ? to_fx_draw(weight(i)) : 0;
      unsigned long long incl = v;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
          incl += n;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, t < double(base + incl));
      if (hit)
        found = static_cast<int>(i0) + __ffs(hit) - 1;
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0)
      s_int[1] = found;
  }
  __syncthreads();
  const int token = s_int[1];
  __syncthreads(); // s_int is free again
  return token;
}

// The layout of sequence s as the device reads it; false for one out of range (kernels/
// spec_verify.hpp: such a sequence gets accepted -1 and nothing else).
__device__ __forceinline__ bool read_layout(const int32_t* offset, int64_t s, int64_t drafts, int64_t max_draft,
                                            int64_t& o0, int64_t& k) {
  o0 = offset[s];
  const int64_t o1 = offset[s + 1];
  k = o1 - o0;
  return o0 >= 0 && o1 <= drafts && k >= 0 && k <= max_draft;
}

__global__ void __launch_bounds__(k_threads)
spec_verify_kernel(const float* __restrict__ p, const float* __restrict__ q, const float* const* __restrict__ p_rows,
                   const float* const* __restrict__ q_rows, const float* __restrict__ temperature,
                   const int32_t* __restrict__ offset, const int32_t* __restrict__ draft_tokens,
                   const float* __restrict__ uniform, int32_t* __restrict__ accepted, int32_t* __restrict__ token,
                   float* __restrict__ logprob, int64_t V, int64_t drafts, int64_t max_draft) {
  __shared__ block_scratch scr;
  __shared__ float s_f[k_warps];
  __shared__ int s_idx[k_warps];
  __shared__ int s_int[2];
  __shared__ unsigned long long s_u64[2];

  programmatic_wait(); // the probabilities of the previous kernels
  programmatic_trigger();
  const int64_t s = blockIdx.x;
  const int tid = threadIdx.x;
  int64_t o0, k;
  if (!read_layout(offset, s, drafts, max_draft, o0, k)) {
    if (tid == 0)
      accepted[s] = -1;
    return;
  }
  const int64_t row0 = o0 + s;
  const float T = temperature[s];
  if (T < 0.0f) { // padding
    for (int64_t j = tid; j <= k; j += k_threads) {
      token[row0 + j] = -1;
      logprob[row0 + j] = -INFINITY;
    }
    if (tid == 0)
      accepted[s] = -1;
    return;
  }
  const bool greedy = !(T >= k_greedy_temperature);
  auto p_row = [&](int64_t j) { return p_rows ? p_rows[row0 + j] : p + (row0 + j) * V; };
  auto q_row = [&](int64_t i) { return q_rows ? q_rows[o0 + i] : q + (o0 + i) * V; };
  // n and last are the same in every thread: each comes from scalar reads or a block reduction.
  int64_t n = 0;
  int last = -1;
  for (; n < k; ++n) {
    const int32_t d = draft_tokens[o0 + n];
    if (greedy) {
      const int best = block_argmax(p_row(n), V, s_f, s_idx);
      if (best != d) {
        last = best;
        break;
      }
      continue;
    }
    const bool in_vocab = d >= 0 && d < V;
    const float pd = in_vocab ? p_row(n)[d] : 0.0f, qd = in_vocab ? q_row(n)[d] : 0.0f;
    const float u = uniform[row0 + n];
    const bool keep = qd > 0.0f ? double(u) * double(qd) < double(pd) : double(u) < double(pd);
    if (!keep) {
      const float* pr = p_row(n);
      const float* qr = q_row(n);
      const float uf = uniform[row0 + k];
      last = block_draw(V, uf, [&](int64_t j) { const float r = pr[j] - qr[j]; return r > 0.0f ? r : 0.0f; }, scr,
                        s_int, s_u64);
      if (last < 0)
        last = block_draw(V, uf, [&](int64_t j) { return pr[j]; }, scr, s_int, s_u64);
      break;
    }
  }
  if (n == k) {
    const float* pr = p_row(k);
    last = greedy ? block_argmax(pr, V, s_f, s_idx)
                  : block_draw(V, uniform[row0 + k], [&](int64_t j) { return pr[j]; }, scr, s_int, s_u64);
  }
  if (tid == 0)
    accepted[s] = static_cast<int32_t>(n);
  for (int64_t j = tid; j <= k; j += k_threads) {
    token[row0 + j] = j < n ? draft_tokens[o0 + j] : j == n ? last : -1;
    if (j > n)
      logprob[row0 + j] = -INFINITY; // rows up to n: spec_logprob_kernel
  }
}

__global__ void __launch_bounds__(k_threads)
spec_logprob_kernel(const float* __restrict__ logits, const float* __restrict__ temperature,
                    const int32_t* __restrict__ offset, const int32_t* __restrict__ accepted,
                    const int32_t* __restrict__ token, float* __restrict__ logprob, int64_t V, int64_t drafts,
                    int64_t max_draft) {
  __shared__ block_scratch scr;
  __shared__ float s_f[k_warps];
  __shared__ int s_idx[k_warps];

  programmatic_wait(); // accepted and token of spec_verify_kernel
  programmatic_trigger();
  const int64_t s = blockIdx.x, j = blockIdx.y;
  int64_t o0, k;
  if (!read_layout(offset, s, drafts, max_draft, o0, k) || j > k)
    return;
  const float T = temperature[s];
  const int32_t n = accepted[s];
  if (T < 0.0f || j > n)
    return;
  const int64_t r = o0 + s + j;
  const float* row = logits + r * V;
  const double inv_t = T >= k_greedy_temperature ? 1.0 / double(T) : 1.0;
  float top = -INFINITY;
  for_each_logit(row, threadIdx.x, V, k_threads, [&](int64_t, float l) { top = fmaxf(top, l); });
  int top_id = 0;
  block_first_max(top, top_id, s_f, s_idx);
  if (top == INFINITY || top == -INFINITY) { // the host's !isfinite(m)
    if (threadIdx.x == 0)
      logprob[r] = -INFINITY;
    return;
  }
  const double norm = host_log_norm(row, V, top, inv_t, scr);
  if (threadIdx.x == 0) {
    const int32_t t = token[r];
    logprob[r] = t >= 0 && t < V ? scaled_logprob(scaled_logit(logit_at(row, t), inv_t), scaled_logit(top, inv_t), norm)
                                 : -INFINITY;
  }
}

} // namespace

kernel_status filtered_probs_launch(const filtered_probs_args& a, cudaStream_t stream) {
  if (auto s = filtered_probs_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.rows == 0)
    return kernel_status::ok;
  if (a.rows > 0x7fffffff)
    return kernel_status::invalid_problem;
  constexpr std::size_t smem = k_cap * sizeof(unsigned long long);
  RLSERVE_CUDA_TRY(cudaFuncSetAttribute(filtered_probs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  RLSERVE_CUDA_TRY(launch_programmatic(filtered_probs_kernel, static_cast<unsigned>(a.rows), k_threads, smem, stream,
                                       a.logits, a.temperature, a.top_k, a.top_p, a.min_p, a.probs, a.row_out,
                                       a.vocab));
  return kernel_status::ok;
}

kernel_status spec_verify_launch(const spec_verify_args& a, cudaStream_t stream) {
  if (auto s = spec_verify_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.sequences == 0)
    return kernel_status::ok;
  const auto S = static_cast<unsigned>(a.sequences); // < 2^31 (can_implement)
  RLSERVE_CUDA_TRY(launch_programmatic(spec_verify_kernel, S, k_threads, 0, stream, a.target_probs, a.draft_probs,
                                       a.target_rows, a.draft_rows,
                                       a.temperature, a.draft_offset, a.draft_tokens, a.uniform, a.accepted, a.token,
                                       a.logprob, a.vocab, a.drafts, a.max_draft));
  RLSERVE_CUDA_TRY(launch_programmatic(spec_logprob_kernel, dim3(S, static_cast<unsigned>(a.max_draft + 1)),
                                       k_threads, 0, stream, a.target_logits, a.temperature, a.draft_offset,
                                       a.accepted, a.token, a.logprob, a.vocab, a.drafts, a.max_draft));
  return kernel_status::ok;
}

} // namespace rlserve::kernels
