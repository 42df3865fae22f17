// One row of residual add + RMSNorm (kernels/decoder_ops.hpp, add_rms_norm) by a CTA of
// k_norm_threads threads. add_rms_norm_kernel (kernels/cuda/decoder_ops.cu) and the BF16 GEMV's
// norm prologue (kernels/cuda/gemv_bf16.cu) both run it, so a row normed inside the GEMV has the
// bits the separate kernel would give it: thread t holds the 8-column chunks t, t + 256, ..., sums
// its squares with fmaf in chunk order, and the block sums the threads' partials in warp order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace rlserve::kernels::norm_row {

constexpr int k_norm_threads = 256;
constexpr int k_norm_chunks = 8; // 8-column chunks per thread: cols <= 256 * 8 * 8 = 16384
constexpr int64_t k_norm_max_cols = int64_t{k_norm_threads} * k_norm_chunks * 8;

__device__ __forceinline__ uint16_t to_bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

// 8 bf16 in one 16-byte word <-> 8 floats.
__device__ __forceinline__ void unpack8(const uint4& w, float* f) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 pack8(const float* f) {
  uint32_t u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    u[i] = static_cast<uint32_t>(to_bf(f[2 * i])) | (static_cast<uint32_t>(to_bf(f[2 * i + 1])) << 16);
  return make_uint4(u[0], u[1], u[2], u[3]);
}

// The sum of v over the CTA, the same value in every thread. scratch: one float per warp.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads(); // scratch may still be read from a previous call
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w)
    total += scratch[w]; // same order in every thread: a uniform result
  return total;
}

// v = residual_in (+ float(delta)); residual_out = v where given (may be residual_in itself);
// out = bf16(v * rsqrt(mean(v^2) + eps) * float(weight)). out may be global or shared memory. All
// pointers 16-byte aligned, cols % 8 == 0, cols <= k_norm_max_cols; blockDim.x == k_norm_threads.
__device__ __forceinline__ void add_rms_norm_row(const float* residual_in, float* residual_out,
                                                 const uint16_t* delta, const uint16_t* weight, uint16_t* out,
                                                 int64_t cols, float eps, float* scratch) {
  const int64_t chunks = cols / 8;
  const float4* x = reinterpret_cast<const float4*>(residual_in);
  float4* xo = reinterpret_cast<float4*>(residual_out);
  const uint4* d = reinterpret_cast<const uint4*>(delta);
  float v[k_norm_chunks][8];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < k_norm_chunks; ++i) {
    const int64_t c = threadIdx.x + int64_t{i} * k_norm_threads;
    if (c < chunks) {
      const float4 a = x[2 * c], b = x[2 * c + 1];
      v[i][0] = a.x, v[i][1] = a.y, v[i][2] = a.z, v[i][3] = a.w;
      v[i][4] = b.x, v[i][5] = b.y, v[i][6] = b.z, v[i][7] = b.w;
      if (delta) {
        float dd[8];
        unpack8(d[c], dd);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          v[i][j] += dd[j];
      }
      if (xo) {
        xo[2 * c] = make_float4(v[i][0], v[i][1], v[i][2], v[i][3]);
        xo[2 * c + 1] = make_float4(v[i][4], v[i][5], v[i][6], v[i][7]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j)
        ss = fmaf(v[i][j], v[i][j], ss);
    }
  }
  const float total = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(cols) + eps);
  const uint4* w = reinterpret_cast<const uint4*>(weight);
  uint4* o = reinterpret_cast<uint4*>(out);
#pragma unroll
  for (int i = 0; i < k_norm_chunks; ++i) {
    const int64_t c = threadIdx.x + int64_t{i} * k_norm_threads;
    if (c < chunks) {
      float wf[8], y[8];
      unpack8(__ldg(w + c), wf);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        y[j] = v[i][j] * inv * wf[j];
      o[c] = pack8(y);
    }
  }
}

} // namespace rlserve::kernels::norm_row
