// CUDA twins of the small decoder ops of kernels/decoder_ops.hpp: embedding gather, residual add +
// RMSNorm, q/k-norm + RoPE + paged KV write, SiLU-mul. All 16-byte vectorized, one warp or CTA per
// row/head, fp32 math, one bf16 rounding per stored value; graph-capturable (grids depend only on
// the static sizes, per-step data is read from device memory). Launched as programmatic dependents
// (kernels/cuda/programmatic_launch.cuh): every kernel waits for its predecessor first thing.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/decoder_ops.hpp"

namespace rlserve::kernels {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
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

// ---- embedding: one warp per token, 8 columns per lane and step -----------------------------------
constexpr int k_embed_warps = 8;

__global__ void __launch_bounds__(32 * k_embed_warps)
embed_kernel(const int32_t* __restrict__ ids, const uint16_t* __restrict__ table, float* __restrict__ residual,
             int64_t tokens, int64_t vocab, int64_t hidden) {
  programmatic_wait();
  programmatic_trigger();
  const int64_t t = int64_t{blockIdx.x} * k_embed_warps + threadIdx.x / 32;
  if (t >= tokens)
    return;
  const int lane = threadIdx.x & 31;
  const int64_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  const uint4* src = reinterpret_cast<const uint4*>(table + (valid ? id : 0) * hidden);
  float4* dst = reinterpret_cast<float4*>(residual + t * hidden);
  for (int64_t c = lane; c < hidden / 8; c += 32) {
    float f[8] = {};
    if (valid)
      unpack8(__ldg(src + c), f);
    dst[2 * c] = make_float4(f[0], f[1], f[2], f[3]);
    dst[2 * c + 1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

// ---- residual add + RMSNorm: one CTA per row, the row in registers ------------------------------
constexpr int k_norm_threads = 256;
constexpr int k_norm_chunks = 8; // 8-column chunks per thread: cols <= 256 * 8 * 8 = 16384

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

__global__ void __launch_bounds__(k_norm_threads)
add_rms_norm_kernel(float* __restrict__ residual, const uint16_t* __restrict__ delta,
                    const uint16_t* __restrict__ weight, const int32_t* __restrict__ rows_index,
                    uint16_t* __restrict__ out, int64_t cols, float eps) {
  __shared__ float scratch[k_norm_threads / 32];
  programmatic_wait();
  programmatic_trigger();
  const int64_t r = blockIdx.x;
  const int64_t src = rows_index ? rows_index[r] : r;
  const int64_t chunks = cols / 8;
  uint4* o = reinterpret_cast<uint4*>(out + r * cols);
  if (src < 0) {
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x)
      o[c] = make_uint4(0, 0, 0, 0);
    return;
  }
  float4* x = reinterpret_cast<float4*>(residual + src * cols);
  const uint4* d = reinterpret_cast<const uint4*>(delta + (delta ? src * cols : 0));
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
        x[2 * c] = make_float4(v[i][0], v[i][1], v[i][2], v[i][3]);
        x[2 * c + 1] = make_float4(v[i][4], v[i][5], v[i][6], v[i][7]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j)
        ss = fmaf(v[i][j], v[i][j], ss);
    }
  }
  const float total = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(cols) + eps);
  const uint4* w = reinterpret_cast<const uint4*>(weight);
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

// ---- q/k RMSNorm + RoPE + KV write: one warp per (token, head) ------------------------------------
// Lane l holds dims [l*E, l*E + E) of the low half and the same of the high half (E = D / 64),
// so the rotation pairs sit in one lane. The k-head warps also copy the v head.
constexpr int k_rope_warps = 4;

template <int D>
__global__ void __launch_bounds__(32 * k_rope_warps)
qk_norm_rope_kv_kernel(const uint16_t* __restrict__ qkv, const uint16_t* __restrict__ q_norm,
                       const uint16_t* __restrict__ k_norm, const float* __restrict__ rope_cos,
                       const float* __restrict__ rope_sin, const int32_t* __restrict__ positions,
                       const int32_t* __restrict__ slots, uint16_t* __restrict__ q_out, uint16_t* __restrict__ k_cache,
                       uint16_t* __restrict__ v_cache, int64_t tokens, int32_t q_heads, int32_t kv_heads,
                       int64_t max_positions, int64_t num_slots, float eps) {
  constexpr int E = D / 64, half = D / 2;
  programmatic_wait();
  programmatic_trigger();
  const int64_t unit = int64_t{blockIdx.x} * k_rope_warps + threadIdx.x / 32;
  const int heads = q_heads + kv_heads;
  if (unit >= tokens * heads)
    return;
  const int lane = threadIdx.x & 31;
  const int64_t t = unit / heads;
  const int h = static_cast<int>(unit % heads);
  const bool is_q = h < q_heads;
  const int64_t slot = slots[t];
  if (!is_q && (slot < 0 || slot >= num_slots))
    return; // padding token (or a slot outside the cache): no KV write
  int64_t p = positions[t];
  if (p < 0 || p >= max_positions)
    p = 0;
  const int64_t width = int64_t{q_heads + 2 * kv_heads} * D;
  const uint16_t* x = qkv + t * width + int64_t{h} * D;
  float lo[E], hi[E];
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    lo[e] = bf(x[lane * E + e]);
    hi[e] = bf(x[half + lane * E + e]);
    ss = fmaf(lo[e], lo[e], fmaf(hi[e], hi[e], ss));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  const uint16_t* w = is_q ? q_norm : k_norm;
  uint16_t* dst = is_q ? q_out + (t * q_heads + h) * D : k_cache + (slot * kv_heads + (h - q_heads)) * D;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = lane * E + e;
    const float a = lo[e] * inv * bf(w[i]);
    const float b = hi[e] * inv * bf(w[half + i]);
    const float c = rope_cos[p * half + i], s = rope_sin[p * half + i];
    dst[i] = to_bf(a * c - b * s);
    dst[half + i] = to_bf(b * c + a * s);
  }
  if (!is_q) {
    const uint16_t* vs = x + int64_t{kv_heads} * D;
    uint16_t* vd = v_cache + (slot * kv_heads + (h - q_heads)) * D;
#pragma unroll
    for (int e = 0; e < 2 * E; ++e)
      vd[lane + 32 * e] = vs[lane + 32 * e];
  }
}

// ---- SiLU-mul: one thread per 8 columns -------------------------------------------------------------
constexpr int k_silu_threads = 256;

__global__ void __launch_bounds__(k_silu_threads)
silu_mul_kernel(const uint16_t* __restrict__ gate_up, uint16_t* __restrict__ out, int64_t rows, int64_t cols) {
  programmatic_wait();
  programmatic_trigger();
  const int64_t chunks = cols / 8;
  const int64_t i = int64_t{blockIdx.x} * k_silu_threads + threadIdx.x;
  if (i >= rows * chunks)
    return;
  const int64_t r = i / chunks, c = i % chunks;
  const uint4* g4 = reinterpret_cast<const uint4*>(gate_up + r * 2 * cols);
  float g[8], u[8], y[8];
  unpack8(__ldg(g4 + c), g);
  unpack8(__ldg(g4 + chunks + c), u);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float act = bf(to_bf(g[j] / (1.0f + expf(-g[j]))));
    y[j] = act * u[j];
  }
  reinterpret_cast<uint4*>(out + r * cols)[c] = pack8(y);
}

} // namespace

kernel_status embed_launch(const embed_args& a, cudaStream_t stream) {
  if (auto s = embed_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.tokens == 0)
    return kernel_status::ok;
  if (!aligned16(a.table) || !aligned16(a.residual))
    return kernel_status::misaligned_operand;
  const auto grid = static_cast<unsigned>((a.tokens + k_embed_warps - 1) / k_embed_warps);
  RLSERVE_CUDA_TRY(launch_programmatic(embed_kernel, grid, 32 * k_embed_warps, 0, stream, a.ids, a.table, a.residual,
                                      a.tokens, a.vocab, a.hidden));
  return kernel_status::ok;
}

kernel_status add_rms_norm_launch(const add_rms_norm_args& a, cudaStream_t stream) {
  if (auto s = add_rms_norm_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.rows == 0)
    return kernel_status::ok;
  if (a.rows > 0x7fffffff)
    return kernel_status::invalid_problem;
  if (!aligned16(a.residual) || !aligned16(a.weight) || !aligned16(a.out) || (a.delta && !aligned16(a.delta)))
    return kernel_status::misaligned_operand;
  RLSERVE_CUDA_TRY(launch_programmatic(add_rms_norm_kernel, static_cast<unsigned>(a.rows), k_norm_threads, 0, stream,
                                      a.residual, a.delta, a.weight, a.rows_index, a.out, a.cols, a.eps));
  return kernel_status::ok;
}

kernel_status qk_norm_rope_kv_launch(const qk_norm_rope_kv_args& a, cudaStream_t stream) {
  if (auto s = qk_norm_rope_kv_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.tokens == 0)
    return kernel_status::ok;
  const int64_t units = a.tokens * (a.q_heads + a.kv_heads);
  const auto grid = static_cast<unsigned>((units + k_rope_warps - 1) / k_rope_warps);
  const auto qh = static_cast<int32_t>(a.q_heads), kvh = static_cast<int32_t>(a.kv_heads);
  RLSERVE_CUDA_TRY(launch_programmatic(a.head_dim == 128 ? qk_norm_rope_kv_kernel<128> : qk_norm_rope_kv_kernel<64>,
                                      grid, 32 * k_rope_warps, 0, stream, a.qkv, a.q_norm, a.k_norm, a.rope_cos,
                                      a.rope_sin, a.positions, a.slots, a.q_out, a.k_cache, a.v_cache, a.tokens, qh,
                                      kvh, a.max_positions, a.num_slots, a.eps));
  return kernel_status::ok;
}

kernel_status silu_mul_bf16_launch(const silu_mul_bf16_args& a, cudaStream_t stream) {
  if (auto s = silu_mul_bf16_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.rows == 0)
    return kernel_status::ok;
  if (!aligned16(a.gate_up) || !aligned16(a.out))
    return kernel_status::misaligned_operand;
  const int64_t n = a.rows * (a.cols / 8);
  RLSERVE_CUDA_TRY(launch_programmatic(silu_mul_kernel, static_cast<unsigned>((n + k_silu_threads - 1) / k_silu_threads),
                                      k_silu_threads, 0, stream, a.gate_up, a.out, a.rows, a.cols));
  return kernel_status::ok;
}

} // namespace rlserve::kernels
