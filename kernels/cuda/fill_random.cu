#include "kernels/bf16.hpp"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/fill_random.hpp"
#include "kernels/fill_random_value.hpp"

#include <cuda_bf16.h>

namespace rlserve::kernels {

namespace {

__global__ void fill_random_kernel(void* out, int64_t count, uint64_t seed, int kind, float lo,
                                   float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = fill_random_bits(seed, static_cast<uint64_t>(i));
    if (kind == fill_random_args::word32) {
      static_cast<uint32_t*>(out)[i] = static_cast<uint32_t>(r);
    } else {
      // __float2bfloat16_rn rounds to nearest even, as float_to_bf16 does on the host.
      __nv_bfloat16 v = __float2bfloat16_rn(fill_random_uniform(r, lo, hi));
      static_cast<uint16_t*>(out)[i] = *reinterpret_cast<uint16_t*>(&v);
    }
  }
}

} // namespace

kernel_status fill_random_launch(const fill_random_args& a, cudaStream_t stream) {
  if (auto s = fill_random_can_implement(a); s != kernel_status::ok)
    return s;
  if (a.count == 0)
    return kernel_status::ok;
  const int64_t blocks = std::min<int64_t>((a.count + 255) / 256, 132 * 16);
  fill_random_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(a.out, a.count, a.seed,
                                                                       a.kind, a.lo, a.hi);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

} // namespace rlserve::kernels
