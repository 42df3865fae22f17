// BF16 GEMV (kernels/gemv_bf16.hpp, gemv_bf16_launch): y = x w^T for 1 to 8 rows of x, the
// linear layers of a decode step, which cuBLAS runs well under copy bandwidth at so few rows
// (docs/performance.md, 'Decode on the GPU runner, round two: batch-1 kernels').
//
// Memory-bound: every weight byte is read once, in 16-byte loads that skip L1 (x stays there).
// A CTA of 8 warps owns (8 / KS) * R consecutive output columns. Its warps form 8 / KS groups of KS
// warps; a group's warps deal k out among themselves in chunks of 256 elements (32 lanes x 8),
// round-robin, and each warp runs R weight rows at once against one load of the x chunk. The host
// picks KS and R so the grid has about two CTAs per SM: first a larger KS (keeps R rows per x
// load), then a smaller R. Each lane issues U chunks' loads before using any.
// Sums: fp32 per lane in chunk order, an xor-shuffle across the warp, then the KS warps' partials
// in warp order through shared memory. The order is fixed by the shapes alone, so a result never
// depends on scheduling. Launched as a programmatic dependent: the first weights load before
// the wait for the kernel that wrote x (kernels/cuda/programmatic_launch.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/gemv_bf16.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_threads = 256;
constexpr int k_warps = k_threads / 32;
constexpr int k_chunk = 256; // elements of k per warp step: 32 lanes x 8

__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t wu[4] = {w.x, w.y, w.z, w.w}, xu[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(wu[i] << 16), __uint_as_float(xu[i] << 16), acc);
    acc = fmaf(__uint_as_float(wu[i] & 0xffff0000u), __uint_as_float(xu[i] & 0xffff0000u), acc);
  }
  return acc;
}

__device__ __forceinline__ void store(float* y, float v) { *y = v; }
__device__ __forceinline__ void store(uint16_t* y, float v) { *y = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// M: rows of x the kernel is compiled for (the launch's rows <= M); R: weight rows per warp;
// U: chunks whose loads are in flight together.
template <int M, int R, int U, typename Out>
__global__ void __launch_bounds__(k_threads, 1)
gemv_bf16_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w, Out* __restrict__ y, int rows,
                 int64_t n, int64_t k, int64_t ldy, int ks) {
  __shared__ float part[k_warps][R][M];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int groups = k_warps / ks;
  const int group = warp / ks, kw = warp % ks;
  const int64_t c0 = (int64_t{blockIdx.x} * groups + group) * R;
  const int64_t chunks = (k + k_chunk - 1) / k_chunk;

  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
      acc[r][m] = 0.0f;

  uint4 wv[U][R];
  auto load_weights = [&](int64_t c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t e = (c + int64_t{u} * ks) * k_chunk + lane * 8;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = make_uint4(0, 0, 0, 0);
        if (e < k && c0 + r < n)
          wv[u][r] = load_streaming(w + (c0 + r) * k + e);
      }
    }
  };
  // The first weights are in flight before the wait: with a programmatic launch they load while
  // the previous kernel (which wrote x) finishes. Weights are never written by such a kernel.
  load_weights(kw);
  programmatic_wait();
  programmatic_trigger();
  for (int64_t c = kw; c < chunks; c += int64_t{ks} * U) {
    if (c != kw)
      load_weights(c);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t e = (c + int64_t{u} * ks) * k_chunk + lane * 8;
      if (e >= k)
        continue;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m >= rows)
          break;
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * k + e));
#pragma unroll
        for (int r = 0; r < R; ++r)
          acc[r][m] = dot8(wv[u][r], xv, acc[r][m]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);

  if (ks == 1) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (lane == ((r * M + m) & 31) && m < rows && c0 + r < n)
          store(y + m * ldy + c0 + r, acc[r][m]);
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m)
        part[warp][r][m] = acc[r][m];
  __syncthreads();
  const int i = threadIdx.x;
  if (i >= groups * R * M)
    return;
  const int g = i / (R * M), r = (i / M) % R, m = i % M;
  const int64_t col = (int64_t{blockIdx.x} * groups + g) * R + r;
  if (m >= rows || col >= n)
    return;
  float sum = 0.0f;
  for (int j = 0; j < ks; ++j)
    sum += part[g * ks + j][r][m];
  store(y + m * ldy + col, sum);
}

int sm_count() {
  static std::array<std::atomic<int>, 64> cache{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
    return 132;
  int v = cache[static_cast<std::size_t>(dev)].load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
      v = 132;
    cache[static_cast<std::size_t>(dev)].store(v, std::memory_order_relaxed);
  }
  return v;
}

template <int M, int R, typename Out>
cudaError_t launch_mr(const gemv_bf16_args& a, int ks, unsigned grid, cudaStream_t stream) {
  // Loads in flight per lane: U * R 16-byte weight loads, kept to about 8 (registers).
  constexpr int U = M <= 2 ? (R == 4 ? 2 : 4) : (M == 4 ? (R == 4 ? 1 : 2) : 1);
  return launch_programmatic(gemv_bf16_kernel<M, R, U, Out>, grid, k_threads, 0, stream, a.x, a.w,
                             static_cast<Out*>(a.y), static_cast<int>(a.rows), a.n, a.k, a.ldy, ks);
}

template <int M, typename Out>
cudaError_t launch_m(const gemv_bf16_args& a, int R, int ks, unsigned grid, cudaStream_t stream) {
  if (R == 4)
    return launch_mr<M, 4, Out>(a, ks, grid, stream);
  if (R == 2)
    return launch_mr<M, 2, Out>(a, ks, grid, stream);
  return launch_mr<M, 1, Out>(a, ks, grid, stream);
}

template <typename Out>
cudaError_t launch(const gemv_bf16_args& a, int R, int ks, unsigned grid, cudaStream_t stream) {
  if (a.rows <= 1)
    return launch_m<1, Out>(a, R, ks, grid, stream);
  if (a.rows <= 2)
    return launch_m<2, Out>(a, R, ks, grid, stream);
  if (a.rows <= 4)
    return launch_m<4, Out>(a, R, ks, grid, stream);
  return launch_m<8, Out>(a, R, ks, grid, stream);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

} // namespace

kernel_status gemv_bf16_launch(const gemv_bf16_args& a, cudaStream_t stream) {
  if (auto s = gemv_bf16_can_implement(a); s != kernel_status::ok)
    return s;
  if (!aligned16(a.x) || !aligned16(a.w))
    return kernel_status::misaligned_operand;
  const int64_t target = 2 * int64_t{sm_count()};
  int R = a.rows > 4 ? 2 : 4, ks = 1;
  auto ctas = [&] {
    const int64_t per = int64_t{k_warps / ks} * R;
    return (a.n + per - 1) / per;
  };
  while (ctas() < target) {
    if (ks < k_warps && a.k >= int64_t{ks} * 2 * k_chunk)
      ks *= 2;
    else if (R > 1)
      R /= 2;
    else
      break;
  }
  if (ctas() > 0x7fffffff)
    return kernel_status::invalid_problem;
  const auto grid = static_cast<unsigned>(ctas());
  RLSERVE_CUDA_TRY(a.f32_out ? launch<float>(a, R, ks, grid, stream) : launch<uint16_t>(a, R, ks, grid, stream));
  return kernel_status::ok;
}

} // namespace rlserve::kernels
