// Paged attention (kernels/paged_attention.hpp): prefill chunks and decode rows in one launch.
//
// Work unit = one CTA per (query row t, kv head g, split j): the CTA owns all G = q_heads / kv_heads
// query heads that read kv head g, so every K/V row of the split is read from memory once.
// Splits: a row of context L = pos + 1 is cut into n(L) <= 32 splits of fixed length
// S(L) = 32 * 2^e (the smallest e with ceil(L / S) <= 32) -- a function of the row's own length
// only, so a sequence's reduction order never depends on the batch around it. A row with one
// split writes its output directly; otherwise each split writes (o / l, log2-sum-exp) in fp32 to
// the workspace, and the last CTA of the (row, kv head) to finish -- an arrival counter per pair in
// the workspace, reset by that CTA -- merges the splits in index order. (A separate merge kernel
// costs a launch and a dependent chain of its own, a large part of a batch-1 layer's attention:
// docs/performance.md, 'Paged attention at batch 1'.) Which CTA merges varies; what it computes
// does not.
//
// Inside the CTA (128 threads): 32-token tiles of K and V stream through a 2-stage cp.async
// ring in shared memory (rows padded by 16 bytes: conflict-free 16-byte reads of different rows);
// S = Q K^T with a thread per (token, 4 heads), online softmax with a warp per head (exp2, the
// scale folded with log2 e into Q), O += P V with a thread per (8 dims, head). fp32 throughout,
// one bf16 rounding of the output. CUDA cores only (no mma.sync yet).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/paged_attention.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_threads = 128;
constexpr int k_tile = 32;        // tokens per K/V tile
// Shortest split: one K/V tile. A decode row at batch 1 has only kv_heads CTAs per split, and a
// CTA's tiles are a chain of dependent loads, each paying a memory round trip: short splits put a
// short context's tiles on different SMs (splits of 128 against 32 at batch 1:
// docs/performance.md, 'Paged attention at batch 1').
constexpr int k_split_base = 32;
constexpr int k_max_splits = 32;  // splits per row at most (bounds the workspace)
constexpr int k_max_group = 16;   // q heads per kv head at most
constexpr float k_log2e = 1.4426950408889634f;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__host__ __device__ __forceinline__ int split_len(int64_t L) {
  int s = k_split_base;
  while ((L + s - 1) / s > k_max_splits)
    s *= 2;
  return s;
}

int64_t context_of(const paged_attention_args& a) {
  return a.max_context > 0 ? a.max_context : a.max_blocks * a.block_size;
}
int64_t static_splits(const paged_attention_args& a) {
  const int64_t c = context_of(a);
  const int64_t n = (c + k_split_base - 1) / k_split_base;
  return n < k_max_splits ? n : k_max_splits;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // src-size 0 zero-fills the 16 bytes: masked tokens read as 0, never as stale NaN.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void unpack8(const uint4& w, float* f) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint16_t to_bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ uint4 pack8(const float* f) {
  uint32_t u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    u[i] = static_cast<uint32_t>(to_bf(f[2 * i])) | (static_cast<uint32_t>(to_bf(f[2 * i + 1])) << 16);
  return make_uint4(u[0], u[1], u[2], u[3]);
}

// Merge of query head qh's splits in split order, dims dc*8 .. dc*8+7:
// o = sum_j 2^(lse_j - M) o_j / sum_j 2^(lse_j - M). Partials are read through L2 (ld.cg): other
// CTAs wrote them during this launch.
template <int D>
__device__ __forceinline__ void merge_splits(const float* part_o, const float* part_lse, uint16_t* out, int64_t qh,
                                             int dc, int32_t ns, int nsp) {
  const float* lse = part_lse + qh * ns;
  float M = -INFINITY;
  for (int j = 0; j < nsp; ++j)
    M = fmaxf(M, __ldcg(lse + j));
  float acc[8] = {}, wsum = 0.0f;
  for (int j = 0; j < nsp; ++j) {
    const float w = M == -INFINITY ? 0.0f : exp2f(__ldcg(lse + j) - M);
    wsum += w;
    const float4* src = reinterpret_cast<const float4*>(part_o + (qh * ns + j) * D + dc * 8);
    const float4 a = __ldcg(src), b = __ldcg(src + 1);
    acc[0] = fmaf(w, a.x, acc[0]), acc[1] = fmaf(w, a.y, acc[1]), acc[2] = fmaf(w, a.z, acc[2]);
    acc[3] = fmaf(w, a.w, acc[3]), acc[4] = fmaf(w, b.x, acc[4]), acc[5] = fmaf(w, b.y, acc[5]);
    acc[6] = fmaf(w, b.z, acc[6]), acc[7] = fmaf(w, b.w, acc[7]);
  }
  const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    acc[j] *= inv;
  reinterpret_cast<uint4*>(out + qh * D)[dc] = pack8(acc);
}

template <int D>
__global__ void __launch_bounds__(k_threads)
paged_attention_kernel(const uint16_t* __restrict__ q,        // [tokens, q_heads, D]
                       const uint16_t* __restrict__ k_cache,  // [slots, kv_heads, D]
                       const uint16_t* __restrict__ v_cache,  // [slots, kv_heads, D]
                       const int32_t* __restrict__ block_table, // [sequences, max_blocks]
                       const int32_t* __restrict__ row_seq, const int32_t* __restrict__ row_pos,
                       uint16_t* __restrict__ out,            // [tokens, q_heads, D]
                       float* __restrict__ part_o,            // [tokens, q_heads, NS, D]
                       float* __restrict__ part_lse,          // [tokens, q_heads, NS]
                       unsigned* __restrict__ arrivals,       // [tokens, kv_heads], zero between launches
                       int32_t q_heads, int32_t kv_heads, int32_t max_blocks, int32_t block_size,
                       int64_t context, int32_t ns, float scale2) {
  constexpr int C = D / 8;              // 16-byte chunks per row
  constexpr int RS = D + 8;             // padded smem row (elements)
  constexpr int PV_ROWS = k_threads / C; // heads covered per PV pass (8 or 16)
  constexpr int PV_H = (k_max_group + PV_ROWS - 1) / PV_ROWS;
  __shared__ __align__(16) uint16_t ks[2][k_tile][RS];
  __shared__ __align__(16) uint16_t vs[2][k_tile][RS];
  __shared__ __align__(16) float qs[k_max_group][D];
  __shared__ float ps[k_max_group][k_tile];
  __shared__ float m_run[k_max_group], l_run[k_max_group], alpha[k_max_group];

  programmatic_wait(); // q and the KV written by the previous kernel
  programmatic_trigger();
  const int64_t t = blockIdx.x;
  const int g = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
  const int G = q_heads / kv_heads;
  const int seq = row_seq[t];
  const int dc = tid % C, hr = tid / C;
  if (seq < 0) { // padding row: zeros, written once
    if (split == 0)
      for (int h = hr; h < G; h += PV_ROWS)
        reinterpret_cast<uint4*>(out + (t * q_heads + int64_t{g} * G + h) * D)[dc] = make_uint4(0, 0, 0, 0);
    return;
  }
  int64_t L = int64_t{row_pos[t]} + 1;
  L = L < 1 ? 1 : (L > context ? context : L);
  const int S = split_len(L);
  const int nsp = static_cast<int>((L + S - 1) / S);
  if (split >= nsp)
    return;
  const int64_t begin = int64_t{split} * S;
  const int64_t end = begin + S < L ? begin + S : L;
  const int ntiles = static_cast<int>((end - begin + k_tile - 1) / k_tile);
  const int32_t* table = block_table + int64_t{seq} * max_blocks;

  auto load_tile = [&](int buf, int i) {
#pragma unroll
    for (int c = tid; c < k_tile * C; c += k_threads) {
      const int tok = c / C, col = c % C;
      const int64_t j = begin + int64_t{i} * k_tile + tok;
      const bool valid = j < end;
      int64_t slot = 0;
      if (valid)
        slot = int64_t{table[j / block_size]} * block_size + j % block_size;
      const int64_t off = (slot * kv_heads + g) * D + col * 8;
      cp_async16(&ks[buf][tok][col * 8], k_cache + off, valid);
      cp_async16(&vs[buf][tok][col * 8], v_cache + off, valid);
    }
  };
  load_tile(0, 0);
  cp_async_commit();

  for (int i = tid; i < G * D; i += k_threads) {
    const int h = i / D, d = i % D;
    qs[h][d] = __uint_as_float(static_cast<uint32_t>(q[(t * q_heads + int64_t{g} * G + h) * D + d]) << 16) * scale2;
  }
  if (tid < k_max_group) {
    m_run[tid] = -INFINITY;
    l_run[tid] = 0.0f;
  }
  float o[PV_H][8];
#pragma unroll
  for (int k = 0; k < PV_H; ++k)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      o[k][j] = 0.0f;

  const int tok = tid % k_tile, hq = tid / k_tile; // QK: a thread per (token, heads hq + 4 k)
  const int warp = tid / 32, lane = tid & 31;
  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < ntiles) {
      load_tile(buf ^ 1, it + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int n_valid = static_cast<int>(end - (begin + int64_t{it} * k_tile));
    // S = Q K^T (log2 domain)
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
    for (int c = 0; c < C; ++c) {
      float kf[8];
      unpack8(*reinterpret_cast<const uint4*>(&ks[buf][tok][c * 8]), kf);
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) {
        const int h = hq + 4 * hh;
        if (h < G) {
          const float4 q0 = *reinterpret_cast<const float4*>(&qs[h][c * 8]);
          const float4 q1 = *reinterpret_cast<const float4*>(&qs[h][c * 8 + 4]);
          acc[hh] = fmaf(q0.x, kf[0], acc[hh]);
          acc[hh] = fmaf(q0.y, kf[1], acc[hh]);
          acc[hh] = fmaf(q0.z, kf[2], acc[hh]);
          acc[hh] = fmaf(q0.w, kf[3], acc[hh]);
          acc[hh] = fmaf(q1.x, kf[4], acc[hh]);
          acc[hh] = fmaf(q1.y, kf[5], acc[hh]);
          acc[hh] = fmaf(q1.z, kf[6], acc[hh]);
          acc[hh] = fmaf(q1.w, kf[7], acc[hh]);
        }
      }
    }
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) {
      const int h = hq + 4 * hh;
      if (h < G)
        ps[h][tok] = tok < n_valid ? acc[hh] : -INFINITY;
    }
    __syncthreads();
    // online softmax: a warp per head, a lane per token
    for (int h = warp; h < G; h += k_threads / 32) {
      const float s = ps[h][lane];
      float mx = s;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_old = m_run[h];
      const float m_new = fmaxf(m_old, mx);
      const float p = s == -INFINITY ? 0.0f : exp2f(s - m_new);
      float sum = p;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
      ps[h][lane] = p;
      __syncwarp();
      if (lane == 0) {
        const float al = m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
        alpha[h] = al;
        l_run[h] = l_run[h] * al + sum;
        m_run[h] = m_new;
      }
    }
    __syncthreads();
    // O = O * alpha + P V
#pragma unroll
    for (int k = 0; k < PV_H; ++k) {
      const int h = hr + k * PV_ROWS;
      if (h < G) {
        const float al = alpha[h];
#pragma unroll
        for (int j = 0; j < 8; ++j)
          o[k][j] *= al;
      }
    }
#pragma unroll 4
    for (int tk = 0; tk < k_tile; ++tk) {
      float vf[8];
      unpack8(*reinterpret_cast<const uint4*>(&vs[buf][tk][dc * 8]), vf);
#pragma unroll
      for (int k = 0; k < PV_H; ++k) {
        const int h = hr + k * PV_ROWS;
        if (h < G) {
          const float p = ps[h][tk];
#pragma unroll
          for (int j = 0; j < 8; ++j)
            o[k][j] = fmaf(p, vf[j], o[k][j]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int k = 0; k < PV_H; ++k) {
    const int h = hr + k * PV_ROWS;
    if (h >= G)
      continue;
    const float l = l_run[h];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float y[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      y[j] = o[k][j] * inv;
    const int64_t qh = t * q_heads + int64_t{g} * G + h;
    if (nsp == 1) {
      reinterpret_cast<uint4*>(out + qh * D)[dc] = pack8(y);
    } else {
      float4* dst = reinterpret_cast<float4*>(part_o + (qh * ns + split) * D + dc * 8);
      dst[0] = make_float4(y[0], y[1], y[2], y[3]);
      dst[1] = make_float4(y[4], y[5], y[6], y[7]);
      if (dc == 0)
        part_lse[qh * ns + split] = l > 0.0f ? m_run[h] + log2f(l) : -INFINITY;
    }
  }
  if (nsp == 1)
    return;
  // The last of the row's nsp CTAs for kv head g merges their G heads.
  __shared__ unsigned s_last;
  __threadfence(); // this CTA's partials are visible before its arrival counts
  __syncthreads();
  if (tid == 0) {
    unsigned* counter = arrivals + t * kv_heads + g;
    const unsigned seen = atomicAdd(counter, 1u);
    s_last = seen == static_cast<unsigned>(nsp - 1);
    if (s_last)
      *counter = 0; // ready for the next launch (every other CTA of the pair has arrived)
  }
  __syncthreads();
  if (!s_last)
    return;
  __threadfence();
  for (int i = tid; i < G * C; i += k_threads)
    merge_splits<D>(part_o, part_lse, out, t * q_heads + int64_t{g} * G + i / C, i % C, ns, nsp);
}

struct attn_layout {
  std::size_t o = 0, lse = 0, arrivals = 0, total = 0;
};
// Laid out for max_tokens rows whatever the launch's own count: the arrival counters must sit at
// the same addresses in every launch that shares the workspace (a launch of 32 rows once found
// its counters inside the partials a 2048-row prefill had written there).
attn_layout attn_layout_of(const paged_attention_args& a) {
  attn_layout l;
  const int64_t ns = static_splits(a);
  const int64_t cap = a.max_tokens > 0 ? a.max_tokens : a.tokens;
  if (ns <= 1 || cap == 0)
    return l;
  const auto rows = static_cast<std::size_t>(cap * a.q_heads * ns);
  l.arrivals = 0;
  l.o = (static_cast<std::size_t>(cap * a.kv_heads) * sizeof(unsigned) + 255) / 256 * 256;
  l.lse = l.o + (rows * a.head_dim * sizeof(float) + 255) / 256 * 256;
  l.total = l.lse + (rows * sizeof(float) + 255) / 256 * 256;
  return l;
}

} // namespace

std::size_t paged_attention_workspace_bytes(const paged_attention_args& a) {
  if (paged_attention_can_implement(a) != kernel_status::ok)
    return 0;
  return attn_layout_of(a).total;
}

kernel_status paged_attention_workspace_init(const paged_attention_args& a, void* workspace, cudaStream_t stream) {
  if (auto s = paged_attention_can_implement(a); s != kernel_status::ok)
    return s;
  const attn_layout l = attn_layout_of(a);
  if (l.total == 0)
    return kernel_status::ok;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  RLSERVE_CUDA_TRY(cudaMemsetAsync(static_cast<unsigned char*>(workspace) + l.arrivals, 0, l.o - l.arrivals, stream));
  return kernel_status::ok;
}

kernel_status paged_attention_launch(const paged_attention_args& a, void* workspace, cudaStream_t stream) {
  if (auto s = paged_attention_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.tokens == 0)
    return kernel_status::ok;
  if (a.tokens > 0x7fffffff || a.kv_heads > 65535 || a.max_blocks > 0x7fffffff)
    return kernel_status::invalid_problem;
  if (!aligned16(a.q) || !aligned16(a.k_cache) || !aligned16(a.v_cache) || !aligned16(a.out))
    return kernel_status::misaligned_operand;
  const attn_layout l = attn_layout_of(a);
  if (l.total > 0 && workspace == nullptr)
    return kernel_status::workspace_null;
  if (l.total > 0 && !aligned16(workspace))
    return kernel_status::misaligned_operand;
  auto* base = static_cast<unsigned char*>(workspace);
  float* part_o = l.total ? reinterpret_cast<float*>(base + l.o) : nullptr;
  float* part_lse = l.total ? reinterpret_cast<float*>(base + l.lse) : nullptr;
  auto* arrivals = l.total ? reinterpret_cast<unsigned*>(base + l.arrivals) : nullptr;
  const auto ns = static_cast<int32_t>(static_splits(a));
  const int64_t context = context_of(a);
  const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(ns));
  const float scale2 = a.scale * k_log2e;
  const auto qh = static_cast<int32_t>(a.q_heads), kvh = static_cast<int32_t>(a.kv_heads);
  const auto mb = static_cast<int32_t>(a.max_blocks), bs = static_cast<int32_t>(a.block_size);
  RLSERVE_CUDA_TRY(launch_programmatic(a.head_dim == 128 ? paged_attention_kernel<128> : paged_attention_kernel<64>,
                                      grid, k_threads, 0, stream, a.q, a.k_cache, a.v_cache, a.block_table, a.row_seq,
                                      a.row_pos, a.out, part_o, part_lse, arrivals, qh, kvh, mb, bs, context, ns,
                                      scale2));
  return kernel_status::ok;
}

} // namespace rlserve::kernels
