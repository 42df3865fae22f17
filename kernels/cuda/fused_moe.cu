// CUDA fused MoE (kernels/fused_moe.hpp): router top-k, alignment, and the combine are small
// kernels here; both expert GEMMs run the W4A16 core of gemm_w4a16.cu (grouped over experts:
// each m block of the expert-sorted token list reads its expert's weights), the w13 one with the
// SiLU-mul epilogue, the w2 one with FP32 output rows. Five launches, no host synchronization.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/cuda/gemm_w4a16_problem.cuh"
#include "kernels/fused_moe.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_topk_warps = 4;             // tokens per top-k CTA (one warp each)
constexpr int k_topk_per_lane = 8;          // logits per lane: experts <= 256
constexpr int k_align_threads = 1024;       // the single alignment CTA
#ifndef RLSERVE_MOE_PREFETCH_UNITS
#define RLSERVE_MOE_PREFETCH_UNITS 3
#endif
// w2 units per CTA whose weights are pulled into L2 while w13 finishes (its pipeline depth).
constexpr int k_moe_prefetch_units = RLSERVE_MOE_PREFETCH_UNITS;
constexpr int k_combine_threads = 256;      // one 8-column chunk per thread (H = 2048: one pass)
constexpr int k_max_block = 64;             // largest m block (4 x m16)

// ---- 1. router top-k --------------------------------------------------------------------------------

// Warp per token. Selection runs on the logits (softmax is monotonic, and the comparison is
// exact, so CPU and GPU pick the same experts); ties go to the lower expert id. Weights are
// expf(l - max) over the sum of the picked ones (norm_topk_prob) or of all experts. Writes the
// token's row: ids[0, top_k), weights[0, top_k).
__device__ __forceinline__ void topk_one_token(const float* __restrict__ logits, int32_t t, int32_t experts,
                                               int32_t top_k, bool norm, int32_t* __restrict__ ids,
                                               float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
  const float* l = logits + static_cast<int64_t>(t) * experts;
  float v[k_topk_per_lane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < k_topk_per_lane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < experts ? l[e] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float all = 0.0f;
  if (!norm) {
#pragma unroll
    for (int i = 0; i < k_topk_per_lane; ++i)
      if (lane + 32 * i < experts)
        all += expf(v[i] - mx);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      all += __shfl_xor_sync(0xffffffffu, all, off);
  }
  float picked_sum = 0.0f, my_p = 0.0f;
  int32_t my_id = 0;
  for (int r = 0; r < top_k; ++r) {
    float bv = -INFINITY;
    int32_t bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < k_topk_per_lane; ++i)
      if (lane + 32 * i < experts && v[i] > bv) { // ascending ids per lane: first max wins ties
        bv = v[i];
        bi = lane + 32 * i;
      }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    const float p = expf(bv - mx);
    picked_sum += p; // rank order, as the CPU twin sums
    if (lane == r) {
      my_p = p;
      my_id = bi;
    }
#pragma unroll
    for (int i = 0; i < k_topk_per_lane; ++i)
      if (lane + 32 * i == bi)
        v[i] = -INFINITY;
  }
  if (lane < top_k) {
    ids[lane] = my_id;
    weights[lane] = my_p / (norm ? picked_sum : all);
  }
}

__global__ void __launch_bounds__(32 * k_topk_warps)
moe_topk_kernel(const float* __restrict__ logits, // [T, E]
                int32_t tokens, int32_t experts, int32_t top_k, bool norm,
                int32_t* __restrict__ ids,        // [T, k]
                float* __restrict__ weights) {    // [T, k]
  const int32_t t = blockIdx.x * k_topk_warps + (threadIdx.x >> 5);
  if (t < tokens)
    topk_one_token(logits, t, experts, top_k, norm, ids + int64_t{t} * top_k, weights + int64_t{t} * top_k);
}

// ---- 2. alignment -------------------------------------------------------------------------------------

// One CTA: per-expert counts (shared-memory atomics: integer, any order gives the same counts), a
// warp scan of the padded counts, the block -> expert table, padding entries, then the scatter in
// ascending id order inside each expert's run, as the CPU twin. The order matters: a row's m block
// decides its GEMM tile, and tiles are split along k at places that depend on their index in the
// persistent grid's partition, so a row placed in another block of its expert is summed in
// another order. With positions taken from atomics, two runs of the same batch differed in their
// last bits wherever an expert got more rows than one block holds (every prefill).
//
// The ordered scatter goes through the ids 1024 at a time: in each chunk, a thread's rank among
// the ids of its expert is the count of the same expert in earlier chunks (fill), in earlier warps
// of this chunk (the per-warp counts, one byte each: at most 32), and in earlier lanes of its warp
// (__match_any_sync).
constexpr int k_align_warps = k_align_threads / 32;
std::size_t align_smem_bytes(int64_t experts) {
  return static_cast<std::size_t>(3 * experts + 1) * sizeof(int32_t) + static_cast<std::size_t>(k_align_warps * experts);
}

__device__ __forceinline__ void align_body(const int32_t* __restrict__ topk_ids, int32_t num_ids, int32_t experts,
                                           int32_t block, int32_t* __restrict__ sorted_ids,
                                           int32_t* __restrict__ block_expert, int32_t* __restrict__ num_padded) {
  extern __shared__ int32_t sh[];
  int32_t* count = sh;              // [E]
  int32_t* offset = sh + experts;   // [E + 1]
  int32_t* fill = sh + 2 * experts + 1; // [E]: ids of the expert in earlier chunks
  uint8_t* warp_count = reinterpret_cast<uint8_t*>(sh + 3 * experts + 1); // [warps][E] of this chunk
  const int tid = threadIdx.x;
  for (int i = tid; i < k_align_warps * experts; i += blockDim.x)
    warp_count[i] = 0;
  for (int e = tid; e < experts; e += blockDim.x)
    count[e] = 0, fill[e] = 0;
  __syncthreads();
  for (int32_t i = tid; i < num_ids; i += blockDim.x) {
    const int32_t e = topk_ids[i];
    if (e >= 0 && e < experts)
      atomicAdd(count + e, 1);
  }
  __syncthreads();
  if (tid < 32) {
    // Lane l scans experts [l*per, (l+1)*per) of the padded counts; a warp scan joins them.
    const int per = (experts + 31) / 32;
    int32_t local = 0;
    for (int e = tid * per; e < min(experts, (tid + 1) * per); ++e)
      local += (count[e] + block - 1) / block * block;
    int32_t incl = local;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int32_t o = __shfl_up_sync(0xffffffffu, incl, off);
      if (tid >= off)
        incl += o;
    }
    int32_t run = incl - local;
    for (int e = tid * per; e < min(experts, (tid + 1) * per); ++e) {
      offset[e] = run;
      run += (count[e] + block - 1) / block * block;
    }
    if (tid == 31) {
      offset[experts] = incl;
      *num_padded = incl;
    }
  }
  __syncthreads();
  const int32_t total = offset[experts];
  for (int32_t i = tid; i < total; i += blockDim.x)
    sorted_ids[i] = num_ids; // padding unless overwritten below
  for (int e = tid; e < experts; e += blockDim.x)
    for (int32_t b = offset[e] / block; b < offset[e + 1] / block; ++b)
      block_expert[b] = e;
  __syncthreads(); // the padding stores are ordered before the scatter (same CTA)
  const int warp = tid >> 5, lane = tid & 31;
  for (int32_t base = 0; base < num_ids; base += blockDim.x) { // uniform trip count: barriers inside
    const int32_t i = base + tid;
    const int32_t e = i < num_ids ? topk_ids[i] : -1;
    const bool valid = e >= 0 && e < experts;
    const unsigned peers = __match_any_sync(0xffffffffu, valid ? e : -1);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (valid && rank == 0)
      warp_count[warp * experts + e] = static_cast<uint8_t>(__popc(peers));
    __syncthreads();
    if (valid) {
      int32_t before = fill[e] + rank;
      for (int w = 0; w < warp; ++w)
        before += warp_count[w * experts + e];
      sorted_ids[offset[e] + before] = i;
    }
    __syncthreads();
    for (int x = tid; x < experts; x += blockDim.x) {
      int32_t chunk = 0;
      for (int w = 0; w < k_align_warps; ++w) {
        chunk += warp_count[w * experts + x];
        warp_count[w * experts + x] = 0;
      }
      fill[x] += chunk;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(k_align_threads)
moe_align_kernel(const int32_t* __restrict__ topk_ids, // [num_ids]
                 int32_t num_ids, int32_t experts, int32_t block,
                 int32_t* __restrict__ sorted_ids,     // [capacity]
                 int32_t* __restrict__ block_expert,   // [capacity / block]
                 int32_t* __restrict__ num_padded) {   // [1]
  align_body(topk_ids, num_ids, experts, block, sorted_ids, block_expert, num_padded);
}

// Decode (T <= 32 tokens): top-k and alignment in one CTA, one launch less on the critical path.
// Warp w routes token w; the block barrier orders its global ids before the alignment reads them.
constexpr int k_route_max_tokens = k_align_threads / 32;
__global__ void __launch_bounds__(k_align_threads)
moe_route_kernel(const float* __restrict__ logits, int32_t tokens, int32_t experts, int32_t top_k, bool norm,
                 int32_t* __restrict__ ids, float* __restrict__ weights, int32_t block,
                 int32_t* __restrict__ sorted_ids, int32_t* __restrict__ block_expert,
                 int32_t* __restrict__ num_padded) {
  const int32_t t = threadIdx.x >> 5;
  if (t < tokens)
    topk_one_token(logits, t, experts, top_k, norm, ids + int64_t{t} * top_k, weights + int64_t{t} * top_k);
  __syncthreads();
  align_body(ids, tokens * top_k, experts, block, sorted_ids, block_expert, num_padded);
}

// ---- 5. combine -----------------------------------------------------------------------------------------

// out[t, :] = bf16(sum over slots s in order of w[t, s] * y[t*k + s, :]); explicit _rn operations
// so no FMA contraction makes it differ from the CPU twin's multiply-then-add.
__global__ void __launch_bounds__(k_combine_threads)
moe_combine_kernel(const float* __restrict__ y,       // [T*k, H]
                   const float* __restrict__ weights, // [T, k]
                   int32_t hidden, int32_t top_k,
                   uint16_t* __restrict__ out) {      // bf16 [T, H]
  w4a16::grid_dep_wait(); // launched as a programmatic dependent of the w2 GEMM
  const int64_t t = blockIdx.x;
  constexpr int k_batch = 8; // slots whose rows are loaded together (independent loads)
  for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int s0 = 0; s0 < top_k; s0 += k_batch) {
      float4 a[k_batch], b[k_batch];
      float w[k_batch];
#pragma unroll
      for (int j = 0; j < k_batch; ++j)
        if (s0 + j < top_k) {
          const float* row = y + (t * top_k + s0 + j) * hidden + c * 8;
          a[j] = *reinterpret_cast<const float4*>(row);
          b[j] = *reinterpret_cast<const float4*>(row + 4);
          w[j] = weights[t * top_k + s0 + j];
        }
#pragma unroll
      for (int j = 0; j < k_batch; ++j)
        if (s0 + j < top_k) {
          const float v[8] = {a[j].x, a[j].y, a[j].z, a[j].w, b[j].x, b[j].y, b[j].z, b[j].w};
#pragma unroll
          for (int e = 0; e < 8; ++e)
            acc[e] = __fadd_rn(acc[e], __fmul_rn(w[j], v[e]));
        }
    }
    uint32_t packed[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      packed[e] = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * e]))) |
                  (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * e + 1]))) << 16);
    *reinterpret_cast<uint4*>(out + t * hidden + c * 8) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

// ---- small-T decode path: GEMV over serving tiles ---------------------------------------------------

constexpr int k_gemv_max_warps = 8;
constexpr int k_gemv_batch = 8; // serving tiles a warp loads before it uses them

// The k-tiles [begin, end) warp `warp` of a GEMV CTA takes: k/16 tiles split evenly over the warps.
struct warp_k_range {
  int32_t begin, end;
  __device__ warp_k_range(int32_t k, int warp, int warps) {
    const int32_t kts = k / 16, per = (kts + warps - 1) / warps;
    begin = min(kts, warp * per);
    end = min(kts, begin + per);
  }
};

// One (pair, 64-column tile) of out = x W^T for the serving matrix `w` ([k/16, 2n] words, tile
// (kt, nt) at word (kt * n/64 + nt) * 128), swap-AB on the tensor cores: D [16 n x 8] = W [16 n x
// 16 k] X [16 k x 8], X's column 0 the input vector, its other columns zero. The 4 words lane l
// loads from a serving tile are, dequantized by the GEMM core's dequant_word, exactly its A
// fragments of the tile's four n16 blocks (docs/formats.md §4), so no shuffles are needed; the
// dequantization is the reference's bf16_rn((q - z) * s), FP32 accumulation. Warp w of the CTA
// takes the k-tiles of warp_k_range and the warps' partial columns are summed in warp order
// (deterministic). Returns the 64 FP32 columns in red[0..63] (after the block barrier).
__device__ __forceinline__ void gemv_tile(const int32_t* __restrict__ w, const uint16_t* __restrict__ scale,
                                          const int32_t* __restrict__ zp, bool has_zp, const uint16_t* __restrict__ xs,
                                          int32_t n, int32_t k, int32_t groups, int32_t glen_log2, int32_t nt,
                                          float* __restrict__ red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int c = lane >> 2, r = 2 * (lane & 3);
  const bool token_lane = c == 0; // B fragment column 0 = lanes 0..3
  const warp_k_range range(k, warp, warps);
  const int64_t slab_u4 = n / 2; // uint4 per 16-row slab (2n words)
  const uint4* wp = reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(nt) * 32 + lane;
  const bool grouped = groups > 1;
  float acc[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[j][i] = 0.0f;
  uint32_t sc[8], nz[8]; // the lane's 8 columns c + 8m (m = 2j + half) for the current group
  int32_t cur = -1;
  for (int32_t k0 = range.begin; k0 < range.end; k0 += k_gemv_batch) {
    uint4 t[k_gemv_batch];
#pragma unroll
    for (int u = 0; u < k_gemv_batch; ++u)
      if (k0 + u < range.end)
        t[u] = __ldg(wp + static_cast<int64_t>(k0 + u) * slab_u4);
#pragma unroll
    for (int u = 0; u < k_gemv_batch; ++u) {
      if (k0 + u >= range.end)
        break;
      const int32_t kt = k0 + u;
      const int32_t g = grouped ? (kt * 16) >> glen_log2 : 0;
      if (g != cur) {
        const auto* zrow = has_zp ? reinterpret_cast<const uint32_t*>(zp) + static_cast<int64_t>(g) * (n / 8) + 8 * nt
                                  : nullptr;
        w4a16::load_group(grouped, has_zp, scale + static_cast<int64_t>(g) * n + 64 * nt, zrow, lane, sc, nz);
        cur = g;
      }
      const uint32_t xa = *reinterpret_cast<const uint32_t*>(xs + 16 * kt + r);
      const uint32_t xb = *reinterpret_cast<const uint32_t*>(xs + 16 * kt + r + 8);
      const uint32_t b0 = token_lane ? xa : 0u, b1 = token_lane ? xb : 0u;
      const uint32_t words[4] = {t[u].x, t[u].y, t[u].z, t[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t d[4];
        w4a16::dequant_word(words[j], nz[2 * j], sc[2 * j], nz[2 * j + 1], sc[2 * j + 1], d);
        const uint32_t a[4] = {d[0], d[2], d[1], d[3]}; // A: (n, k) (n + 8, k) (n, k + 8) (n + 8, k + 8)
        mma_bf16(acc[j], a, b0, b1);
      }
    }
  }
  // D fragment: lane 4c holds column 0 (the token) of rows c (acc[j][0]) and c + 8 (acc[j][2]).
  __shared__ float part[k_gemv_max_warps][64];
  if ((lane & 3) == 0)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      part[warp][16 * j + c] = acc[j][0];
      part[warp][16 * j + c + 8] = acc[j][2];
    }
  __syncthreads();
  if (threadIdx.x < 64) {
    float sum = 0.0f;
    for (int i = 0; i < warps; ++i) // warp order: deterministic
      sum += part[i][threadIdx.x];
    red[threadIdx.x] = sum;
  }
  __syncthreads();
}

// Pulls the serving tiles this warp of gemv_tile will read (same warp_k_range) into L2, so their
// DRAM latency overlaps the staging of the input vector.
__device__ __forceinline__ void gemv_prefetch(const int32_t* __restrict__ w, int32_t n, int32_t k, int32_t nt) {
  const int lane = threadIdx.x & 31;
  const warp_k_range range(k, threadIdx.x >> 5, blockDim.x >> 5);
  const char* base = reinterpret_cast<const char*>(w + static_cast<int64_t>(nt) * 128);
  for (int32_t i = lane; i < (range.end - range.begin) * 4; i += 32) // 4 lines of 128 B per 512 B tile
    asm volatile("prefetch.global.L2 [%0];" ::"l"(base + static_cast<int64_t>(range.begin + i / 4) * n * 8 +
                                                  (i % 4) * 128));
}

// w13: grid (2I/64, pairs), pair = token * top_k + slot. Warp 0 routes the CTA's token (the same
// top-k as moe_topk_kernel) while the others stage x; the CTAs of slot 0, tile 0 publish the
// token's ids and weights for the w2 kernel. Output gate | up in FP32: gu [pairs, 2I].
__global__ void __launch_bounds__(32 * k_gemv_max_warps)
moe_gemv13_kernel(const uint16_t* __restrict__ x, const float* __restrict__ logits, int32_t experts, bool norm,
                  int32_t top_k, int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights,
                  const int32_t* __restrict__ w13, const uint16_t* __restrict__ scale,
                  const int32_t* __restrict__ zp, bool has_zp, int32_t hidden, int32_t inter, int32_t groups,
                  int32_t glen_log2, float* __restrict__ gu) {
  extern __shared__ uint16_t xs[]; // [H] bf16
  __shared__ float red[64];
  __shared__ int32_t route_ids[32];
  __shared__ float route_w[32]; // top_k <= 32
  programmatic_wait(); // router logits and x (kernels/cuda/programmatic_launch.cuh)
  programmatic_trigger();
  const int32_t pair = blockIdx.y, nt = blockIdx.x, n = 2 * inter;
  const int32_t t = pair / top_k, slot = pair % top_k;
  if (threadIdx.x < 32)
    topk_one_token(logits, t, experts, top_k, norm, route_ids, route_w);
  const uint16_t* xr = x + static_cast<int64_t>(t) * hidden;
  for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) // H % 64 == 0: 16-byte chunks
    reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(xr)[i];
  __syncthreads();
  if (nt == 0 && slot == 0 && threadIdx.x < top_k) {
    topk_ids[static_cast<int64_t>(t) * top_k + threadIdx.x] = route_ids[threadIdx.x];
    topk_weights[static_cast<int64_t>(t) * top_k + threadIdx.x] = route_w[threadIdx.x];
  }
  const int32_t e = route_ids[slot];
  const int64_t words = static_cast<int64_t>(hidden) * n / 8, groups_n = static_cast<int64_t>(groups) * n;
  gemv_tile(w13 + e * words, scale + e * groups_n, has_zp ? zp + e * (groups_n / 8) : nullptr, has_zp, xs, n,
            hidden, groups, glen_log2, nt, red);
  if (threadIdx.x < 64)
    gu[static_cast<int64_t>(pair) * n + 64 * nt + threadIdx.x] = red[threadIdx.x];
}

// w2: grid (H/64, pairs). h = bf16(silu(bf16 g) * bf16 u) from gu, FP32 rows y [pairs, H]; the
// last of a token's top_k CTAs on a column tile (an atomic count per (token, tile), reset by that
// CTA) combines the tile: out[t] = bf16(sum_s w_s y_s) in slot order, as moe_combine_kernel.
__global__ void __launch_bounds__(32 * k_gemv_max_warps)
moe_gemv2_kernel(const float* __restrict__ gu, const int32_t* __restrict__ topk_ids,
                 const float* __restrict__ topk_weights, int32_t top_k,
                 const int32_t* __restrict__ w2, const uint16_t* __restrict__ scale,
                 const int32_t* __restrict__ zp, bool has_zp, int32_t hidden, int32_t inter, int32_t groups,
                 int32_t glen_log2, float* __restrict__ y, int32_t* __restrict__ arrivals,
                 uint16_t* __restrict__ out) {
  extern __shared__ uint16_t hs[]; // [I] bf16
  __shared__ float red[64];
  __shared__ bool last;
  programmatic_wait(); // the routing and gu of the w13 kernel
  programmatic_trigger();
  const int32_t pair = blockIdx.y, nt = blockIdx.x;
  const int32_t t = pair / top_k;
  const int32_t e = topk_ids[pair];
  const int64_t words = static_cast<int64_t>(inter) * hidden / 8, groups_n = static_cast<int64_t>(groups) * hidden;
  gemv_prefetch(w2 + e * words, hidden, inter, nt);
  const float* row = gu + static_cast<int64_t>(pair) * 2 * inter;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) {
    const float g = __bfloat162float(__float2bfloat16_rn(row[i]));
    const float u = __bfloat162float(__float2bfloat16_rn(row[inter + i]));
    hs[i] = __bfloat16_as_ushort(__float2bfloat16_rn(g / (1.0f + expf(-g)) * u));
  }
  __syncthreads();
  gemv_tile(w2 + e * words, scale + e * groups_n, has_zp ? zp + e * (groups_n / 8) : nullptr, has_zp, hs, hidden,
            inter, groups, glen_log2, nt, red);
  const int64_t col = 64 * nt + threadIdx.x;
  if (threadIdx.x < 64) {
    y[static_cast<int64_t>(pair) * hidden + col] = red[threadIdx.x];
    __threadfence(); // y before the count (the classic last-block pattern)
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* count = arrivals + static_cast<int64_t>(t) * (hidden / 64) + nt;
    last = atomicAdd(count, 1) == top_k - 1;
    if (last)
      *count = 0; // every slot has arrived: ready for the next launch
  }
  __syncthreads();
  if (!last || threadIdx.x >= 64)
    return;
  __threadfence();
  float acc = 0.0f;
  for (int32_t s = 0; s < top_k; ++s) {
    const float v = __ldcg(y + (static_cast<int64_t>(t) * top_k + s) * hidden + col);
    acc = __fadd_rn(acc, __fmul_rn(__ldcg(topk_weights + static_cast<int64_t>(t) * top_k + s), v));
  }
  out[static_cast<int64_t>(t) * hidden + col] = __bfloat16_as_ushort(__float2bfloat16_rn(acc));
}

// Warps per GEMV CTA: at least 4 k-tiles (64 k) each, at least 2 (the 64 threads that write the
// tile's columns), at most 8.
int gemv_warps(int64_t k) { return static_cast<int>(std::clamp<int64_t>(k / 64, 2, k_gemv_max_warps)); }

// ---- workspace layout ---------------------------------------------------------------------------------

// Regions, each 256-byte aligned, sized for the token capacity and for the largest m block, so
// no offset depends on the tokens or the variant of one launch:
//   topk ids, topk weights [cap*k] | sorted ids [align capacity at block 64] | block experts
//   [align capacity at block 8 / 8] | num_padded | h [cap*k, I] bf16 | y [cap*k, H] FP32 |
//   gate|up of the GEMV path [min(cap*k, 64), 2I] FP32 | its arrival counts [min(cap, 64), H/64] |
//   GEMM partials (any variant) | GEMM tile counters (8-row blocks, the larger GEMM)
struct moe_layout {
  std::size_t ids = 0, weights = 0, sorted = 0, block_expert = 0, num_padded = 0, h = 0, y = 0, gu = 0;
  std::size_t arrivals = 0, arrivals_bytes = 0;
  std::size_t partials = 0, counters = 0, total = 0;
  int64_t max_tiles = 0;
};

std::size_t round256(std::size_t x) { return (x + 255) / 256 * 256; }

moe_layout layout_of(const fused_moe_args& a) {
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
  l.sorted = take(moe_align_capacity(ids, a.experts, k_max_block) * sizeof(int32_t));
  const int64_t max_blocks = moe_align_capacity(ids, a.experts, 8) / 8;
  l.block_expert = take(max_blocks * sizeof(int32_t));
  l.num_padded = take(sizeof(int32_t));
  l.h = take(ids * a.intermediate * sizeof(uint16_t));
  l.y = take(ids * a.hidden * sizeof(float));
  l.gu = take(std::min(ids, k_moe_gemv_max_ids) * 2 * a.intermediate * sizeof(float)); // GEMV path
  l.arrivals_bytes = static_cast<std::size_t>(std::min(cap, k_moe_gemv_max_ids) * (a.hidden / 64)) * sizeof(int32_t);
  l.arrivals = take(l.arrivals_bytes);
  l.partials = take(w4a16::partial_bytes());
  // CTA tiles along n: w13 pairs 128 gate with 128 up columns, w2 covers 256 columns.
  const int64_t n_tiles = std::max<int64_t>((a.intermediate + w4a16::k_tile_n / 2 - 1) / (w4a16::k_tile_n / 2),
                                            (a.hidden + w4a16::k_tile_n - 1) / w4a16::k_tile_n);
  l.max_tiles = n_tiles * max_blocks;
  l.counters = take(w4a16::counter_bytes(l.max_tiles));
  l.total = off;
  return l;
}

// Rows per m block: the smallest whose rows the average expert fills to < 90% (vLLM's rule), so
// decode pads little (8-row swap-AB blocks up to ~115 tokens at E 128, top-8) and prefill gets
// large blocks.
int moe_block_rows(const fused_moe_args& a) {
  if (a.batch_invariant)
    return 8; // one variant at every T: its in-CTA k split is part of the summation order
  if (w4a16::block_rows_valid(a.block_rows))
    return a.block_rows;
  const double per_expert = static_cast<double>(a.tokens) * a.top_k / static_cast<double>(a.experts);
  for (int rows : {8, 16, 32, 48})
    if (per_expert / rows < 0.9)
      return rows;
  return w4a16::block_rows_for(64);
}

} // namespace

kernel_status moe_topk_launch(const moe_topk_args& a, cudaStream_t stream) {
  if (auto st = moe_topk_can_implement(a); st != kernel_status::ok)
    return st;
  if (a.tokens == 0)
    return kernel_status::ok;
  const auto grid = static_cast<unsigned>((a.tokens + k_topk_warps - 1) / k_topk_warps);
  moe_topk_kernel<<<grid, 32 * k_topk_warps, 0, stream>>>(a.router_logits, static_cast<int32_t>(a.tokens),
                                                          static_cast<int32_t>(a.experts), a.top_k, a.norm_topk_prob,
                                                          a.topk_ids, a.topk_weights);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

kernel_status moe_align_launch(const moe_align_args& a, cudaStream_t stream) {
  if (auto st = moe_align_can_implement(a); st != kernel_status::ok)
    return st;
  const std::size_t smem = align_smem_bytes(a.experts);
  moe_align_kernel<<<1, k_align_threads, smem, stream>>>(a.topk_ids, static_cast<int32_t>(a.num_ids),
                                                         static_cast<int32_t>(a.experts), a.block, a.sorted_ids,
                                                         a.block_expert, a.num_padded);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

std::size_t fused_moe_workspace_bytes(const fused_moe_args& a) {
  if (fused_moe_can_implement(a) != kernel_status::ok)
    return 0;
  return layout_of(a).total;
}

kernel_status fused_moe_workspace_init(const fused_moe_args& a, void* workspace, cudaStream_t stream) {
  if (auto st = fused_moe_can_implement(a); st != kernel_status::ok)
    return st;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  const moe_layout l = layout_of(a);
  RLSERVE_CUDA_TRY(cudaMemsetAsync(static_cast<unsigned char*>(workspace) + l.counters, 0,
                                   w4a16::counter_bytes(l.max_tiles), stream));
  RLSERVE_CUDA_TRY(cudaMemsetAsync(static_cast<unsigned char*>(workspace) + l.arrivals, 0,
                                   l.arrivals_bytes, stream));
  return kernel_status::ok;
}

fused_moe_workspace_view fused_moe_workspace_parts(const fused_moe_args& a, void* workspace) {
  fused_moe_workspace_view v;
  if (fused_moe_can_implement(a) != kernel_status::ok || workspace == nullptr)
    return v;
  const moe_layout l = layout_of(a);
  auto* base = static_cast<unsigned char*>(workspace);
  v.topk_ids = reinterpret_cast<int32_t*>(base + l.ids);
  v.topk_weights = reinterpret_cast<float*>(base + l.weights);
  v.sorted_ids = reinterpret_cast<int32_t*>(base + l.sorted);
  v.block_expert = reinterpret_cast<int32_t*>(base + l.block_expert);
  v.num_padded = reinterpret_cast<int32_t*>(base + l.num_padded);
  v.h = reinterpret_cast<uint16_t*>(base + l.h);
  v.y = reinterpret_cast<float*>(base + l.y);
  v.block = moe_block_rows(a);
  return v;
}

kernel_status fused_moe_launch(const fused_moe_args& a, void* workspace, cudaStream_t stream) {
  if (auto st = fused_moe_can_implement(a); st != kernel_status::ok)
    return st;
  if (a.tokens == 0)
    return kernel_status::ok;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  const moe_layout l = layout_of(a);
  const fused_moe_workspace_view v = fused_moe_workspace_parts(a, workspace);
  auto* base = static_cast<unsigned char*>(workspace);
  auto* counters = reinterpret_cast<int*>(base + l.counters);
  auto* partials = reinterpret_cast<float*>(base + l.partials);
  const int mb = moe_block_rows(a);
  const int32_t block = mb;
  const int64_t T = a.tokens, H = a.hidden, I = a.intermediate, K = a.top_k;
  const int64_t num_ids = T * K;
  const int64_t groups13 = a.group_size == k_int4_channel ? 1 : H / a.group_size;
  const int64_t groups2 = a.group_size == k_int4_channel ? 1 : I / a.group_size;

  moe_topk_args topk{T, a.experts, a.top_k, a.norm_topk_prob, a.router_logits, v.topk_ids, v.topk_weights};
  if (fused_moe_takes_gemv_path(a)) {
    if (auto st = moe_topk_can_implement(topk); st != kernel_status::ok)
      return st;
    const int32_t glen_log2 = groups13 == 1 ? 0 : 31 - __builtin_clz(static_cast<unsigned>(a.group_size));
    auto* gu = reinterpret_cast<float*>(base + l.gu);
    auto* arrivals = reinterpret_cast<int32_t*>(base + l.arrivals);
    const int w13_warps = gemv_warps(H), w2_warps = gemv_warps(I);
    RLSERVE_CUDA_TRY(launch_programmatic(
      moe_gemv13_kernel, dim3(static_cast<unsigned>(2 * I / 64), static_cast<unsigned>(num_ids)), 32 * w13_warps,
      H * sizeof(uint16_t), stream, a.x, a.router_logits, static_cast<int32_t>(a.experts), a.norm_topk_prob,
      a.top_k, v.topk_ids, v.topk_weights, a.w13, a.w13_scale, a.w13_zero_point, a.has_zero_point,
      static_cast<int32_t>(H), static_cast<int32_t>(I), static_cast<int32_t>(groups13), glen_log2, gu));
    RLSERVE_CUDA_TRY(launch_programmatic(
      moe_gemv2_kernel, dim3(static_cast<unsigned>(H / 64), static_cast<unsigned>(num_ids)), 32 * w2_warps,
      I * sizeof(uint16_t), stream, gu, v.topk_ids, v.topk_weights, a.top_k, a.w2, a.w2_scale, a.w2_zero_point,
      a.has_zero_point, static_cast<int32_t>(H), static_cast<int32_t>(I), static_cast<int32_t>(groups2), glen_log2,
      v.y, arrivals, a.out));
    return kernel_status::ok;
  }
  moe_align_args align{num_ids, a.experts, block, v.topk_ids, v.sorted_ids, v.block_expert, v.num_padded};
  if (T <= k_route_max_tokens) {
    if (auto st = moe_topk_can_implement(topk); st != kernel_status::ok)
      return st;
    if (auto st = moe_align_can_implement(align); st != kernel_status::ok)
      return st;
    const std::size_t smem = align_smem_bytes(a.experts);
    moe_route_kernel<<<1, k_align_threads, smem, stream>>>(
      a.router_logits, static_cast<int32_t>(T), static_cast<int32_t>(a.experts), a.top_k, a.norm_topk_prob,
      v.topk_ids, v.topk_weights, block, v.sorted_ids, v.block_expert, v.num_padded);
    RLSERVE_CUDA_CHECK_LAUNCH();
  } else {
    if (auto st = moe_topk_launch(topk, stream); st != kernel_status::ok)
      return st;
    if (auto st = moe_align_launch(align, stream); st != kernel_status::ok)
      return st;
  }

  const int grid = w4a16::grid_for(mb, a.max_ctas);
  if (grid < 1)
    return kernel_status::cuda_error;
  w4a16::problem p;
  p.moe = true;
  p.sorted_ids = v.sorted_ids;
  p.block_expert = v.block_expert;
  p.num_padded = v.num_padded;
  p.max_m_blocks = static_cast<int32_t>(moe_align_capacity(num_ids, a.experts, block) / block);
  p.num_ids = static_cast<int32_t>(num_ids);
  p.has_zero_point = a.has_zero_point;
  p.whole_tiles = a.batch_invariant;

  // w13: rows of x gathered by token (= id / k), gate | up columns paired per CTA tile.
  p.a_row_div = a.top_k;
  p.a = a.x;
  p.lda = H;
  p.b = a.w13;
  p.b_batch_stride = H * 2 * I / 8;
  p.scale = a.w13_scale;
  p.scale_batch_stride = groups13 * 2 * I;
  p.zero_point = a.w13_zero_point;
  p.zp_batch_stride = groups13 * (2 * I / 8);
  p.n = static_cast<int32_t>(2 * I);
  p.k = static_cast<int32_t>(H);
  p.groups = static_cast<int32_t>(groups13);
  p.glen = static_cast<int32_t>(H / groups13);
  p.ep = w4a16::epilogue::silu_mul_bf16;
  p.c = v.h;
  p.ldc = I;
  p.up_tile_offset = static_cast<int32_t>(I / 64);
  // Batch-invariant: a CTA per tile the capacity allows (whole tiles), else the persistent grid.
  auto grid_of = [&](const w4a16::problem& q) {
    return a.batch_invariant ? static_cast<int>(w4a16::tiles_of(q, mb)) : grid;
  };
  if (auto st = w4a16::run(p, mb, grid_of(p), counters, partials, stream, true); st != kernel_status::ok)
    return st;

  // w2: rows of h by flat id, FP32 rows of y. Launched as a programmatic dependent of w13: its
  // CTAs start on the SMs w13 leaves and pull their first weights into L2 before waiting for h.
  p.a_row_div = 1;
  p.a = v.h;
  p.lda = I;
  p.b = a.w2;
  p.b_batch_stride = I * H / 8;
  p.scale = a.w2_scale;
  p.scale_batch_stride = groups2 * H;
  p.zero_point = a.w2_zero_point;
  p.zp_batch_stride = groups2 * (H / 8);
  p.n = static_cast<int32_t>(H);
  p.k = static_cast<int32_t>(I);
  p.groups = static_cast<int32_t>(groups2);
  p.glen = static_cast<int32_t>(I / groups2);
  p.ep = w4a16::epilogue::store_f32;
  p.c = v.y;
  p.ldc = H;
  p.up_tile_offset = 0;
  p.prefetch_units = k_moe_prefetch_units;
  if (auto st = w4a16::run(p, mb, grid_of(p), counters, partials, stream, true); st != kernel_status::ok)
    return st;

  cudaLaunchConfig_t cc{};
  cc.gridDim = dim3(static_cast<unsigned>(T));
  cc.blockDim = dim3(k_combine_threads);
  cc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cc.attrs = attr;
  cc.numAttrs = RLSERVE_W4A16_PDL ? 1 : 0;
  RLSERVE_CUDA_TRY(cudaLaunchKernelEx(&cc, moe_combine_kernel, static_cast<const float*>(v.y),
                                      static_cast<const float*>(v.topk_weights), static_cast<int32_t>(H), a.top_k,
                                      a.out));
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

} // namespace rlserve::kernels
