// Batch-invariant BF16 linear (kernels/gemm_bf16_invariant.hpp, gemm_bf16_invariant_launch):
// y = x w^T where each output element's sum does not depend on the number or the values of the
// other rows.
//
// A CTA of 4 warps owns 64 output columns and RF x 16 rows (RF = 1 below 17 rows, else 4); each
// warp owns 16 columns and accumulates RF 16 x 16 tensor-core fragments (WMMA, bf16 in, fp32
// accumulators) over k in steps of 16, from 0 to k, in one order: no split of k between warps or
// CTAs, and the same instruction per 16 x 16 block whatever RF is, so a row's bits are the same
// in a batch of 1 or of 2048, in any position. x is staged through shared memory 64 k at a time
// (rows past `rows` as zeros: they only make outputs nobody stores); w is read as column-major
// fragments straight from global memory (w [n, k] row-major is w^T column-major with ldm = k),
// except by the warp of a last, partial group of 16 columns (n % 16), which stages its fragments
// through shared memory with zero columns past n.
//
// Not tuned: a warp's weight fragments are loaded four k-steps ahead of their use, and that is
// all. docs/performance.md records what the mode costs against cuBLAS and the GEMV.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/gemm_bf16_invariant.hpp"

namespace rlserve::kernels {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int k_warps = 4;
constexpr int k_threads = 32 * k_warps;
constexpr int k_cols = 16 * k_warps; // output columns per CTA
constexpr int k_kc = 64;             // k staged per round: 4 tensor-core steps
constexpr int k_lda = k_kc + 8;      // shared row stride (elements): rows 144 B apart, 16-row blocks 32 B aligned

bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

__device__ __forceinline__ void store_out(float* y, float v) { *y = v; }
__device__ __forceinline__ void store_out(uint16_t* y, float v) { *y = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

template <int RF, typename Out>
__global__ void __launch_bounds__(k_threads)
gemm_bf16_invariant_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                           Out* __restrict__ y, int32_t rows, int32_t n, int32_t k, int64_t ldy) {
  constexpr int BM = 16 * RF;
  __shared__ __align__(32) __nv_bfloat16 xs[BM * k_lda];
  __shared__ __align__(32) float out[k_warps][16 * 16];
  __shared__ __align__(32) __nv_bfloat16 w_part[k_kc / 16][16 * 16]; // the partial group's fragments
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = int64_t{blockIdx.y} * BM;
  const int32_t c0 = blockIdx.x * k_cols + warp * 16;
  const bool has_cols = c0 < n;
  const bool partial = has_cols && c0 + 16 > n; // at most one warp of the grid

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[RF];
#pragma unroll
  for (int f = 0; f < RF; ++f)
    wmma::fill_fragment(acc[f], 0.0f);

  for (int32_t k0 = 0; k0 < k; k0 += k_kc) {
    const int steps = min(k_kc, k - k0) / 16;
    // w fragments of this round first: their global loads overlap the staging of x.
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[k_kc / 16];
    if (has_cols && !partial) {
#pragma unroll
      for (int s = 0; s < k_kc / 16; ++s)
        if (s < steps)
          wmma::load_matrix_sync(b[s], w + int64_t{c0} * k + k0 + 16 * s, k);
    } else if (partial) { // column-major 16 x 16 per step, zeros past n
      for (int i = lane; i < steps * 256; i += 32) {
        const int s = i / 256, c = (i % 256) / 16, kk = i % 16;
        w_part[s][c * 16 + kk] = c0 + c < n ? w[int64_t{c0 + c} * k + k0 + 16 * s + kk] : __float2bfloat16(0.0f);
      }
      __syncwarp();
#pragma unroll
      for (int s = 0; s < k_kc / 16; ++s)
        if (s < steps)
          wmma::load_matrix_sync(b[s], w_part[s], 16);
      __syncwarp(); // the next round's staging waits for these loads
    }
    __syncthreads(); // the previous round's reads of xs are done
    // Stage x[r0 .. r0 + BM, k0 .. k0 + 64): 8 elements (16 B) per copy, zeros past rows or k.
    for (int i = threadIdx.x; i < BM * (k_kc / 8); i += k_threads) {
      const int r = i / (k_kc / 8), c8 = i % (k_kc / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r0 + r < rows && k0 + 8 * c8 < k)
        v = *reinterpret_cast<const uint4*>(x + (r0 + r) * k + k0 + 8 * c8);
      *reinterpret_cast<uint4*>(xs + r * k_lda + 8 * c8) = v;
    }
    __syncthreads();
    if (!has_cols)
      continue;
#pragma unroll
    for (int s = 0; s < k_kc / 16; ++s) {
      if (s >= steps)
        break;
#pragma unroll
      for (int f = 0; f < RF; ++f) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, xs + (16 * f) * k_lda + 16 * s, k_lda);
        wmma::mma_sync(acc[f], a, b[s], acc[f]);
      }
    }
  }
  if (!has_cols)
    return;
#pragma unroll
  for (int f = 0; f < RF; ++f) {
    wmma::store_matrix_sync(out[warp], acc[f], 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 16 * 16; i += 32) {
      const int r = i / 16, c = i % 16;
      const int64_t row = r0 + 16 * f + r;
      if (row < rows && c0 + c < n)
        store_out(y + row * ldy + c0 + c, out[warp][i]);
    }
    __syncwarp();
  }
}

template <typename Out>
cudaError_t launch_for(const gemm_bf16_invariant_args& a, cudaStream_t stream) {
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(a.x);
  const auto* w = reinterpret_cast<const __nv_bfloat16*>(a.w);
  auto* y = static_cast<Out*>(a.y);
  const auto cols = static_cast<unsigned>((a.n + k_cols - 1) / k_cols);
  const auto rows = static_cast<int32_t>(a.rows), n = static_cast<int32_t>(a.n), k = static_cast<int32_t>(a.k);
  if (a.rows <= 16) {
    gemm_bf16_invariant_kernel<1, Out><<<dim3(cols, 1), k_threads, 0, stream>>>(x, w, y, rows, n, k, a.ldy);
  } else {
    const auto blocks = static_cast<unsigned>((a.rows + 63) / 64);
    gemm_bf16_invariant_kernel<4, Out><<<dim3(cols, blocks), k_threads, 0, stream>>>(x, w, y, rows, n, k, a.ldy);
  }
  return cudaGetLastError();
}

} // namespace

kernel_status gemm_bf16_invariant_launch(const gemm_bf16_invariant_args& a, cudaStream_t stream) {
  if (auto s = gemm_bf16_invariant_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.rows == 0)
    return kernel_status::ok;
  // WMMA fragment loads need 32-byte aligned addresses: w's rows are k * 2 bytes apart (k % 16),
  // so w itself must be; x is copied in 16-byte pieces.
  if (!aligned(a.w, 32) || !aligned(a.x, 16) || (a.f32_out ? !aligned(a.y, 4) : !aligned(a.y, 2)))
    return kernel_status::misaligned_operand;
  if (a.rows > 65535 * int64_t{64})
    return kernel_status::invalid_problem;
  RLSERVE_CUDA_TRY(a.f32_out ? launch_for<float>(a, stream) : launch_for<uint16_t>(a, stream));
  return kernel_status::ok;
}

} // namespace rlserve::kernels
