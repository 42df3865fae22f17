// Internal to kernels/cuda: the one W4A16 GEMM core (kernels/cuda/gemm_w4a16.cu) described as a
// "problem" that both the dense GEMM (gemm_w4a16_launch) and the fused MoE (kernels/cuda/
// fused_moe.cu) fill in. The kernel instantiations live in gemm_w4a16.cu only, so the MoE
// translation unit does not compile them a second time.
//
// Rows are cut into "m blocks" of block_rows rows (8, 16: swap-AB path; 32, 48, 64: Marlin path):
//   dense: batch x ceil(m / rows) blocks; block b*per_batch + i holds rows [i*rows, ...) of
//          problem b (A, B, scales, zero points and C all move by their batch strides);
//   moe:   *num_padded / rows blocks of the expert-sorted token list; block i holds the ids
//          sorted_ids[i*rows .. +rows) of expert block_expert[i]; ids >= num_ids are padding
//          (zero A rows, nothing written). A row = id / a_row_div, C row = id.
// Columns are cut into tiles of 256 = four 64-column serving tiles ("sub-tiles"). Normally tile t
// holds serving tiles 4t .. 4t+3; with the SiLU epilogue it holds gate tiles 2t, 2t+1 and the up
// tiles 2t + up_tile_offset, 2t+1 + up_tile_offset, so gate and up columns of the same outputs
// meet in one CTA (tiles past n, or past I for SiLU, are skipped).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/int4_format.hpp"
#include "kernels/kernel_status.hpp"
#if defined(__CUDACC__)
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/cuda/ptx_helpers.cuh" // mma_bf16
#endif

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels::w4a16 {

enum class epilogue : int32_t {
  store_bf16 = 0,    // C[row, col] = bf16(acc)
  silu_mul_bf16 = 1, // C[row, gate col] = bf16(silu(bf16(gate)) * bf16(up)), C is [rows, n/2]
  store_f32 = 2,     // C[row, col] = acc (float)
};

struct problem {
  // ---- rows ----
  bool moe = false;
  int32_t m = 0;                          // dense: rows of each problem
  int32_t batch = 1;                      // dense: problems
  const int32_t* sorted_ids = nullptr;    // moe: [max_m_blocks * rows] flat ids token*top_k+slot
  const int32_t* block_expert = nullptr;  // moe: [max_m_blocks] expert of each m block
  const int32_t* num_padded = nullptr;    // moe: [1] entries of sorted_ids in use (multiple of rows)
  int32_t max_m_blocks = 0;               // moe: capacity the workspace was sized for
  int32_t num_ids = 0;                    // moe: tokens * top_k; larger ids are padding
  int32_t a_row_div = 1;                  // moe: A row of id = id / a_row_div (top_k for w13)

  // ---- operands ----
  const uint16_t* a = nullptr; // bf16 rows of lda elements
  int64_t lda = 0;
  int64_t a_batch_stride = 0;  // dense: elements between problems
  const int32_t* b = nullptr;  // serving weight [k/16, 2n] per problem / expert
  int64_t b_batch_stride = 0;  // words
  const uint16_t* scale = nullptr; // [k/G, n] per problem / expert
  int64_t scale_batch_stride = 0;
  const int32_t* zero_point = nullptr; // [k/G, n/8] per problem / expert (asym)
  int64_t zp_batch_stride = 0;
  int32_t n = 0, k = 0;
  int32_t glen = 0;   // group length along k (k for per-channel)
  int32_t groups = 0; // k / glen
  bool has_zero_point = false;

  // ---- output ----
  epilogue ep = epilogue::store_bf16;
  void* c = nullptr;          // bf16 or float rows of ldc elements
  int64_t ldc = 0;
  int64_t c_batch_stride = 0; // dense: elements between problems
  int32_t up_tile_offset = 0; // silu: 64-column tiles between gate and up (I / 64)

  // ---- programmatic dependent launch (run with pdl = true; the fused MoE) ----
  // The kernel waits for the previous kernel in the stream (griddepcontrol.wait) before it reads
  // anything that kernel may write, and lets the next one launch as soon as every CTA got there.
  // prefetch_units > 0: before waiting, each CTA pulls the weights of the first prefetch_units
  // units of its run into L2 (only for a problem whose m blocks and experts were written by a
  // kernel that finished before the previous one passed its own wait: the MoE's w2 after w13).
  int32_t prefetch_units = 0;

  // ---- partition ----
  // Whole tiles: CTA c computes tile c over its whole k range, so no tile is split and every
  // output element is summed in the same order whatever the tile's index (the m, the routing).
  // The launch must then have a CTA for every tile (tiles_of: grid_for does not apply); CTAs past
  // the tiles in use return at once. For batch invariance (the fused MoE's batch_invariant); the
  // default splits tiles along k to balance the SMs (stream-K).
  bool whole_tiles = false;
};

constexpr int k_tile_n = 256; // output columns per CTA tile
constexpr int k_stage_k = 128; // k per pipeline stage (one stream-K unit)

// Rows per m block for m rows (8, 16, 32, 48 or 64; 48 at most on devices without the shared
// memory of the 64-row variant, i.e. before sm_90), and whether a value names a variant.
int block_rows_for(int64_t rows);
bool block_rows_valid(int block_rows);
// Grid of the persistent kernel for this variant on the current device (SMs x CTAs per SM),
// capped by max_ctas when > 0; 0 when the device query failed.
int grid_for(int block_rows, int max_ctas);
// Bytes of FP32 partial tiles any variant needs with its full grid (two tiles per CTA), rounded
// to 256. Workspaces put this region first and the tile counters after it, so the counters stay
// at the same place whatever m (or T) and max_ctas a launch has.
std::size_t partial_bytes();
std::size_t counter_bytes(int64_t max_tiles);
// CTA tiles along n of the problem, and all its tiles (dense exact; moe for max_m_blocks).
int64_t n_tiles_of(const problem& p);
int64_t tiles_of(const problem& p, int block_rows);
// Launches the core kernel on `grid` CTAs (<= grid_for). counters: one int per tile, zero on
// entry (left zero); partials: partial_bytes.
kernel_status run(const problem& p, int block_rows, int grid, int* counters, float* partials, cudaStream_t stream,
                  bool pdl = false);

// griddepcontrol (sm_90): wait for the previous kernel of the stream (a no-op for a kernel not
// launched as a programmatic dependent), and allow the next one to launch. RLSERVE_W4A16_PDL=0
// builds the MoE without programmatic launches and prefetch (for comparison).
#ifndef RLSERVE_W4A16_PDL
#define RLSERVE_W4A16_PDL 1
#endif
#if defined(__CUDACC__)
// ---- serving-tile arithmetic shared by the GEMM core and the MoE's GEMV path -------------------

// (a & b) | c in one instruction (lookup table 0xEA = (0xF0 & 0xCC) | 0xAA): masks two nibbles
// and ORs the bf16 exponent in.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// a * b + c on two bf16 lanes with one rounding (sm_80+; subtract and multiply below are both
// this instruction, so sm_80 and sm_90 give the same bits).
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Nibble slots (s, s+4) of a serving word land in the low and high halves of a bf16x2.
constexpr uint32_t k_nibble_pair_mask = 0x000f000fu;
// bf16 128.0 in both halves: 128 has exponent 2^7 and 7 mantissa bits, so mantissa value q
// (0..15) ORed into it reads as exactly 128 + q.
constexpr uint32_t k_bf16x2_128 = 0x43004300u;
constexpr uint32_t k_bf16x2_one = 0x3f803f80u;       // (1.0, 1.0)
constexpr uint32_t k_bf16x2_neg_zero = 0x80008000u;  // (-0.0, -0.0): x * s + -0 == x * s exactly
constexpr uint32_t k_bf16x2_neg_128 = 0xc300c300u;   // -(128 + z) = 0xc300 | z for z in 0..15
constexpr uint32_t k_bf16x2_neg_136 = 0xc308c308u;   // symmetric: -(128 + 8)

// The dequantized B fragments of one serving word for the two n8 tiles of its n16 block:
// b[0], b[1] = k rows (r, r+1), (r+8, r+9) of tile 2j; b[2], b[3] the same of tile 2j+1.
// Read swap-AB (weights as the A operand), {b[0], b[2], b[1], b[3]} is the A fragment of the
// 16 x 16 block (docs/formats.md §4).
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t nz0, uint32_t s0, uint32_t nz1,
                                             uint32_t s1, uint32_t (&b)[4]) {
  const uint32_t q0 = lop3_and_or(w, k_nibble_pair_mask, k_bf16x2_128);       // slots 0, 4
  const uint32_t q1 = lop3_and_or(w >> 4, k_nibble_pair_mask, k_bf16x2_128);  // slots 1, 5
  const uint32_t q2 = lop3_and_or(w >> 8, k_nibble_pair_mask, k_bf16x2_128);  // slots 2, 6
  const uint32_t q3 = lop3_and_or(w >> 12, k_nibble_pair_mask, k_bf16x2_128); // slots 3, 7
  b[0] = fma_bf16x2(fma_bf16x2(q0, k_bf16x2_one, nz0), s0, k_bf16x2_neg_zero);
  b[1] = fma_bf16x2(fma_bf16x2(q1, k_bf16x2_one, nz0), s0, k_bf16x2_neg_zero);
  b[2] = fma_bf16x2(fma_bf16x2(q2, k_bf16x2_one, nz1), s1, k_bf16x2_neg_zero);
  b[3] = fma_bf16x2(fma_bf16x2(q3, k_bf16x2_one, nz1), s1, k_bf16x2_neg_zero);
}

// Scale and negated zero-point pairs of the lane's 8 columns (c + 8t, t = 0..7) of one 64-column
// serving tile for one group: srow = the tile's 64 scales of that group, zrow = its 8 zero-point
// words (asymmetric only). `grouped` = more than one group along k (else the single permutation).
__device__ __forceinline__ void load_group(bool grouped, bool has_zero_point, const uint16_t* srow,
                                           const uint32_t* zrow, int lane, uint32_t (&sc)[8], uint32_t (&nz)[8]) {
  const int c = lane >> 2;
  if (grouped) {
    // Grouped permutation: position 8c + t holds column c + 8t, one 16-byte read.
    const uint4 v = *reinterpret_cast<const uint4*>(srow + 8 * c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sc[2 * i] = __byte_perm(w[i], 0, 0x1010);     // low half in both halves
      sc[2 * i + 1] = __byte_perm(w[i], 0, 0x3232); // high half in both halves
    }
  } else {
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const uint32_t h = srow[serving_scale_position(8 * t + c, true)];
      sc[t] = h | (h << 16);
    }
  }
  if (has_zero_point) {
    // The zero-point word is interleaved like a weight word: slots (i, i+4) hold the zero points
    // of tiles 2i, 2i+1, so the weights' lop3 with a negative magic gives -(128 + z) pairs, and a
    // byte permute broadcasts each half.
    const uint32_t zw = zrow[c];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t pz = lop3_and_or(zw >> (4 * i), k_nibble_pair_mask, k_bf16x2_neg_128);
      nz[2 * i] = __byte_perm(pz, 0, 0x1010);
      nz[2 * i + 1] = __byte_perm(pz, 0, 0x3232);
    }
  } else {
#pragma unroll
    for (int t = 0; t < 8; ++t)
      nz[t] = k_bf16x2_neg_136;
  }
}

// The decode kernels' griddepcontrol (kernels/cuda/programmatic_launch.cuh), behind this
// file's own switch.
__device__ __forceinline__ void grid_dep_wait() {
#if RLSERVE_W4A16_PDL
  programmatic_wait();
#endif
}
__device__ __forceinline__ void grid_dep_launch() {
#if RLSERVE_W4A16_PDL
  programmatic_trigger();
#endif
}
#endif

} // namespace rlserve::kernels::w4a16
