// Building blocks of the GPU sampler's row passes (kernels/cuda/sampler.cu, read it first), shared
// with the filtered distributions and draws of speculative verification (kernels/cuda/
// spec_verify.cu), so both cut and walk a row the same way: the CTA shape, the fixed point of the
// masses, the prefetching row loop and the deterministic block reductions. Included by .cu files
// only; its definitions stay in an unnamed namespace like the kernels'.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/logprob_norm.hpp"

namespace rlserve::kernels::sampler_device {

namespace {

constexpr int k_threads = 1024;
constexpr int k_warps = k_threads / 32;
constexpr int k_bins = 2048;
constexpr float k_bins_per_unit = 16.0f;
constexpr int k_cap = 8192; // candidates sorted in shared memory
constexpr float k_fx = 1152921504606846976.0f; // 2^60
constexpr double k_fx_d = 1152921504606846976.0;
constexpr float k_greedy_temperature = 1e-6f;

__device__ __forceinline__ float logit_at(const float* row, int64_t i) {
  const float l = row[i];
  return l != l ? -INFINITY : l;
}
__device__ __forceinline__ unsigned long long to_fx(float p) { return static_cast<unsigned long long>(p * k_fx); }

// f(i, logit_at(row, i)) for i = start, start + stride, ... < end, in that order. The loads of
// k_prefetch consecutive elements are issued before any is used: a row pass is a chain of
// dependent global loads per thread (about 150 at vocab 151936), and with one load in flight per
// thread each pass waits out that many memory round trips, which dominated sampling at batch 1
// (docs/performance.md, 'Sampler row passes').
constexpr int k_prefetch = 8;
template <class F>
__device__ __forceinline__ void for_each_logit(const float* row, int64_t start, int64_t end, int64_t stride, F&& f) {
  int64_t i = start;
  for (; i + (k_prefetch - 1) * stride < end; i += k_prefetch * stride) {
    float v[k_prefetch];
#pragma unroll
    for (int u = 0; u < k_prefetch; ++u)
      v[u] = row[i + u * stride];
#pragma unroll
    for (int u = 0; u < k_prefetch; ++u)
      f(i + u * stride, v[u] != v[u] ? -INFINITY : v[u]);
  }
  for (; i < end; i += stride)
    f(i, logit_at(row, i));
}

struct block_scratch {
  double d[k_warps];
  float f[k_warps];
  int i[k_warps];
  unsigned long long u[k_warps];
};

// A block sum in the same order in every call (lanes by xor shuffles, then warps in index
// order), so its bits depend only on the values each thread holds; `slots` holds one per warp.
template <class T>
__device__ T block_sum(T v, T* slots) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0)
    slots[threadIdx.x / 32] = v;
  __syncthreads();
  T t = 0;
  for (int w = 0; w < k_warps; ++w)
    t += slots[w];
  return t;
}
__device__ unsigned long long block_sum_u64(unsigned long long v, block_scratch& s) { return block_sum(v, s.u); }
__device__ int block_sum_int(int v, block_scratch& s) { return block_sum(v, s.i); }
__device__ double block_sum_double(double v, block_scratch& s) { return block_sum(v, s.d); }
// The log_norm a reported logprob is taken against (kernels/logprob_norm.hpp), with the host's
// arithmetic (model::sampler, model::token_logprob): z = double(logit) * inv_t, m = the largest z =
// double(top) * inv_t (`top`, the row's largest logit, finite; a positive factor keeps the order),
// the top terms counted and the others' exp(z - m) summed in double. Only the order of the sum
// differs (per thread, then block_sum), so the float logprob has the host's bits unless a double
// lands within ~1e-16 relative of a float rounding point. Called by every thread (it syncs the
// block); scr is free again on return.
__device__ double host_log_norm(const float* row, int64_t V, float top, double inv_t, block_scratch& scr) {
  const double m = scaled_logit(top, inv_t);
  double rest = 0.0;
  int ties = 0;
  for_each_logit(row, threadIdx.x, V, k_threads, [&](int64_t, float l) {
    const double d = sub_rn(scaled_logit(l, inv_t), m);
    if (d == 0.0)
      ++ties;
    else
      rest += exp(d);
  });
  rest = block_sum_double(rest, scr);
  __syncthreads();
  ties = block_sum_int(ties, scr);
  __syncthreads();
  return log_norm(ties, rest);
}
__device__ int block_min_int(int v, block_scratch& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0)
    s.i[threadIdx.x / 32] = v;
  __syncthreads();
  int t = s.i[0];
  for (int w = 1; w < k_warps; ++w)
    t = min(t, s.i[w]);
  return t;
}

// Bisection helper for the fallback: count and mass of the tokens whose key is >= kq.
__device__ void count_mass_ge(const float* row, int64_t V, float inv_t, float lse, unsigned long long kq,
                              block_scratch& s, int& count, unsigned long long& mass) {
  int c = 0;
  unsigned long long m = 0;
  for_each_logit(row, threadIdx.x, V, k_threads, [&](int64_t i, float l) {
    const float z = l * inv_t;
    const float p = z == -INFINITY ? 0.0f : expf(z - lse);
    const unsigned long long key = (static_cast<unsigned long long>(__float_as_uint(p)) << 32) | (~static_cast<uint32_t>(i));
    if (key >= kq) {
      ++c;
      m += to_fx(p);
    }
  });
  count = block_sum_int(c, s);
  mass = block_sum_u64(m, s);
}

} // namespace

} // namespace rlserve::kernels::sampler_device
