// BF16 fused MoE (kernels/moe_bf16.hpp): the engine's BF16 expert baseline beside the INT4 one.
// Five launches, no host synchronization (CUDA-graph capturable):
//   1. moe_topk_launch    (kernels/fused_moe.cu)  -> ids, weights [T, k]
//   2. moe_align_launch   (kernels/fused_moe.cu)  -> flat ids grouped by expert, runs padded to R rows
//   3. w13 GEMM + SiLU-mul: CTA per (R-row block of one expert, 16 gate/up column pairs); the block's
//      rows of x stream through shared memory in 512-wide k chunks, each warp reads 2 gate + 2 up
//      weight rows once (16-byte coalesced loads) and applies them to all R rows   -> h [T*k, I] bf16
//   4. w2 GEMM: the same core, 4 output columns per warp, rows of h                 -> y [T*k, H] fp32
//   5. combine: out[t] = bf16(sum_s w_s y[t*k + s]) in slot order
// CUDA cores (fp32 FMA), each expert's weights read once per R-row block: bandwidth-bound at small
// T, FMA-bound at T >= ~64 (no tensor cores yet).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/fused_moe.hpp"
#include "kernels/moe_bf16.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_warps = 8;
constexpr int k_cols = 4;   // weight rows per warp
constexpr int k_kc = 512;   // k chunk staged in shared memory
constexpr int k_max_rows = 32;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
std::size_t round256(std::size_t x) { return (x + 255) / 256 * 256; }

__device__ __forceinline__ void unpack8(const uint4& w, float* f) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ float bf_round(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }

// W13 = true: columns (gate n, gate n+1, up I+n, up I+n+1), output h = bf16(silu(bf16 g) * bf16 u).
// W13 = false: 4 consecutive columns of w2, output y in fp32.
template <int R, bool W13>
__global__ void __launch_bounds__(32 * k_warps)
moe_gemm_kernel(const uint16_t* __restrict__ a,   // W13: x [T, K]; w2: h [T*k, K]
                const uint16_t* __restrict__ w,   // [E, N, K]
                const int32_t* __restrict__ sorted_ids, const int32_t* __restrict__ block_expert,
                const int32_t* __restrict__ num_padded, int32_t num_ids, int32_t a_row_div,
                int32_t K, int32_t N, int32_t I, uint16_t* __restrict__ h_out, float* __restrict__ y_out) {
  __shared__ __align__(16) uint16_t xs[R][k_kc];
  __shared__ int32_t rid[R];
  const int mb = blockIdx.y;
  if (mb * R >= *num_padded)
    return;
  const int e = block_expert[mb];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (threadIdx.x < R)
    rid[threadIdx.x] = sorted_ids[mb * R + threadIdx.x];
  __syncthreads();
  int nvalid = 0;
#pragma unroll
  for (int r = 0; r < R; ++r)
    nvalid += rid[r] < num_ids ? 1 : 0;

  int col[k_cols];
  if (W13) {
    const int n = (blockIdx.x * k_warps + warp) * 2;
    col[0] = n, col[1] = n + 1, col[2] = I + n, col[3] = I + n + 1;
  } else {
    const int n = (blockIdx.x * k_warps + warp) * k_cols;
#pragma unroll
    for (int c = 0; c < k_cols; ++c)
      col[c] = n + c;
  }
  const uint16_t* wrow[k_cols];
#pragma unroll
  for (int c = 0; c < k_cols; ++c)
    wrow[c] = w + (int64_t{e} * N + (col[c] < N ? col[c] : 0)) * K;

  float acc[k_cols][R];
#pragma unroll
  for (int c = 0; c < k_cols; ++c)
#pragma unroll
    for (int r = 0; r < R; ++r)
      acc[c][r] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += k_kc) {
    const int kc = K - k0 < k_kc ? K - k0 : k_kc;
    __syncthreads(); // previous chunk fully consumed
    for (int i = threadIdx.x; i < R * (kc / 8); i += 32 * k_warps) {
      const int r = i / (kc / 8), c8 = i % (kc / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < nvalid)
        v = *reinterpret_cast<const uint4*>(a + int64_t{rid[r] / a_row_div} * K + k0 + c8 * 8);
      *reinterpret_cast<uint4*>(&xs[r][c8 * 8]) = v;
    }
    __syncthreads();
    for (int kk = lane * 8; kk < kc; kk += 256) {
      float wf[k_cols][8];
#pragma unroll
      for (int c = 0; c < k_cols; ++c)
        unpack8(__ldg(reinterpret_cast<const uint4*>(wrow[c] + k0 + kk)), wf[c]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < nvalid) {
          float xf[8];
          unpack8(*reinterpret_cast<const uint4*>(&xs[r][kk]), xf);
#pragma unroll
          for (int c = 0; c < k_cols; ++c)
#pragma unroll
            for (int j = 0; j < 8; ++j)
              acc[c][r] = fmaf(xf[j], wf[c][j], acc[c][r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= nvalid)
      break;
#pragma unroll
    for (int c = 0; c < k_cols; ++c)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        acc[c][r] += __shfl_xor_sync(0xffffffffu, acc[c][r], off);
    if (lane == (r & 31)) {
      const int64_t id = rid[r];
      if (W13) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (col[c] >= I)
            continue;
          const float g = bf_round(acc[c][r]), u = bf_round(acc[c + 2][r]);
          h_out[id * I + col[c]] = __bfloat16_as_ushort(__float2bfloat16_rn(g / (1.0f + expf(-g)) * u));
        }
      } else {
#pragma unroll
        for (int c = 0; c < k_cols; ++c)
          if (col[c] < N)
            y_out[id * N + col[c]] = acc[c][r];
      }
    }
  }
}

constexpr int k_combine_threads = 256;

__global__ void __launch_bounds__(k_combine_threads)
combine_kernel(const float* __restrict__ y, const float* __restrict__ weights, uint16_t* __restrict__ out,
               int64_t tokens, int32_t H, int32_t K) {
  const int64_t i = int64_t{blockIdx.x} * k_combine_threads + threadIdx.x;
  if (i >= tokens * H)
    return;
  const int64_t t = i / H, n = i % H;
  float acc = 0.0f;
  for (int s = 0; s < K; ++s)
    acc += weights[t * K + s] * y[(t * K + s) * H + n];
  out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(acc));
}

struct moe_layout {
  std::size_t ids = 0, weights = 0, sorted = 0, block_expert = 0, num_padded = 0, h = 0, y = 0, total = 0;
};

moe_layout layout_of(const moe_bf16_args& a) {
  moe_layout l;
  const int64_t cap = a.max_tokens > 0 ? a.max_tokens : a.tokens;
  const int64_t ids = cap * a.top_k;
  std::size_t off = 0;
  auto take = [&off](std::size_t bytes) {
    const std::size_t at = off;
    off += round256(bytes);
    return at;
  };
  l.ids = take(ids * sizeof(int32_t));
  l.weights = take(ids * sizeof(float));
  l.sorted = take(moe_align_capacity(ids, a.experts, k_max_rows) * sizeof(int32_t));
  l.block_expert = take(moe_align_capacity(ids, a.experts, 8) / 8 * sizeof(int32_t));
  l.num_padded = take(sizeof(int32_t));
  l.h = take(ids * a.intermediate * sizeof(uint16_t));
  l.y = take(ids * a.hidden * sizeof(float));
  l.total = off;
  return l;
}

// Rows per block: the smallest whose rows the average expert fills to < 90% (as fused_moe).
int block_rows(const moe_bf16_args& a) {
  const double per_expert = double(a.tokens) * a.top_k / double(a.experts);
  for (int rows : {8, 16})
    if (per_expert / rows < 0.9)
      return rows;
  return 32;
}

template <int R>
kernel_status run_gemms(const moe_bf16_args& a, int32_t* sorted, int32_t* block_expert, int32_t* num_padded,
                        uint16_t* h, float* y, cudaStream_t stream) {
  const int64_t num_ids = a.tokens * a.top_k;
  const auto m_blocks = static_cast<unsigned>(moe_align_capacity(num_ids, a.experts, R) / R);
  const auto H = static_cast<int32_t>(a.hidden), I = static_cast<int32_t>(a.intermediate);
  const dim3 g13(static_cast<unsigned>((I / 2 + k_warps - 1) / k_warps), m_blocks);
  moe_gemm_kernel<R, true><<<g13, 32 * k_warps, 0, stream>>>(a.x, a.w13, sorted, block_expert, num_padded,
                                                              static_cast<int32_t>(num_ids), a.top_k, H, 2 * I, I, h,
                                                              nullptr);
  RLSERVE_CUDA_CHECK_LAUNCH();
  const dim3 g2(static_cast<unsigned>((H / k_cols + k_warps - 1) / k_warps), m_blocks);
  moe_gemm_kernel<R, false><<<g2, 32 * k_warps, 0, stream>>>(h, a.w2, sorted, block_expert, num_padded,
                                                              static_cast<int32_t>(num_ids), 1, I, H, I, nullptr, y);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

} // namespace

std::size_t moe_bf16_workspace_bytes(const moe_bf16_args& a) {
  if (moe_bf16_can_implement(a) != kernel_status::ok)
    return 0;
  return layout_of(a).total;
}

int32_t* moe_bf16_topk_ids(const moe_bf16_args& a, void* workspace) {
  if (moe_bf16_can_implement(a) != kernel_status::ok || workspace == nullptr)
    return nullptr;
  return reinterpret_cast<int32_t*>(static_cast<unsigned char*>(workspace) + layout_of(a).ids);
}

kernel_status moe_bf16_workspace_init(const moe_bf16_args& a, void* workspace, cudaStream_t stream) {
  if (auto s = moe_bf16_can_implement(a); s != kernel_status::ok)
    return s;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  RLSERVE_CUDA_TRY(cudaMemsetAsync(workspace, 0, layout_of(a).total, stream)); // nothing must be zero; tidy
  return kernel_status::ok;
}

kernel_status moe_bf16_launch(const moe_bf16_args& a, void* workspace, cudaStream_t stream) {
  if (auto s = moe_bf16_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.tokens == 0)
    return kernel_status::ok;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  if (!aligned16(a.x) || !aligned16(a.w13) || !aligned16(a.w2) || !aligned16(workspace))
    return kernel_status::misaligned_operand;
  const moe_layout l = layout_of(a);
  auto* base = static_cast<unsigned char*>(workspace);
  auto* ids = reinterpret_cast<int32_t*>(base + l.ids);
  auto* weights = reinterpret_cast<float*>(base + l.weights);
  auto* sorted = reinterpret_cast<int32_t*>(base + l.sorted);
  auto* block_expert = reinterpret_cast<int32_t*>(base + l.block_expert);
  auto* num_padded = reinterpret_cast<int32_t*>(base + l.num_padded);
  auto* h = reinterpret_cast<uint16_t*>(base + l.h);
  auto* y = reinterpret_cast<float*>(base + l.y);
  const int R = block_rows(a);
  const int64_t num_ids = a.tokens * a.top_k;
  moe_topk_args topk{a.tokens, a.experts, a.top_k, a.norm_topk_prob, a.router_logits, ids, weights};
  if (auto st = moe_topk_launch(topk, stream); st != kernel_status::ok)
    return st;
  moe_align_args align{num_ids, a.experts, R, ids, sorted, block_expert, num_padded};
  if (auto st = moe_align_launch(align, stream); st != kernel_status::ok)
    return st;
  kernel_status st = R == 8    ? run_gemms<8>(a, sorted, block_expert, num_padded, h, y, stream)
                     : R == 16 ? run_gemms<16>(a, sorted, block_expert, num_padded, h, y, stream)
                               : run_gemms<32>(a, sorted, block_expert, num_padded, h, y, stream);
  if (st != kernel_status::ok)
    return st;
  const int64_t n = a.tokens * a.hidden;
  combine_kernel<<<static_cast<unsigned>((n + k_combine_threads - 1) / k_combine_threads), k_combine_threads, 0,
                   stream>>>(y, weights, a.out, a.tokens, static_cast<int32_t>(a.hidden), a.top_k);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

} // namespace rlserve::kernels
