#include "kernels/cuda/cuda_check.cuh"
#include "kernels/rms_norm.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_threads = 256; // one block per row; 8 warps reduce the sum of squares

__global__ void rms_norm_kernel(const float* __restrict__ x, // [rows, cols]
                                const float* __restrict__ w, // [cols]
                                float* y,                    // [rows, cols]
                                int64_t cols, float eps) {
  const float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  double sum_sq = 0.0; // double, as the CPU twin does, so both agree to rounding of the last op
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    sum_sq += static_cast<double>(xr[c]) * xr[c];
  __shared__ double partial[k_threads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    sum_sq += __shfl_down_sync(0xffffffffu, sum_sq, offset);
  if (threadIdx.x % 32 == 0)
    partial[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < k_threads / 32; ++i)
      total += partial[i];
    partial[0] = total;
  }
  __syncthreads();
  float inv_rms = static_cast<float>(1.0 / sqrt(partial[0] / cols + eps));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    yr[c] = xr[c] * inv_rms * w[c];
}

} // namespace

kernel_status rms_norm_launch(const rms_norm_args& args, cudaStream_t stream) {
  if (auto s = rms_norm_can_implement(args); s != kernel_status::ok)
    return s;
  if (args.rows == 0)
    return kernel_status::ok;
  if (args.rows > 0x7fffffff)
    return kernel_status::invalid_problem;
  rms_norm_kernel<<<static_cast<unsigned>(args.rows), k_threads, 0, stream>>>(
    args.x, args.weight, args.y, args.cols, args.eps);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

} // namespace rlserve::kernels
