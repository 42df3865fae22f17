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
// Inside the CTA (4 warps): 32-token tiles of K and V stream through a 2-stage cp.async ring in
// shared memory (rows padded by 16 bytes: conflict-free fragment reads). Both products run on the
// tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), the G query heads as the 16 rows
// (zero past G): S = Q K^T with a warp per 8 tokens of the tile and Q's fragments held in
// registers for the whole split; the tile's maximum per head through shared memory, the online
// softmax in the log2 domain (exp2, scale times log2 e applied to S); O += P V with a warp per D/4
// output dims, V's fragments by transposing ldmatrix, and P in two bf16 parts (P = hi + lo, two
// MMAs) so that P V carries about 16 bits of P where one bf16 P would carry 8. The CUDA-core
// kernel this replaced spent ~1,000 dependent instructions per thread and tile (docs/
// performance.md, 'What bounds each decode goal'). One bf16 rounding of the output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/cuda/ptx_helpers.cuh"
#include "kernels/paged_attention.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_threads = 128;
constexpr int k_warps = k_threads / 32;
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

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Four 8 x 8 bf16 matrices from shared memory, transposed: lane l gives the address of row
// (l % 8) of matrix l / 8 and receives, of each matrix, the pair (rows 2 (l % 4), +1; column l / 4).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const uint16_t* row) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
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
  constexpr int RS = D + 8;             // padded smem row (elements): 16-byte rows, conflict-free
  constexpr int KS = D / 16;            // k16 steps of Q K^T
  constexpr int DW = D / k_warps;       // output dims per warp in P V (32 or 16)
  constexpr int NB = DW / 8;            // n8 blocks per warp in P V
  constexpr int PS = k_tile + 8;        // padded P row (elements): conflict-free fragment reads
  static_assert(k_tile == 8 * k_warps, "Q K^T: one 8-token block per warp");
  static_assert(NB % 2 == 0, "P V: x4 ldmatrix covers two n8 blocks");
  __shared__ __align__(16) uint16_t ks[2][k_tile][RS];
  __shared__ __align__(16) uint16_t vs[2][k_tile][RS];
  __shared__ __align__(16) uint16_t p_hi[k_max_group][PS]; // P = p_hi + p_lo, both bf16
  __shared__ __align__(16) uint16_t p_lo[k_max_group][PS];
  __shared__ float red[k_warps][k_max_group];              // per-warp tile maxima, then l sums

  programmatic_wait(); // q and the KV written by the previous kernel
  programmatic_trigger();
  const int64_t t = blockIdx.x;
  const int g = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
  const int G = q_heads / kv_heads;
  const int seq = row_seq[t];
  if (seq < 0) { // padding row: zeros, written once
    if (split == 0)
      for (int i = tid; i < G * C; i += k_threads)
        reinterpret_cast<uint4*>(out + (t * q_heads + int64_t{g} * G + i / C) * D)[i % C] = make_uint4(0, 0, 0, 0);
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

  const int warp = tid / 32, lane = tid & 31;
  const int gq = lane >> 2, qq = lane & 3; // fragment row (head) and column pair
  // Q as the A operand of Q K^T (rows: heads, zero past G; k: dims), held for every tile.
  uint32_t qa[KS][4];
  {
    const uint16_t* q0 = q + (t * q_heads + int64_t{g} * G) * D;
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = gq + 8 * (i & 1), d = 16 * s + 2 * qq + 8 * (i >> 1);
        qa[s][i] = h < G ? *reinterpret_cast<const uint32_t*>(q0 + h * D + d) : 0u;
      }
  }
  // Every warp keeps the running maximum of heads gq and gq + 8 (the same values in every warp:
  // they come from the same shared maxima); l is this lane's share, summed over lanes and warps at
  // the end (every share was scaled by the same factors).
  float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.0f, 0.0f};
  float o[NB][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[nb][i] = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();
    __syncthreads(); // tile it is in shared memory for every warp; tile it - 1 is read by all
    if (it + 1 < ntiles) {
      load_tile(buf ^ 1, it + 1);
      cp_async_commit();
    }
    const int n_valid = static_cast<int>(end - (begin + int64_t{it} * k_tile));
    // S = Q K^T for tokens 8 warp .. 8 warp + 7 (log2 domain): rows heads gq, gq + 8, columns
    // tokens 8 warp + 2 qq, + 1.
    float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < KS; ++s)
      mma_bf16(sc, qa[s], lds32(&ks[buf][8 * warp + gq][16 * s + 2 * qq]),
                lds32(&ks[buf][8 * warp + gq][16 * s + 8 + 2 * qq]));
    float tmax[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int tok = 8 * warp + 2 * qq + c;
        sc[2 * r + c] = tok < n_valid ? sc[2 * r + c] * scale2 : -INFINITY;
      }
      float mx = fmaxf(sc[2 * r], sc[2 * r + 1]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      tmax[r] = mx;
    }
    if (qq == 0) {
      red[warp][gq] = tmax[0];
      red[warp][gq + 8] = tmax[1];
    }
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = gq + 8 * r;
      float mx = red[0][h];
#pragma unroll
      for (int w = 1; w < k_warps; ++w)
        mx = fmaxf(mx, red[w][h]);
      const float m_new = fmaxf(m_run[r], mx);
      alpha[r] = m_run[r] == -INFINITY ? 0.0f : exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
      const float p0 = sc[2 * r] == -INFINITY ? 0.0f : exp2f(sc[2 * r] - m_new);
      const float p1 = sc[2 * r + 1] == -INFINITY ? 0.0f : exp2f(sc[2 * r + 1] - m_new);
      l_part[r] = l_part[r] * alpha[r] + (p0 + p1);
      // P in two bf16 parts: P V with them carries about 16 bits of P, near the fp32 of the
      // CUDA-core kernel this replaced.
      const float h0 = bf16_round(p0), h1 = bf16_round(p1);
      *reinterpret_cast<uint32_t*>(&p_hi[h][8 * warp + 2 * qq]) = pack_bf16x2(h0, h1);
      *reinterpret_cast<uint32_t*>(&p_lo[h][8 * warp + 2 * qq]) = pack_bf16x2(p0 - h0, p1 - h1);
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      o[nb][0] *= alpha[0], o[nb][1] *= alpha[0];
      o[nb][2] *= alpha[1], o[nb][3] *= alpha[1];
    }
    __syncthreads(); // P of every warp's tokens
    // O[:, warp's dims] += P V: k = the tile's tokens in two k16 steps.
#pragma unroll
    for (int kk = 0; kk < k_tile / 16; ++kk) {
      const int c0 = 16 * kk + 2 * qq;
      const uint32_t ah[4] = {lds32(&p_hi[gq][c0]), lds32(&p_hi[gq + 8][c0]), lds32(&p_hi[gq][c0 + 8]),
                              lds32(&p_hi[gq + 8][c0 + 8])};
      const uint32_t al[4] = {lds32(&p_lo[gq][c0]), lds32(&p_lo[gq + 8][c0]), lds32(&p_lo[gq][c0 + 8]),
                              lds32(&p_lo[gq + 8][c0 + 8])};
#pragma unroll
      for (int pair = 0; pair < NB / 2; ++pair) {
        uint32_t b[4]; // b0, b1 of dims d0 .. d0 + 7, then of d0 + 8 .. d0 + 15
        const int d0 = DW * warp + 16 * pair;
        ldmatrix_x4_trans(b, &vs[buf][16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8][d0 + (lane >> 4) * 8]);
        mma_bf16(o[2 * pair], ah, b[0], b[1]);
        mma_bf16(o[2 * pair], al, b[0], b[1]);
        mma_bf16(o[2 * pair + 1], ah, b[2], b[3]);
        mma_bf16(o[2 * pair + 1], al, b[2], b[3]);
      }
    }
  }

  // l of heads gq, gq + 8: this lane's share, then the quad's, then the warps' in warp order.
  __syncthreads(); // every warp is done with red's maxima
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float v = l_part[r];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if (qq == 0)
      red[warp][gq + 8 * r] = v;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = gq + 8 * r;
    if (h >= G)
      continue;
    float l = red[0][h];
#pragma unroll
    for (int w = 1; w < k_warps; ++w)
      l += red[w][h];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int64_t qh = t * q_heads + int64_t{g} * G + h;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const int d = DW * warp + 8 * nb + 2 * qq;
      const float y0 = o[nb][2 * r] * inv, y1 = o[nb][2 * r + 1] * inv;
      if (nsp == 1)
        *reinterpret_cast<uint32_t*>(out + qh * D + d) = pack_bf16x2(y0, y1);
      else
        *reinterpret_cast<float2*>(part_o + (qh * ns + split) * D + d) = make_float2(y0, y1);
    }
    if (nsp > 1 && warp == 0 && qq == 0)
      part_lse[qh * ns + split] = l > 0.0f ? m_run[r] + log2f(l) : -INFINITY;
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
