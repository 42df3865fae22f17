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

#include "kernels/kernel_status.hpp"

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
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && RLSERVE_W4A16_PDL
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && RLSERVE_W4A16_PDL
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
#endif

} // namespace rlserve::kernels::w4a16
