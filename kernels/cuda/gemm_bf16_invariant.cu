// Batch-invariant BF16 linear (kernels/gemm_bf16_invariant.hpp, gemm_bf16_invariant_launch):
// y = x w^T where each output element's sum does not depend on the number or the values of the
// other rows.
//
// The arithmetic, for every launch: output element (r, c) is one fp32 tensor-core accumulator
// that takes x[r, k0 .. k0 + 16) . w[c, k0 .. k0 + 16) for k0 = 0, 16, .., k - 16 in that order,
// each step one WMMA m16n16k16 (bf16 in, fp32 accumulate) of the 16-row block that holds r: no
// split of k between warps or CTAs, no other instruction per step. The two kernels below stage
// their operands differently and run the same step on them, so a row has the same bits in a batch
// of 1 or of 2048, in any position.
//
// Up to 64 rows (decode; gemm_bf16_invariant_small_kernel): one warp per CTA owns 16 output
// columns and all the rows (RF 16-row blocks), and streams its weights and the rows of x through
// a ring of STAGES 64-k chunks in shared memory with cp.async, STAGES - 1 chunks in flight. The
// weights are read once whatever the batch; a warp per 16 columns is the most parallelism the
// fixed k order allows, so the ring's depth is what keeps enough bytes in flight (the first
// version loaded fragments four k-steps ahead from global memory: 3.4x the default forward's step
// at batch 1, docs/performance.md).
//
// Above 64 rows (prefill; gemm_bf16_invariant_kernel): a CTA of 4 warps owns 64 output columns
// and 64 rows; each warp owns 16 columns and accumulates 4 16 x 16 WMMA fragments. x is staged
// through shared memory 64 k at a time (rows past `rows` as zeros: they only make outputs nobody
// stores); w is read as column-major fragments straight from global memory (w [n, k] row-major
// is w^T column-major with ldm = k), except by the warp of a last, partial group of 16 columns
// (n % 16), which stages its fragments through shared memory with zero columns past n.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/ptx_helpers.cuh"
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

// ---- up to 64 rows: one warp per 16 columns, a cp.async ring --------------------------------------

constexpr int k_small_rs = k_kc + 8; // shared row stride (elements): 144 B, conflict-free fragment reads

// Stages per ring: all three fit the 48 KB of static shared memory.
template <int RF>
constexpr int small_stages() { return RF == 1 ? 8 : RF == 2 ? 6 : 4; }

template <int RF, typename Out>
__global__ void __launch_bounds__(32)
gemm_bf16_invariant_small_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                 Out* __restrict__ y, int32_t rows, int32_t n, int32_t k, int64_t ldy) {
  constexpr int S = small_stages<RF>();
  constexpr int XR = 16 * RF; // rows of x staged
  // 32-byte aligned fragment rows: every stage and 16-row block starts at a multiple of 16 x 144 B.
  __shared__ __align__(32) __nv_bfloat16 ws[S][16][k_small_rs];
  __shared__ __align__(32) __nv_bfloat16 xs[S][XR][k_small_rs];
  const int lane = threadIdx.x;
  const int32_t c0 = blockIdx.x * 16;
  const int chunks = (k + k_kc - 1) / k_kc;

  // Rows past `rows` are zeros in every stage; the copies below never write them.
  for (int i = lane; i < S * XR * (k_kc / 8); i += 32) {
    const int r = (i / (k_kc / 8)) % XR;
    if (r >= rows)
      *reinterpret_cast<uint4*>(&xs[i / (XR * (k_kc / 8))][r][8 * (i % (k_kc / 8))]) = make_uint4(0, 0, 0, 0);
  }
  auto issue = [&](int chunk) {
    const int slot = chunk % S;
    const int32_t k0 = chunk * k_kc;
    for (int i = lane; i < 16 * (k_kc / 8); i += 32) { // 16 weight rows x 8 pieces of 16 B
      const int r = i / (k_kc / 8), c8 = i % (k_kc / 8);
      const bool valid = c0 + r < n && k0 + 8 * c8 < k;
      cp_async16(&ws[slot][r][8 * c8], valid ? w + int64_t{c0 + r} * k + k0 + 8 * c8 : w, valid);
    }
    for (int i = lane; i < rows * (k_kc / 8); i += 32) {
      const int r = i / (k_kc / 8), c8 = i % (k_kc / 8);
      const bool valid = k0 + 8 * c8 < k;
      cp_async16(&xs[slot][r][8 * c8], valid ? x + int64_t{r} * k + k0 + 8 * c8 : x, valid);
    }
  };
#pragma unroll
  for (int c = 0; c < S - 1; ++c) {
    if (c < chunks)
      issue(c);
    cp_async_commit(); // empty groups keep the count: chunk c is always group c
  }
  __syncwarp(); // the zero rows before any lane reads them

  // The same WMMA step as the kernel above on the same operands: the same bits by construction.
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[RF];
#pragma unroll
  for (int f = 0; f < RF; ++f)
    wmma::fill_fragment(acc[f], 0.0f);

  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<S - 2>(); // this lane's copies of chunk c have landed
    __syncwarp();           // ...and every lane's; and chunk c - 1's slot is read by all
    if (c + S - 1 < chunks)
      issue(c + S - 1);     // into chunk c - 1's slot
    cp_async_commit();
    const int slot = c % S;
    const int steps = min(k_kc, k - c * k_kc) / 16;
#pragma unroll
    for (int s = 0; s < k_kc / 16; ++s) {
      if (s >= steps)
        break;
      // B = w^T (k x 16 columns) column-major: w's rows as staged, ldm the padded stride.
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
      wmma::load_matrix_sync(b, &ws[slot][0][16 * s], k_small_rs);
#pragma unroll
      for (int f = 0; f < RF; ++f) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, &xs[slot][16 * f][16 * s], k_small_rs);
        wmma::mma_sync(acc[f], a, b, acc[f]);
      }
    }
  }
  cp_async_wait<0>();
  __syncwarp();
  float* out = reinterpret_cast<float*>(&ws[0][0][0]); // the ring is free now: 16 x 16 fp32 = 1 KB
#pragma unroll
  for (int f = 0; f < RF; ++f) {
    wmma::store_matrix_sync(out, acc[f], 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 16 * 16; i += 32) {
      const int32_t row = 16 * f + i / 16, col = c0 + i % 16;
      if (row < rows && col < n)
        store_out(y + int64_t{row} * ldy + col, out[i]);
    }
    __syncwarp();
  }
}

// ---- above 64 rows: 4 warps x 16 columns, 64 rows per CTA, WMMA ----------------------------------

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
  const auto groups = static_cast<unsigned>((a.n + 15) / 16);
  if (a.rows <= 16) {
    gemm_bf16_invariant_small_kernel<1, Out><<<groups, 32, 0, stream>>>(x, w, y, rows, n, k, a.ldy);
  } else if (a.rows <= 32) {
    gemm_bf16_invariant_small_kernel<2, Out><<<groups, 32, 0, stream>>>(x, w, y, rows, n, k, a.ldy);
  } else if (a.rows <= 64) {
    gemm_bf16_invariant_small_kernel<4, Out><<<groups, 32, 0, stream>>>(x, w, y, rows, n, k, a.ldy);
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
