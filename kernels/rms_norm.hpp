// RMSNorm over the last dimension: y[r, c] = x[r, c] / sqrt(mean_c(x[r, :]^2) + eps) * weight[c].
// The CPU reference (rms_norm_ref) and the CUDA twin (rms_norm_launch) take the same arguments;
// tests/kernels/rms_norm_gpu_test holds them together.
#pragma once

#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

struct rms_norm_args {
  const float* x;      // [rows, cols] row-major, fp32
  const float* weight; // [cols], fp32 (Qwen3 stores the scale itself, not 1 + scale)
  float* y;            // [rows, cols], may alias x
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-6f;
};

kernel_status rms_norm_can_implement(const rms_norm_args& args);

// CPU reference: one pass for the sum of squares in double, as the numpy reference does.
kernel_status rms_norm_ref(const rms_norm_args& args);

// CUDA: one block per row, fp32 throughout; pointers are device pointers.
kernel_status rms_norm_launch(const rms_norm_args& args, cudaStream_t stream);

} // namespace rlserve::kernels
