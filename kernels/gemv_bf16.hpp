// The BF16 GEMV for decode-size linear layers: one of the GPU decoder forward's ops, under the
// conventions at the top of kernels/decoder_ops.hpp (args struct, *_ref / *_launch, graph-
// capturable launches, padding rows, numerics). CPU reference: kernels/cpu/gemv_bf16.cpp; CUDA
// twin: kernels/cuda/gemv_bf16.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- BF16 linear at decode sizes (GEMV) ----------------------------------------------------------
// y[r, c] = sum_j float(x[r, j]) * float(w[c, j]) for r < rows, c < n: a BF16 linear layer
// (Hugging Face orientation, w is [n, k]) for the few rows of a decode step, written as bf16 or
// fp32 with row stride ldy. fp32 sums on the GPU, double in the reference; one rounding of the
// output. Launched as a programmatic dependent: its first weights load while the kernel that
// wrote x finishes.
constexpr int64_t k_gemv_max_rows = 8;
// Where it beats cuBLAS (kernels_bench --only gemv; docs/performance.md, 'Decode on the GPU
// runner, round two: batch-1 kernels'): at one row, and for narrow outputs at any row count (the
// 128-expert router); at 4-8 rows of a wide output cuBLAS is faster, because each weight word is
// unpacked once per row of x.
constexpr bool gemv_bf16_preferred(int64_t rows, int64_t n) {
  return rows >= 1 && rows <= k_gemv_max_rows && (rows == 1 || n <= 1024);
}
struct gemv_bf16_args {
  const uint16_t* x = nullptr; // bf16 [rows, k], 16-byte aligned rows
  const uint16_t* w = nullptr; // bf16 [n, k], 16-byte aligned
  void* y = nullptr;           // bf16 or fp32 [rows, ldy]
  int64_t rows = 0, n = 0, k = 0, ldy = 0; // 1 <= rows <= k_gemv_max_rows, k % 8 == 0, ldy >= n
  bool f32_out = false;
};
kernel_status gemv_bf16_can_implement(const gemv_bf16_args& a);
kernel_status gemv_bf16_ref(const gemv_bf16_args& a);
kernel_status gemv_bf16_launch(const gemv_bf16_args& a, cudaStream_t stream);

} // namespace rlserve::kernels
