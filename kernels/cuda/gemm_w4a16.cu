// CUDA W4A16 GEMM core (dense GEMM here, fused MoE in fused_moe.cu through gemm_w4a16_problem.cuh).
//
// Two orientations share everything but the inner loop (template parameter ROWS = rows per m
// block): ROWS = 8 / 16 run the swap-AB path (compute_stage_swap, described there: weights on the
// mma M dimension, tokens as 1 or 2 n8 tiles, scale and zero point applied once per group chunk);
// ROWS = 32 / 48 / 64 the Marlin orientation described next (MB = ROWS / 16 m16 blocks).
//
// Shape of the computation. Tokens are on the mma M dimension (16-row m blocks, 1..4 per CTA:
// MB), weights on N. A CTA of 8 warps owns an output tile of 16*MB rows x 256
// columns (four 64-column serving tiles, "sub-tiles") and walks its k range in stages of 128 k.
// One stage in shared memory holds
//   B  8 k16-rows x 4 sub-tiles of serving tiles (32 x 512 B = 16 KB, tile-contiguous in global
//      memory, so every lane copies whole 16-byte words),
//   A  16*MB rows x 128 k of bf16 activations, 16-byte chunks XOR-swizzled by row (ldmatrix and
//      cp.async both bank-conflict-free),
//   the scale rows (and zero-point words) of the groups the stage touches, for the 256 columns.
// Warp w takes sub-tile w % 4 and the 4 consecutive k16 rows 4 (w / 4) .. +3 of every stage (64 k:
// one scale group for G >= 64). Its 16-byte shared-memory read of one serving tile is exactly its
// B fragments for 8 mma (4 n16 blocks x 2 n8 halves, docs/formats.md §4), dequantized in registers:
//   lop3((w >> 4i) & 0x000f000f | 0x43004300)  -> bf16x2 (128 + q, 128 + q')   (exact)
//   fma(x, 1, -(128 + z))                      -> q - z                       (exact)
//   fma(x, scale, -0)                          -> bf16_rn((q - z) * scale)    (the one rounding)
// which is bit-identical to serving_dequant_ref (docs/formats.md §1), so the only difference
// from the CPU reference is the FP32 summation order. 17 instructions per 8 weights (4 LOP3,
// 3 SHF, 4 HADD2, 4 HMUL2, 2 HMMA at M <= 16): the same budget as vLLM's BF16 Marlin path.
//
// Partitioning: "units" are (tile, k stage) pairs, numbered tile-major with tile = n-tile *
// m_blocks + m_block (the m blocks sharing weights are neighbours). The persistent grid (SMs x
// CTAs/SM) gives CTA c the contiguous run [c*U/G, (c+1)*U/G): equal work for every SM at any m
// (Marlin's striped partition). A run covers the tail of one tile, whole tiles, and the head of
// another. Whole tiles are written directly; a tile whose k range is split writes an FP32
// partial per CTA, and the last CTA to arrive (atomic counter per tile, CUTLASS-style release /
// acquire by one thread) adds the partials in CTA order and writes the output. No CTA waits for
// another; the order is fixed, so the result is deterministic; the counter is reset by the last
// CTA, so the workspace is reusable.
//
// Pipeline: cp.async.cg 16-byte copies (L2 only; no L2 cache-policy hint: ptxas 13.0-13.3 can drop
// the createpolicy and trap, docs/performance.md, 'W4A16 GEMM design notes'), `stages` buffers,
// stages-1 units in flight, one __syncthreads per 16 KB stage. Each thread copies the same chunk
// positions in every stage, so its source pointers are set once per tile (set_tile): the swap-AB
// variants advance them by one stage per load (load_stage), the Marlin variants add the stage's k
// offset per copy (load_stage_marlin). The prefetch runs across tile boundaries, so a CTA's stream
// of weights does not stall at its split points.
//
// Programmatic dependent launch (the fused MoE): the kernel waits (griddepcontrol.wait) before it
// reads anything the previous kernel writes, optionally after prefetching its first weights into
// L2 (problem::prefetch_units), and lets the next kernel launch right after.
//
// Measured on one H200 (docs/performance.md, 2026-12-02, two runs): 4096 x 14336 asym g128 at
// m = 1 in 21.95 us with the 8-row swap-AB kernel (1.39 TB/s, 1.5-1.6x cuBLAS BF16; the
// Marlin-orientation 16-row kernel took 24.7 us). Nsight Compute: latency and issue bound, not
// memory (DRAM 33%, IPC ~2 while an SM holds a CTA, but SMs hold none for ~24% of the kernel's
// cycles: CTAs of the static stream-K split finish at different times). What would move it next
// is in docs/performance.md.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm_w4a16_problem.cuh"
#include "kernels/gemm_w4a16.hpp"
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
  // 16 KB of weights per stage. 8 rows run 2 CTAs/SM (128 registers) with 4 stages: 2 x 3 x 16 KB =
  // 96 KB of weights in flight per SM (Little's law at ~4 TB/s and ~1 us of loaded latency asks for
  // >= 32 KB; docs/performance.md, 'W4A16 GEMM design notes'). 16 rows spill under the 128-register
  // cap of 2 CTAs/SM, so they run 1 CTA/SM with 6 stages (80 KB in flight). The Marlin variants
  // need 150-250 registers: 1 CTA/SM with the deepest pipeline that fits, 3 / 2 / 2 stages in
  // flight.
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

// 16-byte global->shared copy that bypasses L1 (.cg: weights and activations are read once per
// stage); src_size 0 writes 16 zero bytes without reading, which pads missing rows and k.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size));
}
// Closes the group of copies issued for one stage.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N stage groups are still in flight (the oldest stage has landed).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

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

__device__ __forceinline__ float bf16_round(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

// ---- the kernel ------------------------------------------------------------------------------------

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

template <int ROWS>
__global__ void __launch_bounds__(k_threads, cfg<ROWS>::min_blocks)
w4a16_kernel(const problem p,
             int* __restrict__ counters,   // [tiles] zero between launches
             float* __restrict__ partials) // [grid, 2, ROWS, 256] FP32 split-K partial tiles
{
  using C = cfg<ROWS>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* red = reinterpret_cast<float*>(smem + C::red_off);
  int* flag = reinterpret_cast<int*>(smem + C::flag_off);

  // Programmatic dependent launch: without a prefetch everything below may read what the previous
  // kernel writes (num_padded, A), so wait first; with one, the m blocks and experts were written
  // before the previous kernel started (see problem::prefetch_units).
  if (p.prefetch_units == 0)
    grid_dep_wait();
  shape_info s;
  s.mblk_per_batch = p.moe ? 1 : (p.m + C::rows - 1) / C::rows;
  s.num_mblk = p.moe ? min(*p.num_padded / C::rows, p.max_m_blocks) : p.batch * s.mblk_per_batch;
  s.n64 = p.n / 64;
  s.n_tiles = p.ep == epilogue::silu_mul_bf16 ? (p.up_tile_offset + 1) / 2 : (s.n64 + k_sub - 1) / k_sub;
  s.ki = (p.k + k_stage_k - 1) / k_stage_k;
  s.units = s.n_tiles * s.num_mblk * s.ki;
  s.grid = min(static_cast<int32_t>(gridDim.x), s.units);
  s.glen_log2 = 31 - __clz(max(p.glen, 1));
  s.stage_groups = (p.groups > 1 && p.glen < k_stage_k) ? k_stage_k / p.glen : 1;
  s.k16 = p.k / 16;
  s.row_words = static_cast<int64_t>(s.n64) * k_serving_tile_words;
  s.k_tail = p.k % k_stage_k != 0;
  s.mul32 = static_cast<int64_t>(s.units) * s.grid < (int64_t{1} << 31);
  const int32_t cta = blockIdx.x;
  if (cta >= s.grid)
    return;
  const int32_t u0 = run_start(cta, s), u1 = run_start(cta + 1, s);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (RLSERVE_W4A16_PDL && p.prefetch_units > 0) {
    prefetch_run(p, s, u0, u1);
    grid_dep_wait();
  }
  grid_dep_launch();
  const int wn = warp % k_sub, kw = warp / k_sub;

  // Rows never valid in any tile (dense with one m block: rows >= m) stay zero from here on and
  // are never copied; everything else is copied or zero-filled per stage.
  const int a_rows_loaded = (!p.moe && s.mblk_per_batch == 1) ? p.m : C::rows;
  if (a_rows_loaded < C::rows) {
    for (int st = 0; st < C::stages; ++st)
      for (int idx = tid; idx < C::a_halves / 8; idx += k_threads)
        reinterpret_cast<uint4*>(smem + st * C::stage_bytes + C::a_off)[idx] = make_uint4(0, 0, 0, 0);
    __syncthreads();
  }

  cursor load_at = cursor_at(u0, s), comp_at = load_at;
  using ctx_t = std::conditional_t<C::swap, load_ctx<ROWS>, load_ctx_marlin<ROWS>>;
  ctx_t ctx;
  auto set_tile_ = [&](const cursor& cu) {
    if constexpr (C::swap)
      set_tile<ROWS>(p, s, cu, ctx);
    else
      set_tile_marlin<ROWS>(p, s, cu, ctx);
  };
  auto load_stage_ = [&](unsigned char* st, int32_t kk) {
    if constexpr (C::swap)
      load_stage<ROWS>(p, s, st, ctx, kk, a_rows_loaded);
    else
      load_stage_marlin<ROWS>(p, s, st, ctx, kk, a_rows_loaded);
  };
  set_tile_(load_at);
#pragma unroll 1
  for (int st = 0; st < C::stages - 1; ++st) {
    if (u0 + st < u1) {
      if (load_at.kk == 0 && st > 0)
        set_tile_(load_at);
      load_stage_(smem + st * C::stage_bytes, load_at.kk);
      advance(load_at, s);
    }
    cp_async_commit();
  }

  float acc[C::acc0][C::acc1][4];
#pragma unroll
  for (int m = 0; m < C::acc0; ++m)
#pragma unroll
    for (int t = 0; t < C::acc1; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[m][t][e] = 0.0f;

  int read_stage = 0, write_stage = C::stages - 1;
  int32_t seg_start = u0;
  for (int32_t u = u0; u < u1; ++u) {
    cp_async_wait<C::stages - 2>();
    __syncthreads();
    if (u + C::stages - 1 < u1) {
      if (load_at.kk == 0)
        set_tile_(load_at);
      load_stage_(smem + write_stage * C::stage_bytes, load_at.kk);
      advance(load_at, s);
    }
    cp_async_commit();
    write_stage = write_stage + 1 == C::stages ? 0 : write_stage + 1;

    if constexpr (C::swap)
      compute_stage_swap<ROWS>(p, s, smem + read_stage * C::stage_bytes, lane, wn, kw, acc);
    else
      compute_stage_marlin<ROWS>(p, s, smem + read_stage * C::stage_bytes, lane, wn, kw, acc);
    read_stage = read_stage + 1 == C::stages ? 0 : read_stage + 1;

    const cursor here = comp_at;
    advance(comp_at, s);
    if (u + 1 != u1 && here.kk + 1 != s.ki)
      continue;

    // ---- end of this CTA's segment of tile t ----
    const int32_t t = here.t;
    const int32_t nt = here.nt, mb = here.mb;

    // 1. The two warps of each sub-tile add their partial sums into `red` (kw 0 then kw 1).
    const int g = lane >> 2, q = lane & 3;
#pragma unroll 1
    for (int r = 0; r < k_kw; ++r) {
      if (kw == r) {
       if constexpr (C::swap) {
        // acc[j][t][e]: column wn*64 + 16j + g + 8(e/2), token 8t + 2q + (e%2).
#pragma unroll
        for (int j = 0; j < C::acc0; ++j)
#pragma unroll
          for (int tt = 0; tt < C::acc1; ++tt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float* d = red + (8 * tt + 2 * q + (e & 1)) * C::red_stride + wn * 64 + 16 * j + g + 8 * (e >> 1);
              *d = r == 0 ? acc[j][tt][e] : *d + acc[j][tt][e];
            }
       } else {
#pragma unroll
        for (int m = 0; m < C::acc0; ++m)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            float2* lo = reinterpret_cast<float2*>(red + (m * 16 + g) * C::red_stride + wn * 64 + j * 8 + 2 * q);
            float2* hi = lo + 4 * C::red_stride; // 8 rows further
            if (r == 0) {
              *lo = make_float2(acc[m][j][0], acc[m][j][1]);
              *hi = make_float2(acc[m][j][2], acc[m][j][3]);
            } else {
              const float2 a = *lo, b = *hi;
              *lo = make_float2(a.x + acc[m][j][0], a.y + acc[m][j][1]);
              *hi = make_float2(b.x + acc[m][j][2], b.y + acc[m][j][3]);
            }
          }
       }
      }
      __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < C::acc0; ++m)
#pragma unroll
      for (int j = 0; j < C::acc1; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[m][j][e] = 0.0f;

    // Rows with an output: dense a prefix of the block; moe ids are a prefix too (padding is
    // at the end of each expert's run).
    int nrows;
    if (p.moe)
      nrows = __syncthreads_count(tid < C::rows && p.sorted_ids[mb * C::rows + tid] < p.num_ids);
    else
      nrows = min(C::rows, p.m - (mb % s.mblk_per_batch) * C::rows);

    // 2. Split tile: publish the partial; the last CTA to arrive adds all of them in CTA order.
    const int32_t tile_u0 = t * s.ki;
    const bool whole = seg_start == tile_u0 && u + 1 == tile_u0 + s.ki;
    const int32_t this_start = seg_start;
    seg_start = u + 1;
    if (!whole) {
      const int slot = this_start == u0 ? 0 : 1;
      float* mine = partials + static_cast<int64_t>(cta * 2 + slot) * (C::rows * k_tile_n);
      for (int idx = tid; idx < nrows * (k_tile_n / 4); idx += k_threads) {
        const int r = idx / (k_tile_n / 4), c4 = idx % (k_tile_n / 4);
        __stcg(reinterpret_cast<float4*>(mine + r * k_tile_n + c4 * 4),
               *reinterpret_cast<const float4*>(red + r * C::red_stride + c4 * 4));
      }
      __syncthreads(); // all partial stores of the CTA precede thread 0's release below
      const int32_t c_first = cta_of_unit(tile_u0, s), c_last = cta_of_unit(tile_u0 + s.ki - 1, s);
      if (tid == 0) {
        fence_acq_rel_gpu(); // release this CTA's partial
        const int arrived = atomicAdd(counters + t, 1);
        const int last = arrived == c_last - c_first;
        if (last) {
          counters[t] = 0;     // every contributor has arrived: ready for the next launch
          fence_acq_rel_gpu(); // acquire the others' partials for the whole CTA (bar.sync below)
        }
        *flag = last;
      }
      __syncthreads();
      if (!*flag)
        continue;
      // Sum the partials in CTA order; loads go out k_batch at a time (one L2 round trip per
      // batch instead of one per contributor), the adds stay in order. (4 at a time pushed the
      // 1-block variant over its 128-register cap and spilled in the main loop.)
      constexpr int k_batch = C::swap ? 2 : 4;
      for (int idx = tid; idx < nrows * (k_tile_n / 4); idx += k_threads) {
        const int r = idx / (k_tile_n / 4), c4 = idx % (k_tile_n / 4);
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int32_t c0 = c_first; c0 <= c_last; c0 += k_batch) {
          float4 v[k_batch];
#pragma unroll
          for (int j = 0; j < k_batch; ++j) {
            const int32_t cc = c0 + j;
            if (cc <= c_last) {
              const int sl = run_start(cc, s) >= tile_u0 ? 0 : 1; // run began inside this tile: head slot
              v[j] = __ldcg(reinterpret_cast<const float4*>(
                partials + static_cast<int64_t>(cc * 2 + sl) * (C::rows * k_tile_n) + r * k_tile_n + c4 * 4));
            }
          }
#pragma unroll
          for (int j = 0; j < k_batch; ++j)
            if (c0 + j <= c_last)
              sum.x += v[j].x, sum.y += v[j].y, sum.z += v[j].z, sum.w += v[j].w;
        }
        *reinterpret_cast<float4*>(red + r * C::red_stride + c4 * 4) = sum;
      }
      __syncthreads();
    }

    // 3. Epilogue.
    epilogue_store<ROWS>(p, s, red, nt, mb, nrows);
    __syncthreads();
  }
  cp_async_wait<0>();
}

// ---- host side -------------------------------------------------------------------------------------

constexpr int k_max_devices = 64;

struct variant_cache {
  bool ready = false;
  int grid = 0; // SMs x CTAs per SM
};

std::mutex g_cache_mutex;
constexpr int k_variants = 5; // 8, 16, 32, 48, 64 rows
variant_cache g_cache[k_max_devices][k_variants];

int variant_index(int block_rows) {
  switch (block_rows) {
    case 8: return 0;
    case 16: return 1;
    case 32: return 2;
    case 48: return 3;
    case 64: return 4;
    default: return -1;
  }
}

template <int ROWS>
kernel_status prepare_variant(int device, int* grid) {
  using C = cfg<ROWS>;
  RLSERVE_CUDA_TRY(cudaFuncSetAttribute(w4a16_kernel<ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::smem_bytes));
  int per_sm = 0, sms = 0;
  RLSERVE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, w4a16_kernel<ROWS>, k_threads, C::smem_bytes));
  RLSERVE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (per_sm < 1)
    return kernel_status::not_supported;
  *grid = per_sm * sms;
  return kernel_status::ok;
}

kernel_status variant_grid(int block_rows, int* grid) {
  int device = 0;
  RLSERVE_CUDA_TRY(cudaGetDevice(&device));
  const int v = variant_index(block_rows);
  if (device < 0 || device >= k_max_devices || v < 0)
    return kernel_status::not_supported;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  variant_cache& vc = g_cache[device][v];
  if (!vc.ready) {
    kernel_status st = kernel_status::ok;
    switch (block_rows) {
      case 8: st = prepare_variant<8>(device, &vc.grid); break;
      case 16: st = prepare_variant<16>(device, &vc.grid); break;
      case 32: st = prepare_variant<32>(device, &vc.grid); break;
      case 48: st = prepare_variant<48>(device, &vc.grid); break;
      default: st = prepare_variant<64>(device, &vc.grid); break;
    }
    if (st != kernel_status::ok)
      return st;
    vc.ready = true;
  }
  *grid = vc.grid;
  return kernel_status::ok;
}

} // namespace

bool block_rows_valid(int block_rows) { return variant_index(block_rows) >= 0; }

int block_rows_for(int64_t rows) {
  if (rows <= 8)
    return 8;
  if (rows <= 16)
    return 16;
  if (rows <= 32)
    return 32;
  if (rows <= 48)
    return 48;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 48;
  return optin >= cfg<64>::smem_bytes ? 64 : 48;
}

int grid_for(int block_rows, int max_ctas) {
  int grid = 0;
  if (variant_grid(block_rows, &grid) != kernel_status::ok)
    return 0;
  return max_ctas > 0 ? std::min(grid, max_ctas) : grid;
}

std::size_t counter_bytes(int64_t max_tiles) {
  return static_cast<std::size_t>((max_tiles * 4 + 255) / 256 * 256);
}

// Sized for the full grid of every variant, whatever max_ctas caps a launch to, so the counters
// behind this region sit at the same offset for every launch on this device.
std::size_t partial_bytes() {
  std::size_t bytes = 0;
  for (int rows : {8, 16, 32, 48, 64})
    bytes = std::max(bytes, static_cast<std::size_t>(grid_for(rows, 0)) * 2 * rows * k_tile_n * sizeof(float));
  return (bytes + 255) / 256 * 256;
}

int64_t n_tiles_of(const problem& p) {
  return p.ep == epilogue::silu_mul_bf16 ? (p.up_tile_offset + 1) / 2 : (p.n / 64 + k_sub - 1) / k_sub;
}

int64_t tiles_of(const problem& p, int block_rows) {
  const int64_t rows = block_rows;
  const int64_t mblk = p.moe ? p.max_m_blocks : p.batch * ((p.m + rows - 1) / rows);
  return n_tiles_of(p) * mblk;
}

template <int ROWS>
cudaError_t launch_variant(const problem& p, int grid, int* counters, float* partials, cudaStream_t stream, bool pdl) {
  cudaLaunchConfig_t cfg_{};
  cfg_.gridDim = dim3(static_cast<unsigned>(grid));
  cfg_.blockDim = dim3(k_threads);
  cfg_.dynamicSmemBytes = cfg<ROWS>::smem_bytes;
  cfg_.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg_.attrs = attr;
  cfg_.numAttrs = pdl && RLSERVE_W4A16_PDL ? 1 : 0;
  return cudaLaunchKernelEx(&cfg_, w4a16_kernel<ROWS>, p, counters, partials);
}

kernel_status run(const problem& p, int block_rows, int grid, int* counters, float* partials, cudaStream_t stream,
                  bool pdl) {
  if (grid < 1)
    return kernel_status::invalid_problem;
  if (counters == nullptr || partials == nullptr)
    return kernel_status::workspace_null;
  cudaError_t e = cudaSuccess;
  switch (block_rows) {
    case 8: e = launch_variant<8>(p, grid, counters, partials, stream, pdl); break;
    case 16: e = launch_variant<16>(p, grid, counters, partials, stream, pdl); break;
    case 32: e = launch_variant<32>(p, grid, counters, partials, stream, pdl); break;
    case 48: e = launch_variant<48>(p, grid, counters, partials, stream, pdl); break;
    case 64: e = launch_variant<64>(p, grid, counters, partials, stream, pdl); break;
    default: return kernel_status::invalid_problem;
  }
  RLSERVE_CUDA_TRY(e);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

} // namespace rlserve::kernels::w4a16

// ---- public dense API ---------------------------------------------------------------------------------

namespace rlserve::kernels {

namespace {

w4a16::problem dense_problem(const gemm_w4a16_args& a) {
  w4a16::problem p;
  const int64_t lda = a.lda ? a.lda : a.k, ldc = a.ldc ? a.ldc : a.n;
  const int64_t groups = a.group_size == k_int4_channel ? 1 : a.k / a.group_size;
  p.moe = false;
  p.m = static_cast<int32_t>(a.m);
  p.batch = static_cast<int32_t>(a.batch);
  p.a = a.a;
  p.lda = lda;
  p.a_batch_stride = a.m * lda;
  p.b = a.b;
  p.b_batch_stride = a.k * a.n / 8;
  p.scale = a.scale;
  p.scale_batch_stride = groups * a.n;
  p.zero_point = a.has_zero_point ? a.zero_point : nullptr;
  p.zp_batch_stride = groups * (a.n / 8);
  p.n = static_cast<int32_t>(a.n);
  p.k = static_cast<int32_t>(a.k);
  p.glen = static_cast<int32_t>(a.k / groups);
  p.groups = static_cast<int32_t>(groups);
  p.has_zero_point = a.has_zero_point;
  p.ep = w4a16::epilogue::store_bf16;
  p.c = a.c;
  p.ldc = ldc;
  p.c_batch_stride = a.m * ldc;
  return p;
}

int dense_block_rows(const gemm_w4a16_args& a) {
  return w4a16::block_rows_valid(a.block_rows) ? a.block_rows : w4a16::block_rows_for(a.m);
}

} // namespace

// Workspace: [FP32 partials for any variant][one counter per 8-row tile of args.m]; the layout
// does not depend on m, so one workspace serves every m up to the one it was sized for.
std::size_t gemm_w4a16_workspace_bytes(const gemm_w4a16_args& a) {
  if (gemm_w4a16_can_implement(a) != kernel_status::ok || a.m == 0)
    return 0;
  return w4a16::partial_bytes() + w4a16::counter_bytes(w4a16::tiles_of(dense_problem(a), 8));
}

kernel_status gemm_w4a16_workspace_init(const gemm_w4a16_args& a, void* workspace, cudaStream_t stream) {
  if (auto st = gemm_w4a16_can_implement(a); st != kernel_status::ok)
    return st;
  if (a.m == 0)
    return kernel_status::ok;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  const std::size_t off = w4a16::partial_bytes();
  RLSERVE_CUDA_TRY(cudaMemsetAsync(static_cast<unsigned char*>(workspace) + off, 0,
                                   w4a16::counter_bytes(w4a16::tiles_of(dense_problem(a), 8)), stream));
  return kernel_status::ok;
}

kernel_status gemm_w4a16_launch(const gemm_w4a16_args& a, void* workspace, cudaStream_t stream) {
  if (auto st = gemm_w4a16_can_implement(a); st != kernel_status::ok)
    return st;
  if (a.m == 0)
    return kernel_status::ok;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  const w4a16::problem p = dense_problem(a);
  const int mb = dense_block_rows(a);
  const int grid = w4a16::grid_for(mb, a.max_ctas);
  if (grid < 1)
    return kernel_status::cuda_error;
  const int64_t units = w4a16::tiles_of(p, mb) * ((a.k + w4a16::k_stage_k - 1) / w4a16::k_stage_k);
  auto* partials = static_cast<float*>(workspace);
  auto* counters = reinterpret_cast<int*>(static_cast<unsigned char*>(workspace) + w4a16::partial_bytes());
  return w4a16::run(p, mb, static_cast<int>(std::min<int64_t>(grid, units)), counters, partials, stream);
}

} // namespace rlserve::kernels
