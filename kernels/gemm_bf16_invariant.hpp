// The batch-invariant BF16 linear: one of the GPU decoder forward's ops, under the conventions at
// the top of kernels/decoder_ops.hpp (args struct, *_ref / *_launch, graph-capturable launches,
// numerics). CPU reference: kernels/cpu/gemm_bf16_invariant.cpp; CUDA twin:
// kernels/cuda/gemm_bf16_invariant.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- BF16 linear whose rows do not depend on each other ------------------------------------------
// y[r, c] = sum_j float(x[r, j]) * float(w[c, j]) for r < rows, c < n (Hugging Face orientation:
// w is [n, k]), written as bf16 or fp32 with row stride ldy: what cuBLAS and the GEMV
// (kernels/gemv_bf16.hpp) compute, with one more property: row r's bits depend only on x's row r
// and w, never on `rows` or on the other rows. cuBLAS picks its kernel, tiles and split-K from the
// shape, and the GEMV splits k by the grid it wants, so a token's result there depends on its
// batch. Here every output element is one warp's tensor-core accumulation over k in 16-element
// steps from 0 to k, one order for every shape (no split-K, one kernel), which is what the
// batch-invariant forward (gpu_options::batch_invariant) runs its BF16 linears on. The CPU twin
// sums in double: the GPU result differs from it by fp32 summation only.
struct gemm_bf16_invariant_args {
  const uint16_t* x = nullptr; // bf16 [rows, k], 16-byte aligned, row stride k
  const uint16_t* w = nullptr; // bf16 [n, k], 16-byte aligned
  void* y = nullptr;           // bf16 or fp32 [rows, ldy]
  int64_t rows = 0, n = 0, k = 0, ldy = 0; // rows >= 0 (0: nothing), n >= 1, k % 16 == 0, ldy >= n
  bool f32_out = false;
};
kernel_status gemm_bf16_invariant_can_implement(const gemm_bf16_invariant_args& a);
kernel_status gemm_bf16_invariant_ref(const gemm_bf16_invariant_args& a);
kernel_status gemm_bf16_invariant_launch(const gemm_bf16_invariant_args& a, cudaStream_t stream);

} // namespace rlserve::kernels
