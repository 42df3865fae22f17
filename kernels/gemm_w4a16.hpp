// W4A16 GEMM: C[m, n] (bf16) = A[m, k] (bf16) x dequant(B), B an INT4 weight in the SERVING layout
// (kernels/int4_format.hpp, docs/formats.md §4: Marlin 16x64 tiles, permuted bf16 scales, and
// interleaved zero points or the symmetric bias 8). In Hugging Face terms C = A W^T with W the
// [n, k] Linear weight the serving tensors were repacked from.
//
// Host API in the CUTLASS shape: fill gemm_w4a16_args, check gemm_w4a16_can_implement, size the
// workspace with gemm_w4a16_workspace_bytes, zero it ONCE with gemm_w4a16_workspace_init, then
// call gemm_w4a16_launch as often as needed (each launch leaves the workspace's counters at zero
// again, so it is reusable; it must not be shared by two launches that can run concurrently, and
// a launch that was killed part-way leaves it dirty: init it again).
//
// Numerics. The CPU reference and the CUDA kernel for blocks of 32..64 rows dequantize every
// weight exactly as serving_dequant_ref does, w = bf16_rn((q - z) * scale) (one rounding); the
// CUDA kernel for blocks of 8 / 16 rows (m <= 16) uses (q - z) * scale unrounded in FP32 (it
// applies scale and zero point once per group, see gemm_w4a16.cu), so it differs from the
// reference by about the reference's own weight rounding (the tests' bound is 1e-2 relative; the
// measured error is in docs/performance.md).
// Products and sums are FP32, and each output is rounded to bf16 once. Both sum k in a fixed
// order (tensor-core dot products, then warps, then split-K partials in CTA order), so CUDA
// results are deterministic run to run on one device.
//
// CUDA kernel, in one paragraph (kernels/cuda/gemm_w4a16.cu has the details): mma.sync m16n8k16
// bf16; m <= 16 with the weights on M and the tokens on N (swap-AB: 1 or 2 n8 token tiles),
// larger m with tokens on M (2-4 m16 blocks per CTA) and weights on N; a CTA of 8 warps streams
// 128(k) x 256(n) weight stages (16 KB) with cp.async through a 3-4 stage shared-memory pipeline;
// every 16-byte word a lane loads is that lane's B fragments for 8 mma (the serving layout's
// point), dequantized with lop3 + the bf16 "128 + q" magic exponent and subtract-then-scale. Work
// is a persistent stream-K partition of (m block x n tile x k stage) units over all SMs, so every
// SM has equal work at any m; tiles split between CTAs are reduced through FP32 partials by the
// last CTA to arrive, in CTA order (deterministic, no spinning). m > 64 runs several 64-row m
// blocks (weights re-read from L2). Measured performance and its limits: docs/performance.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/int4_format.hpp"
#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

struct gemm_w4a16_args {
  int64_t m = 0;                  // rows of A and C (tokens); 0 is a no-op
  int64_t n = 0;                  // output features, multiple of 64 (serving tile)
  int64_t k = 0;                  // input features, multiple of 16 and of the group size
  int32_t group_size = 128;       // 32, 64, 128 or k_int4_channel (one group spanning k)
  bool has_zero_point = false;    // asymmetric (zero points given); else symmetric, z = 8
  int64_t batch = 1;              // independent problems (e.g. experts) back to back

  const uint16_t* a = nullptr;    // bf16 [batch, m, lda]
  int64_t lda = 0;                // row stride of A in elements; 0 = k (must be a multiple of 8)
  const int32_t* b = nullptr;     // serving weight, int32 [batch, k/16, 2n]
  const uint16_t* scale = nullptr;     // bf16 [batch, k/G, n], columns permuted (formats.md §4)
  const int32_t* zero_point = nullptr; // asym: int32 [batch, k/G, n/8]; symmetric: unused
  uint16_t* c = nullptr;          // bf16 [batch, m, ldc]
  int64_t ldc = 0;                // row stride of C in elements; 0 = n (must be a multiple of 8)

  // Test and tuning hooks (0 = automatic). max_ctas caps the persistent grid, which moves the
  // stream-K split points: 1 runs everything serially in one CTA, a large value splits every
  // tile's k range across several CTAs. block_rows picks the kernel variant by rows per CTA
  // tile (8 or 16: swap-AB kernel; 32, 48 or 64: Marlin-orientation kernel, 64 needs sm_90's
  // shared memory) instead of the one chosen from m. The workspace layout does not depend on
  // either, so one workspace serves every value.
  int32_t max_ctas = 0;
  int32_t block_rows = 0;

  // Batch invariance: row i's bits do not depend on m or on the other rows. One variant (8-row
  // blocks) at every m and whole tiles (no split of k between CTAs; a CTA per tile), so each
  // output element is summed in one order. Refused with block_rows other than 0 or 8 (max_ctas
  // does not apply).
  bool batch_invariant = false;
};

// ok, or invalid_problem (shape, group size, null pointer) / misaligned_operand (a pointer not
// 16-byte aligned, lda or ldc not a multiple of 8).
kernel_status gemm_w4a16_can_implement(const gemm_w4a16_args& args);

// CPU reference: dequantizes B through serving_dequant_ref, FP32 dot products in k order, one
// bf16 rounding per output. Host pointers.
kernel_status gemm_w4a16_ref(const gemm_w4a16_args& args);
// The same with FP32 outputs (no final rounding), out = float [batch, m, n] (ldc ignored); the
// fused-MoE reference builds its per-expert down projections from it.
kernel_status gemm_w4a16_ref_f32(const gemm_w4a16_args& args, float* out);

// Workspace the launch needs, for the device that is current when called (the persistent grid
// is sized from its SM count). Size it for the largest m and batch that will be launched with it.
std::size_t gemm_w4a16_workspace_bytes(const gemm_w4a16_args& args);
// Zeroes the workspace's tile counters (asynchronously on `stream`); needed once before the first
// launch, and again only after a launch that did not complete.
kernel_status gemm_w4a16_workspace_init(const gemm_w4a16_args& args, void* workspace,
                                        cudaStream_t stream);
// CUDA: device pointers; asynchronous on `stream`. Returns workspace_null when the workspace is
// needed and missing, not_supported in a build without CUDA kernels.
kernel_status gemm_w4a16_launch(const gemm_w4a16_args& args, void* workspace, cudaStream_t stream);

} // namespace rlserve::kernels
