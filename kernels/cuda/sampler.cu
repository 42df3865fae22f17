// GPU sampler (kernels/sampler.hpp, sample_launch): model::sampler::sample's rule, one CTA of
// 1024 threads per row, a fixed sequence of passes over the row, deterministic (integer and
// fixed-point sums only: no float atomics), no workspace.
//
//   pass 1   online max / sum-exp of z = logit / T and the argmax (NaN = -inf)  -> lse, greedy token
//   id order (no top-k, no top-p; min-p or nothing): per-warp masses of the kept tokens over 32
//            contiguous chunks of the row, then one warp walks the chunk where the running mass
//            passes uniform * kept mass (the CPU sampler's id-order walk).
//   sorted order (top-k or top-p on):
//   pass 2   histogram of (max z - z) in 1/16 bins: counts and masses -> the coarse bin that holds
//            the last candidate of top-k / top-p (+1 bin of margin) / min-p
//   pass 3   the candidates (<= 8192) go to shared memory as 64-bit keys (p bits, ~id), a bitonic
//            sort puts them most probable first (ties: lower id), and a block scan of their masses
//            gives the top-p cut, the min-p cut, the kept mass and the walk, exactly as the CPU does.
//   fallback when more than 8192 candidates: the same cuts by bisection on the 62-bit key over the
//            whole row (one pass per bit; slow, only for very flat distributions with wide filters).
// Top-p replay (want_kept): the sorted path lists the kept set from the sorted keys (their first n,
// already in the CPU's order) and reports the logprob over it (one more block sum, in double);
// greedy rows list the token. The id-order walk and the bisection fallback never hold the set in
// one place, so they answer -1 (not listed) and the runner samples such a row on the host.
// Masses are fixed point (p * 2^60 in uint64): every float p >= 2^-36 is summed exactly.
// p = expf(z - lse) in fp32: a token can differ from the CPU's (double) choice only when the uniform
// falls within ~1e-6 relative of a boundary, or when two different probabilities round apart
// differently in float. The reported logprob is the host's: one more pass, in double (host_log_norm).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/cuda/sampler_device.cuh"
#include "kernels/sampler.hpp"

namespace rlserve::kernels {

namespace {

using namespace sampler_device;

__global__ void __launch_bounds__(k_threads)
sample_kernel(const float* __restrict__ logits, const float* __restrict__ temperature,
              const int32_t* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ min_p,
              const float* __restrict__ uniform, int32_t* __restrict__ token_out, float* __restrict__ logprob_out,
              int64_t V, const int32_t* __restrict__ want_kept, int32_t* __restrict__ kept_ids,
              int32_t* __restrict__ kept_count, int32_t kept_cap) {
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
  const float T = temperature[r];
  const bool want = want_kept != nullptr && want_kept[r] != 0 && T >= 0.0f;
  // Top-p replay: slots 1.. of the row's list are -1 and its count `count`; slot 0 holds `first`
  // (-1: none). Called by every thread of the block.
  auto list = [&](int32_t count, int32_t first) {
    if (want_kept == nullptr)
      return;
    for (int i = tid; i < kept_cap; i += k_threads)
      kept_ids[r * kept_cap + i] = i == 0 ? first : -1;
    if (tid == 0)
      kept_count[r] = count;
  };
  if (T < 0.0f) {
    list(0, -1);
    if (tid == 0) {
      token_out[r] = -1;
      logprob_out[r] = -INFINITY;
    }
    return;
  }
  const bool greedy = !(T >= k_greedy_temperature);
  const float inv_t = greedy ? 1.0f : 1.0f / T;
  // The logprob is reported against host_log_norm (sampler_device.cuh): the host's arithmetic, so a
  // request's logprobs do not depend on whether its step sampled on the device or on the host
  // (a batch with a prefill in it).

  // ---- pass 1: max, argmax (lowest id), sum of exp(z - max)
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
  // argmax across the block
  {
    float b = best;
    int bi = best_i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, b, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > b || (ob == b && oi < bi)) {
        b = ob;
        bi = oi;
      }
    }
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
    best = b;
    best_i = bi == 0x7fffffff ? 0 : bi;
  }
  // max and sum of finite z
  __syncthreads();
  {
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
    const double part = m == -INFINITY ? 0.0 : double(s) * exp(double(m) - double(M));
    const double total = block_sum_double(part, scr);
    s = static_cast<float>(total);
    m = M;
    __syncthreads();
    if (greedy) {
      const bool finite = best != INFINITY && best != -INFINITY;
      const double norm = finite ? host_log_norm(row, V, best, 1.0, scr) : 0.0; // every thread: it syncs the block
      if (want)
        list(1, best_i);
      else
        list(0, -1);
      if (tid == 0) {
        token_out[r] = best_i;
        if (best == INFINITY)
          logprob_out[r] = 0.0f;
        else if (best == -INFINITY)
          logprob_out[r] = -INFINITY;
        else
          logprob_out[r] = want ? 0.0f : scaled_logprob(double(best), double(best), norm); // -norm
      }
      return;
    }
    if (best == INFINITY || best == -INFINITY || !(M > -INFINITY)) {
      if (want)
        list(1, 0);
      else
        list(0, -1);
      if (tid == 0) {
        token_out[r] = 0;
        logprob_out[r] = -INFINITY;
      }
      return;
    }
    const double lse_d = double(M) + log(total);
    // store lse in s_f[0] after everyone read s_f
    __syncthreads();
    if (tid == 0) {
      scr.d[0] = lse_d;
    }
    __syncthreads();
  }
  const double lse_d = scr.d[0];
  const float lse = static_cast<float>(lse_d);
  const double norm = host_log_norm(row, V, best, 1.0 / double(T), scr); // the logprob's
  const float p_max = expf(m - lse);
  const int32_t k = top_k[r];
  const float tp = top_p[r], mp = min_p[r];
  const bool use_k = k > 0 && k < V, use_p = tp < 1.0f, use_m = mp > 0.0f;
  const float thr = mp * p_max;
  const double u = uniform[r];
  auto prob_of = [&](float l) { // p of a logit (NaN already -inf)
    const float z = l * inv_t;
    return z == -INFINITY ? 0.0f : expf(z - lse);
  };
  auto prob = [&](int64_t i) { return prob_of(logit_at(row, i)); };
  auto write = [&](int token, double row_norm) { // by one thread
    token_out[r] = token;
    const double inv_t_d = 1.0 / double(T);
    logprob_out[r] = scaled_logprob(scaled_logit(logit_at(row, token), inv_t_d), scaled_logit(best, inv_t_d), row_norm);
  };
  auto finish = [&](int token) {
    if (tid == 0)
      write(token, norm);
  };

  if (!use_k && !use_p) {
    list(want ? -1 : 0, -1); // the id-order walk does not hold the set: the host lists it
    // ---- id-order walk over the kept tokens (p >= thr with min-p)
    const int64_t chunk = ((V + k_warps - 1) / k_warps + 31) / 32 * 32;
    const int64_t c0 = warp * chunk, c1 = c0 + chunk < V ? c0 + chunk : V;
    unsigned long long wm = 0;
    int kept = 0;
    for_each_logit(row, c0 + lane, c1, 32, [&](int64_t, float l) {
      const float p = prob_of(l);
      if (!use_m || p >= thr) {
        wm += to_fx(p);
        ++kept;
      }
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      wm += __shfl_xor_sync(0xffffffffu, wm, o);
    if (lane == 0)
      scr.u[warp] = wm;
    const int n_kept = block_sum_int(kept, scr); // (syncs)
    if (tid == 0) {
      unsigned long long total = 0;
      for (int w = 0; w < k_warps; ++w)
        total += scr.u[w];
      int ww = -1;
      unsigned long long before = 0;
      const double target = u * double(total);
      for (int w = 0; w < k_warps && total > 0; ++w) {
        if (target < double(before + scr.u[w])) {
          ww = w;
          break;
        }
        before += scr.u[w];
      }
      s_int[0] = ww;
      s_u64[0] = before;
      s_u64[1] = total;
    }
    __syncthreads();
    const int ww = s_int[0];
    if (n_kept == 0 || ww < 0) { // nothing kept (min_p > 1) or nothing positive: the most probable
      finish(best_i);
      return;
    }
    if (warp == ww) {
      const double target = u * double(s_u64[1]);
      unsigned long long base = s_u64[0];
      const int64_t w0 = ww * chunk, w1 = w0 + chunk < V ? w0 + chunk : V;
      int found = -1;
      for (int64_t i0 = w0; i0 < w1 && found < 0; i0 += 32) {
        const int64_t i = i0 + lane;
        unsigned long long v = 0;
        if (i < w1) {
          const float p = prob(i);
          if (!use_m || p >= thr)
            v = to_fx(p);
        }
        unsigned long long incl = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o)
            incl += n;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, target < double(base + incl));
        if (hit) {
          found = static_cast<int>(i0) + __ffs(hit) - 1;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
      }
      if (lane == 0)
        write(found >= 0 ? found : best_i, norm);
    }
    return;
  }

  // ---- sorted order: pass 2, coarse histogram
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
    atomicAdd(&hist_count[b], 1);
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
    // ---- pass 3: candidates to shared memory, sorted most probable first
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
        const int at = atomicAdd(&s_int[2], 1);
        keys[at] = (static_cast<unsigned long long>(__float_as_uint(p)) << 32) | (~static_cast<uint32_t>(i));
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
    // block scan of masses: thread tid owns sorted [tid*seg, tid*seg + seg)
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
    // exclusive scan of the thread totals
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
    // top-p cut: c = 1 + first j with incl(j) >= top_p
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
    // min-p cut: the sorted prefix with p >= thr
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
    // kept mass and the walk
    __syncthreads();
#pragma unroll
    for (int e = 0; e < k_seg_max; ++e)
      if (e < seg && tid * seg + e == n3 - 1)
        s_u64[0] = incl[e];
    __syncthreads();
    const double target = u * double(s_u64[0]);
    int first = 0x7fffffff;
#pragma unroll
    for (int e = 0; e < k_seg_max; ++e) {
      const int i = tid * seg + e;
      if (e < seg && i < n3 && target < double(incl[e]) && i < first)
        first = i;
    }
    first = block_min_int(first, scr);
    if (first == 0x7fffffff) { // rounding at the very end: the last positive kept token
      first = 0;
      for (int i = n3 - 1; i >= 0; --i)
        if ((keys[i] >> 32) != 0) {
          first = i;
          break;
        }
    }
    const int token = static_cast<int>(~static_cast<uint32_t>(keys[first] & 0xffffffffu));
    if (!want || n3 > kept_cap) {
      list(want ? -1 : 0, -1);
      finish(token);
      return;
    }
    // Top-p replay: the kept set is keys[0, n3), in the CPU's order; the logprob is taken over it
    // with the host's arithmetic (model::sampler: ties to the top z counted, the rest summed).
    for (int i = tid; i < kept_cap; i += k_threads)
      kept_ids[r * kept_cap + i] = i < n3 ? static_cast<int32_t>(~static_cast<uint32_t>(keys[i] & 0xffffffffu)) : -1;
    if (tid == 0)
      kept_count[r] = n3;
    const double inv_t_d = 1.0 / double(T), m_d = scaled_logit(best, inv_t_d);
    double rest = 0.0;
    int ties = 0;
    for (int i = tid; i < n3; i += k_threads) {
      const int id = static_cast<int>(~static_cast<uint32_t>(keys[i] & 0xffffffffu));
      const double d = sub_rn(scaled_logit(logit_at(row, id), inv_t_d), m_d);
      if (d == 0.0)
        ++ties;
      else
        rest += exp(d);
    }
    rest = block_sum_double(rest, scr);
    __syncthreads();
    ties = block_sum_int(ties, scr);
    if (tid == 0)
      write(token, log_norm(ties, rest));
    return;
  }

  // ---- fallback: bisection on the 62-bit key over the whole row
  list(want ? -1 : 0, -1); // the bisection does not hold the set: the host lists it
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
  unsigned long long total;
  count_mass_ge(row, V, inv_t, lse, kn, scr, c, total);
  if (total == 0) {
    finish(best_i);
    return;
  }
  const double target = u * double(total);
  const unsigned long long kt = max_key([&](int, unsigned long long ms) { return double(ms) > target; });
  finish(static_cast<int>(~static_cast<uint32_t>(kt & 0xffffffffu)));
}

} // namespace

std::size_t sample_workspace_bytes(const sample_args&) { return 0; }

kernel_status sample_launch(const sample_args& a, void*, cudaStream_t stream) {
  if (auto s = sample_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.rows == 0)
    return kernel_status::ok;
  if (a.rows > 0x7fffffff)
    return kernel_status::invalid_problem;
  constexpr std::size_t smem = k_cap * sizeof(unsigned long long);
  RLSERVE_CUDA_TRY(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  RLSERVE_CUDA_TRY(launch_programmatic(sample_kernel, static_cast<unsigned>(a.rows), k_threads, smem, stream, a.logits,
                                      a.temperature, a.top_k, a.top_p, a.min_p, a.uniform, a.token, a.logprob, a.vocab,
                                      a.want_kept, a.kept_ids, a.kept_count, a.kept_cap));
  return kernel_status::ok;
}

} // namespace rlserve::kernels
