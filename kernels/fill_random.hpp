// Deterministic random fills for weights generated on the device (decode benchmarks at sizes no
// checkpoint is carried for). Value i depends only on (seed, i): splitmix64(seed ^ splitmix64(i)),
// so the CPU reference and the CUDA twin write the same bits and a launch is reproducible.
#pragma once

#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

struct fill_random_args {
  void* out = nullptr;
  int64_t count = 0;     // elements
  uint64_t seed = 0;
  enum kind_t : uint8_t { bf16_uniform = 1, word32 } kind = bf16_uniform;
  float lo = -1.0f, hi = 1.0f; // bf16_uniform: bf16_rn(lo + (hi - lo) * u), u in [0, 1) with 24 bits
};

kernel_status fill_random_can_implement(const fill_random_args& a);
kernel_status fill_random_ref(const fill_random_args& a);
kernel_status fill_random_launch(const fill_random_args& a, cudaStream_t stream);

} // namespace rlserve::kernels
