// Building blocks of the W4A16 GEMM kernel in gemm_w4a16.cu, in the order the kernel uses them:
// the per-variant configuration, PTX helpers, the CTA's view of the problem (shape_info, cursor),
// stage loads, the Marlin-orientation and swap-AB inner loops, the epilogue and the L2 prefetch.
// gemm_w4a16.cu (read it first) describes the whole; this header is included there only, so its
// definitions stay in an unnamed namespace like the kernel's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gemm_w4a16_problem.cuh"
#include "kernels/cuda/ptx_helpers.cuh"
#include "kernels/int4_format.hpp"

namespace rlserve::kernels::w4a16 {

namespace {

constexpr int k_threads = 256;                      // 8 warps
constexpr int k_warps = k_threads / 32;
constexpr int k_sub = k_tile_n / 64;                // 4 serving sub-tiles per CTA tile
constexpr int k_kb = k_stage_k / 16;                // 8 k16 rows of serving tiles per stage
constexpr int k_kw = k_warps / k_sub;               // 2 warps along k share a sub-tile
constexpr int k_per_warp = k_kb / k_kw;             // 4 consecutive k16 rows (64 k) per warp
constexpr int k_a_chunks = k_stage_k / 8;           // 16-byte chunks per A row per stage
constexpr int k_max_stage_groups = k_stage_k / 32;  // scale rows per stage at G = 32
constexpr int k_b_per_thread = k_kb * k_sub * 32 / k_threads; // 16-byte weight copies per stage
static_assert(k_sub == 4 && k_kw == 2 && k_a_chunks == 16 && k_b_per_thread == 4, "index math below");

// Rows per m block: 8 and 16 run the swap-AB path (weights on the mma M dimension, 1 or 2 n8
// token tiles), 32 / 48 / 64 the Marlin orientation with 2..4 m16 blocks.
template <int ROWS>
struct cfg {
  static constexpr int rows = ROWS;
  static constexpr bool swap = ROWS <= 16;
  static constexpr int nt = ROWS / 8;                  // swap: n8 token tiles
  static constexpr int mb = swap ? 1 : ROWS / 16;      // Marlin: m16 blocks
  static constexpr int a_iters = (ROWS + 15) / 16;     // A copy rounds (16 rows of 16 chunks each)
  // Accumulators per thread: swap [4 m16 weight blocks][nt][4], Marlin [mb][8 n8 tiles][4].
  static constexpr int acc0 = swap ? 4 : mb;
  static constexpr int acc1 = swap ? nt : 8;
  // 16 KB of weights per stage. 8 rows: 2 CTAs/SM (128 registers), 4 stages. 16 rows spill under
  // that register cap: 1 CTA/SM, 6 stages. The Marlin variants (150-250 registers): 1 CTA/SM with
  // the deepest pipeline that fits. Enough weights stay in flight per SM to cover the memory
  // latency (docs/performance.md, 'W4A16 GEMM design notes').
#ifndef RLSERVE_W4A16_R8_CTAS
#define RLSERVE_W4A16_R8_CTAS 2
#endif
  static constexpr int stages = ROWS == 16 ? 6 : (ROWS == 8 && RLSERVE_W4A16_R8_CTAS == 3 ? 3 : (ROWS <= 32 ? 4 : 3));
  static constexpr int min_blocks = ROWS == 8 ? RLSERVE_W4A16_R8_CTAS : 1;
  static constexpr int b_words = k_kb * k_sub * k_serving_tile_words; // 4096 words = 16 KB
  static constexpr int a_halves = rows * k_stage_k;
  static constexpr int s_halves = k_max_stage_groups * k_tile_n;
  static constexpr int z_words = k_max_stage_groups * k_tile_n / 8;
  static constexpr int b_off = 0; // byte offsets inside one stage
  static constexpr int a_off = b_off + b_words * 4;
  static constexpr int s_off = a_off + a_halves * 2;
  static constexpr int z_off = s_off + s_halves * 2;
  static constexpr int stage_bytes = z_off + z_words * 4;
  static constexpr int red_stride = k_tile_n + 4; // floats per row: +4 spreads rows over banks
  static constexpr int red_off = stages * stage_bytes;
  static constexpr int red_bytes = rows * red_stride * 4;
  static constexpr int flag_off = red_off + red_bytes;
  static constexpr int smem_bytes = flag_off + 16;
  // <= 48 rows fit sm_80's 163 KB of opt-in shared memory; 64 rows (168.5 KB) needs sm_90's
  // 227 KB, and devices with less run m > 48 with 48-row blocks (block_rows_for below).
  static_assert(ROWS == 64 || smem_bytes <= 163 * 1024, "fits the opt-in shared memory of sm_80");
  static_assert(smem_bytes <= 227 * 1024, "fits the opt-in shared memory of sm_90");
  static_assert(stage_bytes % 16 == 0 && red_off % 16 == 0, "16-byte aligned smem regions");
};

// ---- PTX helpers ---------------------------------------------------------------------------------

// Four 8x8 b16 matrices from shared memory in mma fragment order: with lane l pointing at row
// (l % 16), k chunk (l / 16) of an m16 x k16 block, registers 0..3 are exactly the A fragment
// a0..a3 of mma.m16n8k16 (rows g / g+8, k 2q.. / 2q+8..).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Release/acquire fence at GPU scope, issued by one thread around the split-K counter (CUTLASS's
// barrier pattern: __syncthreads orders the CTA's partial stores before it, so one fence
// publishes them all; cheaper than a sequentially consistent membar in every thread).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }


// ---- the CTA's view of the problem, loads, inner loops, epilogue ------------------------------------

// Everything a CTA derives once from the problem.
struct shape_info {
  int32_t mblk_per_batch; // dense: m blocks per problem
  int32_t num_mblk;       // m blocks in the grid-wide problem
  int32_t n64;            // serving tiles along n
  int32_t n_tiles;        // CTA tiles along n
  int32_t ki;             // k stages per tile
  int32_t units;          // tiles * ki (can_implement keeps it below 2^31)
  int32_t grid;           // CTAs with work
  int32_t stage_groups;   // scale rows per stage: 128 / G when grouped and G < 128, else 1
  int32_t glen_log2;      // log2 of the group length when grouped (G = 32, 64, 128)
  int32_t k16;            // k / 16: serving-tile rows
  int64_t row_words;      // words per serving-tile row (n / 64 tiles of 128 words)
  bool k_tail;            // k % 128 != 0: the last stage of a tile is partial
  bool mul32;             // units * grid fits in 31 bits: stream-K arithmetic in 32 bits
};

// Position of a unit, advanced incrementally (no division in the loop).
struct cursor {
  int32_t kk; // k stage inside the tile
  int32_t mb; // m block
  int32_t nt; // n tile
  int32_t t;  // tile = nt * num_mblk + mb
};

__device__ __forceinline__ cursor cursor_at(int32_t u, const shape_info& s) {
  cursor c;
  c.t = u / s.ki;
  c.kk = u - c.t * s.ki;
  c.nt = c.t / s.num_mblk;
  c.mb = c.t - c.nt * s.num_mblk;
  return c;
}

__device__ __forceinline__ void advance(cursor& c, const shape_info& s) {
  if (++c.kk < s.ki)
    return;
  c.kk = 0;
  ++c.t;
  if (++c.mb == s.num_mblk) {
    c.mb = 0;
    ++c.nt;
  }
}

__device__ __forceinline__ int32_t run_start(int32_t c, const shape_info& s) {
  if (s.mul32)
    return c * s.units / s.grid;
  return static_cast<int32_t>(static_cast<int64_t>(c) * s.units / s.grid);
}
// The CTA whose run holds unit u: the largest c with c * U / G <= u.
__device__ __forceinline__ int32_t cta_of_unit(int32_t u, const shape_info& s) {
  if (s.mul32)
    return ((u + 1) * s.grid - 1) / s.units;
  return static_cast<int32_t>((static_cast<int64_t>(u + 1) * s.grid - 1) / s.units);
}

// 64-column serving tile of sub-tile i (0..3) of CTA tile nt, or -1 past the end. With the SiLU
// epilogue sub-tiles 0, 1 are gate tiles 2nt, 2nt+1 and 2, 3 the matching up tiles.
__device__ __forceinline__ int32_t sub_tile(const problem& p, const shape_info& s, int32_t nt, int i) {
  if (p.ep == epilogue::silu_mul_bf16) {
    const int32_t t = 2 * nt + (i & 1);
    return t < p.up_tile_offset ? t + (i >> 1) * p.up_tile_offset : -1;
  }
  const int32_t t = nt * k_sub + i;
  return t < s.n64 ? t : -1;
}

// Which problem (dense) or expert (moe) an m block reads its weights from.
__device__ __forceinline__ int32_t block_weights(const problem& p, const shape_info& s, int32_t mb) {
  return p.moe ? p.block_expert[mb] : mb / s.mblk_per_batch;
}

// Per-thread sources of the stage being loaded: set_tile points them at stage cu.kk of a tile, and
// every load_stage advances them by one stage (every thread copies the same chunk positions in
// every stage, so a stage costs one 64-bit add per source, not an address computation per copy).
//   B      4 chunks of sub-tile (tid / 32) % 4, word (tid % 32) * 4, k16 rows tid / 128 + 2 it
//   A      chunk tid % 16 of rows tid / 16 + 16 it (rows < ROWS)
//   scale  chunk tid % 8 of sub-tile (tid / 8) % 4, group row tid / 32       (tid < 32 * groups)
//   zp     chunk tid % 2 of sub-tile (tid / 2) % 4, group row tid / 8         (tid < 8 * groups)
// A source with nothing to copy (sub-tile past n, padding row) points at the operand's base and
// copies with src-size 0 (16 zero bytes, nothing read) and a step of 0. Bounds along k are only
// checked in the last stage of a tile when k is not a multiple of the 128-k stage (load_stage).
template <int ROWS>
struct load_ctx {
  const int32_t* b;
  const uint16_t* s;
  const int32_t* z;
  const uint16_t* a[cfg<ROWS>::a_iters];
  uint32_t ok; // bit 0 B, 1 scale, 2 zero point, 3 + it A source it: valid
};
constexpr uint32_t k_ok_b = 1, k_ok_s = 2, k_ok_z = 4, k_ok_a = 8;

template <int ROWS>
__device__ __forceinline__ void set_tile(const problem& p, const shape_info& s, const cursor& cu,
                                         load_ctx<ROWS>& ctx) {
  using C = cfg<ROWS>;
  const int tid = threadIdx.x;
  const int64_t e = block_weights(p, s, cu.mb);
  int32_t col = sub_tile(p, s, cu.nt, (tid >> 5) & 3);
  ctx.ok = col >= 0 ? k_ok_b : 0;
  ctx.b = col >= 0 ? p.b + e * p.b_batch_stride + col * k_serving_tile_words + (tid & 31) * 4 + (tid >> 7) * s.row_words
                   : p.b;
  if (col >= 0)
    ctx.b += cu.kk * k_kb * s.row_words; // a CTA's run can begin inside a tile
  const int32_t gk = p.groups > 1 ? cu.kk * s.stage_groups : 0; // scale row of stage cu.kk
  col = sub_tile(p, s, cu.nt, (tid >> 3) & 3);
  ctx.ok |= col >= 0 ? k_ok_s : 0;
  ctx.s = col >= 0 ? p.scale + e * p.scale_batch_stride + col * 64 + (tid & 7) * 8 + static_cast<int64_t>(gk + (tid >> 5)) * p.n
                   : p.scale;
  col = sub_tile(p, s, cu.nt, (tid >> 1) & 3);
  const bool z_ok = col >= 0 && p.has_zero_point;
  ctx.ok |= z_ok ? k_ok_z : 0;
  ctx.z = z_ok ? p.zero_point + e * p.zp_batch_stride + col * 8 + (tid & 1) * 4 +
                        static_cast<int64_t>(gk + (tid >> 3)) * (p.n / 8)
                   : p.zero_point;
#pragma unroll
  for (int it = 0; it < C::a_iters; ++it) {
    const int r = (tid >> 4) + 16 * it;
    const uint16_t* src = nullptr;
    if (r >= C::rows) {
      // 8-row blocks: threads 128.. copy no A rows
    } else if (p.moe) {
      const int32_t id = p.sorted_ids[cu.mb * C::rows + r];
      if (id < p.num_ids)
        src = p.a + static_cast<int64_t>(id / p.a_row_div) * p.lda;
    } else {
      const int32_t row = (cu.mb % s.mblk_per_batch) * C::rows + r;
      if (row < p.m)
        src = p.a + e * p.a_batch_stride + static_cast<int64_t>(row) * p.lda;
    }
    ctx.a[it] = src ? src + (tid & 15) * 8 + cu.kk * k_stage_k : p.a;
    ctx.ok |= src ? k_ok_a << it : 0;
  }
}

template <int ROWS>
__device__ __forceinline__ void load_stage(const problem& p, const shape_info& s, unsigned char* st,
                                           load_ctx<ROWS>& ctx, int32_t kk, int a_rows_loaded) {
  using C = cfg<ROWS>;
  const int tid = threadIdx.x;
  const int32_t ng = s.stage_groups;
  const int32_t b2 = static_cast<int32_t>(2 * s.row_words); // words between a thread's B copies
  static_assert(C::swap, "the Marlin variants use load_stage_marlin");
  if (!s.k_tail || kk + 1 < s.ki) {
    // Every k16 row, A column and group of the stage exists.
#pragma unroll
    for (int it = 0; it < k_b_per_thread; ++it)
      cp_async16(st + C::b_off + it * (k_threads * 16) + tid * 16, ctx.b + it * b2, (ctx.ok & k_ok_b));
#pragma unroll
    for (int it = 0; it < C::a_iters; ++it) {
      const int r = (tid >> 4) + 16 * it;
      if (r < a_rows_loaded) // a_rows_loaded <= rows
        cp_async16(st + C::a_off + (r * k_stage_k + (((tid & 15) ^ (r & 7)) * 8)) * 2, ctx.a[it],
                   ctx.ok & (k_ok_a << it));
    }
    if (tid < 32 * ng)
      cp_async16(st + C::s_off + tid * 16, ctx.s, (ctx.ok & k_ok_s));
    if (p.has_zero_point && tid < 8 * ng)
      cp_async16(st + C::z_off + tid * 16, ctx.z, (ctx.ok & k_ok_z));
  } else {
    // Last stage of a tile with k % 128 != 0: k16 rows past k / 16, A columns past k and groups
    // past k / G zero-fill (the B rows and A columns they would scale are zero too).
    // Per-channel: row 0 every stage; G = 128: row kk; G = 32 / 64: rows kk*ng .. +ng.
    const int32_t g0 = p.groups == 1 ? 0 : kk * ng;
#pragma unroll
    for (int it = 0; it < k_b_per_thread; ++it) {
      const bool ok = (ctx.ok & k_ok_b) && kk * k_kb + (tid >> 7) + 2 * it < s.k16;
      cp_async16(st + C::b_off + it * (k_threads * 16) + tid * 16, ok ? ctx.b + it * b2 : p.b, ok);
    }
    const bool k_ok = kk * k_stage_k + (tid & 15) * 8 < p.k;
#pragma unroll
    for (int it = 0; it < C::a_iters; ++it) {
      const int r = (tid >> 4) + 16 * it;
      if (r < a_rows_loaded) {
        const bool ok = (ctx.ok & (k_ok_a << it)) && k_ok;
        cp_async16(st + C::a_off + (r * k_stage_k + (((tid & 15) ^ (r & 7)) * 8)) * 2, ok ? ctx.a[it] : p.a, ok);
      }
    }
    if (tid < 32 * ng) {
      const bool ok = (ctx.ok & k_ok_s) && g0 + (tid >> 5) < p.groups;
      cp_async16(st + C::s_off + tid * 16, ok ? ctx.s : p.scale, ok);
    }
    if (p.has_zero_point && tid < 8 * ng) {
      const bool ok = (ctx.ok & k_ok_z) && g0 + (tid >> 3) < p.groups;
      cp_async16(st + C::z_off + tid * 16, ok ? ctx.z : p.zero_point, ok);
    }
  }
  // Next stage: k_kb serving-tile rows, ng scale / zero-point rows (none per-channel), 128 k of A.
  const int32_t gstep = p.groups > 1 ? ng : 0;
  ctx.b += (ctx.ok & k_ok_b) ? static_cast<int32_t>(k_kb * s.row_words) : 0;
  ctx.s += (ctx.ok & k_ok_s) ? gstep * p.n : 0;
  ctx.z += (ctx.ok & k_ok_z) ? gstep * (p.n / 8) : 0;
#pragma unroll
  for (int it = 0; it < C::a_iters; ++it)
    ctx.a[it] += (ctx.ok & (k_ok_a << it)) ? k_stage_k : 0;
}

// The Marlin variants (32..64 rows) keep their sources at stage 0 of the tile and add the stage's
// k offset per copy: advancing them (load_stage) costs registers that the 64-row variant does not
// have (it spilled).
template <int ROWS>
struct load_ctx_marlin {
  const int32_t* b;    // null: sub-tile past n
  const uint16_t* s;
  const int32_t* z;
  const uint16_t* a[cfg<ROWS>::a_iters]; // null: padding row (zero-filled)
};

template <int ROWS>
__device__ __forceinline__ void set_tile_marlin(const problem& p, const shape_info& s, const cursor& cu,
                                         load_ctx_marlin<ROWS>& ctx) {
  using C = cfg<ROWS>;
  const int tid = threadIdx.x;
  const int64_t e = block_weights(p, s, cu.mb);
  int32_t col = sub_tile(p, s, cu.nt, (tid >> 5) & 3);
  ctx.b = col >= 0 ? p.b + e * p.b_batch_stride + col * k_serving_tile_words + (tid & 31) * 4 : nullptr;
  col = sub_tile(p, s, cu.nt, (tid >> 3) & 3);
  ctx.s = col >= 0 ? p.scale + e * p.scale_batch_stride + col * 64 + (tid & 7) * 8 : nullptr;
  col = sub_tile(p, s, cu.nt, (tid >> 1) & 3);
  ctx.z = col >= 0 && p.has_zero_point ? p.zero_point + e * p.zp_batch_stride + col * 8 + (tid & 1) * 4 : nullptr;
#pragma unroll
  for (int it = 0; it < C::a_iters; ++it) {
    const int r = (tid >> 4) + 16 * it;
    const uint16_t* src = nullptr;
    if (r >= C::rows) {
      // 8-row blocks: threads 128.. copy no A rows
    } else if (p.moe) {
      const int32_t id = p.sorted_ids[cu.mb * C::rows + r];
      if (id < p.num_ids)
        src = p.a + static_cast<int64_t>(id / p.a_row_div) * p.lda;
    } else {
      const int32_t row = (cu.mb % s.mblk_per_batch) * C::rows + r;
      if (row < p.m)
        src = p.a + e * p.a_batch_stride + static_cast<int64_t>(row) * p.lda;
    }
    ctx.a[it] = src ? src + (tid & 15) * 8 : nullptr;
  }
}

template <int ROWS>
__device__ __forceinline__ void load_stage_marlin(const problem& p, const shape_info& s, unsigned char* st,
                                           const load_ctx_marlin<ROWS>& ctx, int32_t kk, int a_rows_loaded) {
  using C = cfg<ROWS>;
  const int tid = threadIdx.x;
  // B: serving-tile row kt = 8 kk + tid / 128 + 2 it; rows past k / 16 (last stage) zero-fill.
#pragma unroll
  for (int it = 0; it < k_b_per_thread; ++it) {
    const int32_t kt = kk * k_kb + (tid >> 7) + 2 * it;
    const bool ok = ctx.b != nullptr && kt < s.k16;
    cp_async16(st + C::b_off + it * (k_threads * 16) + tid * 16, ok ? ctx.b + kt * s.row_words : p.b, ok);
  }
  // A: chunk tid % 16 of its rows lands at chunk (tid % 16) ^ (row % 8).
  const int32_t k0 = kk * k_stage_k;
  const bool k_ok = k0 + (tid & 15) * 8 < p.k;
#pragma unroll
  for (int it = 0; it < C::a_iters; ++it) {
    const int r = (tid >> 4) + 16 * it;
    if (r < a_rows_loaded) { // a_rows_loaded <= rows
      const bool ok = ctx.a[it] != nullptr && k_ok;
      cp_async16(st + C::a_off + (r * k_stage_k + (((tid & 15) ^ (r & 7)) * 8)) * 2, ok ? ctx.a[it] + k0 : p.a, ok);
    }
  }
  // Scale rows and zero-point words of the groups the stage touches: per-channel row 0, G = 128
  // row kk, G = 32 / 64 rows kk*ng .. +ng (rows past k/G zero-fill, as do the B rows and A
  // columns they would scale).
  const int32_t ng = s.stage_groups;
  const int32_t g0 = p.groups == 1 ? 0 : (ng == 1 ? k0 >> s.glen_log2 : kk * ng);
  if (tid < 32 * ng) {
    const int32_t g = g0 + (tid >> 5);
    const bool ok = ctx.s != nullptr && g < p.groups;
    cp_async16(st + C::s_off + tid * 16, ok ? ctx.s + static_cast<int64_t>(g) * p.n : p.scale, ok);
  }
  if (p.has_zero_point && tid < 8 * ng) {
    const int32_t g = g0 + (tid >> 3);
    const bool ok = ctx.z != nullptr && g < p.groups;
    cp_async16(st + C::z_off + tid * 16, ok ? ctx.z + static_cast<int64_t>(g) * (p.n / 8) : p.zero_point, ok);
  }
}

// One stage of one warp: sub-tile wn, k16 rows 4 kw .. 4 kw + 3 (64 consecutive k: one group for
// G >= 64, two for G = 32).
template <int ROWS>
__device__ __forceinline__ void compute_stage_marlin(const problem& p, const shape_info& s, const unsigned char* st,
                                                     int lane, int wn, int kw, float (&acc)[cfg<ROWS>::mb][8][4]) {
  using C = cfg<ROWS>;
  constexpr int MB = C::mb;
  const uint32_t* bs = reinterpret_cast<const uint32_t*>(st + C::b_off);
  const uint16_t* as = reinterpret_cast<const uint16_t*>(st + C::a_off);
  const uint16_t* ss = reinterpret_cast<const uint16_t*>(st + C::s_off);
  const uint32_t* zs = reinterpret_cast<const uint32_t*>(st + C::z_off);
  uint32_t sc[8], nz[8];
#pragma unroll
  for (int jj = 0; jj < k_per_warp; ++jj) {
    const int kb = kw * k_per_warp + jj;
    if (jj == 0 || (jj == 2 && p.glen == 32)) {
      const int gl = s.stage_groups > 1 ? (kb * 16) >> s.glen_log2 : 0;
      load_group(p.groups > 1, p.has_zero_point, ss + gl * k_tile_n + wn * 64, zs + gl * (k_tile_n / 8) + wn * 8,
                 lane, sc, nz);
    }
    const uint4 bw = *reinterpret_cast<const uint4*>(bs + (kb * k_sub + wn) * k_serving_tile_words + lane * 4);
    uint32_t af[MB][4];
#pragma unroll
    for (int m = 0; m < MB; ++m)
      ldmatrix_x4(af[m], as + (m * 16 + (lane & 15)) * k_stage_k + (((2 * kb + (lane >> 4)) ^ (lane & 7)) * 8));
    const uint32_t words[4] = {bw.x, bw.y, bw.z, bw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t b[4];
      dequant_word(words[j], nz[2 * j], sc[2 * j], nz[2 * j + 1], sc[2 * j + 1], b);
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        mma_bf16(acc[m][2 * j], af[m], b[0], b[1]);
        mma_bf16(acc[m][2 * j + 1], af[m], b[2], b[3]);
      }
    }
  }
}

// ---- swap-AB path (8 / 16 rows) ---------------------------------------------------------------------
//
// With at most 16 tokens the Marlin orientation wastes most of each m16 tile and spends ~17
// instructions per 8 weights, mostly on dequantization (docs/performance.md). Here the weights
// are the mma A operand (16 output columns x 16 k: exactly one serving word per lane, its two
// middle bf16x2 registers exchanged) and the tokens the n8 B operand, so one mma covers 256
// weights instead of 128. The mma is fed the exact integers 128 + q straight from the lop3 (no
// subtract, no scale per weight): per group chunk an FP32 accumulator gathers
// G[c, t] = sum_k (128 + q[k, c]) a[t, k], and one extra mma with an all-ones A gathers
// S[t] = sum_k a[t, k]; then, once per chunk,
//   acc[c, t] += scale[c] * (G[c, t] - (128 + z[c]) * S[t])     (= sum_k (q - z) * scale * a)
// 4 LOP3 + 3 SHF + 1 HMMA per 8 weights, plus the fixup (2 FFMA per accumulator per chunk).
// Numerics: the weight (q - z) * scale is not rounded to bf16 first, so results differ from the
// bf16-dequantized reference by ~2^-9 relative per weight, averaging out over k (the tests' bound
// is 1e-2 relative; measured in docs/performance.md). The 128 offset costs ~5 bits of the FP32
// accumulator (|128 S| vs |sum (q - z) a|), far below the bf16 output rounding.

constexpr uint32_t k_f32_neg_128 = 0xc3000000u; // -128.0f: -(128 + z) = bits | z << 16, z < 16

// Scales (FP32) and -(128 + z) (FP32) of the lane's 8 columns for one group: index 2j + h is
// column 16j + (lane / 4) + 8h, the rows g / g+8 of the lane's accumulators of m16 block j.
__device__ __forceinline__ void load_group_f32(const problem& p, const uint16_t* srow, const uint32_t* zrow,
                                               int lane, float (&sc)[8], float (&nz)[8]) {
  const int c = lane >> 2;
  if (p.groups > 1) {
    // Grouped permutation: position 8c + t holds column c + 8t; word i holds t = 2i (low half)
    // and 2i + 1 (high half).
    const uint4 v = *reinterpret_cast<const uint4*>(srow + 8 * c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sc[2 * i] = __uint_as_float(w[i] << 16);
      sc[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int t = 0; t < 8; ++t)
      sc[t] = __uint_as_float(static_cast<uint32_t>(srow[serving_scale_position(8 * t + c, true)]) << 16);
  }
  if (p.has_zero_point) {
    // Interleaved like a weight word: slot i holds column c + 16i, slot i + 4 column c + 16i + 8.
    const uint32_t zw = zrow[c];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      nz[2 * i] = __uint_as_float(((zw << (16 - 4 * i)) & 0x000f0000u) | k_f32_neg_128);
      nz[2 * i + 1] = __uint_as_float(((zw >> (4 * i)) & 0x000f0000u) | k_f32_neg_128);
    }
  } else {
#pragma unroll
    for (int t = 0; t < 8; ++t)
      nz[t] = -136.0f; // symmetric: z = 8
  }
}

// One stage of one warp: sub-tile wn (64 columns = 4 m16 weight blocks), k16 rows 4 kw .. +3.
// acc[j][t][e]: column 64 wn + 16 j + g + 8 (e / 2), token 8 t + 2 q + (e % 2).
template <int ROWS>
__device__ __forceinline__ void compute_stage_swap(const problem& p, const shape_info& s, const unsigned char* st,
                                                   int lane, int wn, int kw, float (&acc)[4][cfg<ROWS>::nt][4]) {
  using C = cfg<ROWS>;
  constexpr int NT = C::nt;
  const uint32_t* bs = reinterpret_cast<const uint32_t*>(st + C::b_off);
  const uint16_t* as = reinterpret_cast<const uint16_t*>(st + C::a_off);
  const uint16_t* ss = reinterpret_cast<const uint16_t*>(st + C::s_off);
  const uint32_t* zs = reinterpret_cast<const uint32_t*>(st + C::z_off);
  const uint32_t ones[4] = {k_bf16x2_one, k_bf16x2_one, k_bf16x2_one, k_bf16x2_one};
  float gacc[4][NT][4];
  float asum[NT][4];
  uint32_t bf[NT][4];
  // G = 32: a chunk is 2 k16 rows (one group), else the warp's 4 rows lie in one group.
  const bool two_chunks = p.glen == 32;
#pragma unroll
  for (int jj = 0; jj < k_per_warp; ++jj) {
    const int kb = kw * k_per_warp + jj;
    const bool chunk_start = jj == 0 || (jj == 2 && two_chunks);
    if (chunk_start) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            gacc[j][t][e] = 0.0f;
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          asum[t][e] = 0.0f;
    }
    if ((jj & 1) == 0) {
      // Token fragments of k16 rows kb and kb + 1: matrix i = lane / 8 is k chunk 2 kb + i of
      // tokens 8t .. 8t+7 (row lane % 8), so registers 0, 1 are B of row kb and 2, 3 of kb + 1.
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int row = 8 * t + (lane & 7);
        ldmatrix_x4(bf[t], as + row * k_stage_k + (((2 * kb + (lane >> 3)) ^ (row & 7)) * 8));
      }
    }
    const int h = (jj & 1) * 2;
    const uint4 bw = *reinterpret_cast<const uint4*>(bs + (kb * k_sub + wn) * k_serving_tile_words + lane * 4);
#pragma unroll
    for (int t = 0; t < NT; ++t)
      mma_bf16(asum[t], ones, bf[t][h], bf[t][h + 1]);
    const uint32_t words[4] = {bw.x, bw.y, bw.z, bw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = words[j];
      // A fragment: a0 = (row g, k 2q..) slots 0,4; a1 = (row g+8, k 2q..) slots 2,6;
      // a2 = (row g, k 2q+8..) slots 1,5; a3 = (row g+8, k 2q+8..) slots 3,7.
      const uint32_t a[4] = {lop3_and_or(w, k_nibble_pair_mask, k_bf16x2_128),
                             lop3_and_or(w >> 8, k_nibble_pair_mask, k_bf16x2_128),
                             lop3_and_or(w >> 4, k_nibble_pair_mask, k_bf16x2_128),
                             lop3_and_or(w >> 12, k_nibble_pair_mask, k_bf16x2_128)};
#pragma unroll
      for (int t = 0; t < NT; ++t)
        mma_bf16(gacc[j][t], a, bf[t][h], bf[t][h + 1]);
    }
    const bool chunk_end = jj == k_per_warp - 1 || (jj == 1 && two_chunks);
    if (chunk_end) {
      const int gl = s.stage_groups > 1 ? (kb * 16) >> s.glen_log2 : 0;
      float sc[8], nz[8];
      load_group_f32(p, ss + gl * k_tile_n + wn * 64, zs + gl * (k_tile_n / 8) + wn * 8, lane, sc, nz);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int ci = 2 * j + (e >> 1);
            acc[j][t][e] = fmaf(sc[ci], fmaf(nz[ci], asum[t][e & 1], gacc[j][t][e]), acc[j][t][e]);
          }
    }
  }
}

// Output row of tile row r: dense the element offset of the row in C, moe the flat id (its row),
// or -1 if none.
__device__ __forceinline__ int64_t out_row(const problem& p, const shape_info& s, int32_t mb, int r, int rows) {
  if (p.moe) {
    const int32_t id = p.sorted_ids[mb * rows + r];
    return id < p.num_ids ? id : -1;
  }
  const int32_t row = (mb % s.mblk_per_batch) * rows + r;
  return row < p.m ? static_cast<int64_t>(mb / s.mblk_per_batch) * p.c_batch_stride + static_cast<int64_t>(row) * p.ldc : -1;
}

// Writes the finished FP32 tile (shared memory, `nrows` valid rows) through the epilogue.
template <int ROWS>
__device__ void epilogue_store(const problem& p, const shape_info& s, const float* red, int32_t nt, int32_t mb,
                               int nrows) {
  using C = cfg<ROWS>;
  const int tid = threadIdx.x;
  if (p.ep == epilogue::store_bf16) {
    for (int idx = tid; idx < nrows * (k_tile_n / 8); idx += k_threads) {
      const int r = idx / (k_tile_n / 8), cc = idx % (k_tile_n / 8);
      const int32_t col = sub_tile(p, s, nt, cc / 8);
      const int64_t base = out_row(p, s, mb, r, C::rows);
      if (col < 0 || base < 0)
        continue;
      const int64_t row_off = p.moe ? base * p.ldc : base;
      const float4 v0 = *reinterpret_cast<const float4*>(red + r * C::red_stride + cc * 8);
      const float4 v1 = *reinterpret_cast<const float4*>(red + r * C::red_stride + cc * 8 + 4);
      uint4 o;
      o.x = pack_bf16x2(v0.x, v0.y), o.y = pack_bf16x2(v0.z, v0.w);
      o.z = pack_bf16x2(v1.x, v1.y), o.w = pack_bf16x2(v1.z, v1.w);
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.c) + row_off + col * 64 + (cc % 8) * 8) = o;
    }
  } else if (p.ep == epilogue::silu_mul_bf16) {
    // Columns [0, 128) hold gate tiles 2nt, 2nt+1; [128, 256) the up columns of the same outputs.
    constexpr int half = k_tile_n / 2;
    for (int idx = tid; idx < nrows * (half / 8); idx += k_threads) {
      const int r = idx / (half / 8), cc = idx % (half / 8);
      const int32_t col = sub_tile(p, s, nt, cc / 8);
      const int64_t base = out_row(p, s, mb, r, C::rows);
      if (col < 0 || base < 0)
        continue;
      const int64_t row_off = p.moe ? base * p.ldc : base;
      float h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float g = bf16_round(red[r * C::red_stride + cc * 8 + e]);
        const float up = bf16_round(red[r * C::red_stride + half + cc * 8 + e]);
        h[e] = g / (1.0f + expf(-g)) * up;
      }
      uint4 o;
      o.x = pack_bf16x2(h[0], h[1]), o.y = pack_bf16x2(h[2], h[3]);
      o.z = pack_bf16x2(h[4], h[5]), o.w = pack_bf16x2(h[6], h[7]);
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.c) + row_off + col * 64 + (cc % 8) * 8) = o;
    }
  } else {
    for (int idx = tid; idx < nrows * (k_tile_n / 4); idx += k_threads) {
      const int r = idx / (k_tile_n / 4), c4 = idx % (k_tile_n / 4);
      const int32_t col = sub_tile(p, s, nt, c4 / 16);
      const int64_t base = out_row(p, s, mb, r, C::rows);
      if (col < 0 || base < 0)
        continue;
      const int64_t row_off = p.moe ? base * p.ldc : base;
      const float4 v = *reinterpret_cast<const float4*>(red + r * C::red_stride + c4 * 4);
      *reinterpret_cast<float4*>(static_cast<float*>(p.c) + row_off + col * 64 + (c4 % 16) * 4) = v;
    }
  }
}

// Weights of a run's first prefetch_units units into L2 (problem::prefetch_units): 128 lines of
// 128 bytes per unit (8 k16 rows x 4 sub-tiles x 512 bytes), threads 0..127 even and 128..255
// odd units of the run.
__device__ __forceinline__ void prefetch_run(const problem& p, const shape_info& s, int32_t u0, int32_t u1) {
  const int tid = threadIdx.x, l = tid & 127;
  const int32_t u_end = min(u1, u0 + p.prefetch_units);
#pragma unroll 1
  for (int32_t u = u0 + (tid >> 7); u < u_end; u += 2) {
    const cursor c = cursor_at(u, s);
    const int32_t kt = c.kk * k_kb + (l >> 4);
    const int32_t col = sub_tile(p, s, c.nt, (l >> 2) & 3);
    if (col >= 0 && kt < s.k16) {
      const int32_t* b = p.b + block_weights(p, s, c.mb) * p.b_batch_stride + kt * s.row_words +
                         col * k_serving_tile_words + (l & 3) * 32;
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(b));
    }
  }
}

} // namespace

} // namespace rlserve::kernels::w4a16
