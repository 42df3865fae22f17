// One generator macro for every CUDA runtime call in kernels/ (in the style of ggml's
// CUDA_CHECK_GEN): on failure it prints the call, file and line once to stderr and *returns*
// kernel_status::cuda_error from the enclosing function instead of aborting the process.
#pragma once

#include <cstdio>

#include <cuda_runtime.h>

#include "kernels/kernel_status.hpp"

#define RLSERVE_CUDA_TRY(call)                                                                     \
  do {                                                                                             \
    cudaError_t rlserve_err_ = (call);                                                             \
    if (rlserve_err_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "rlserve: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__,         \
                   cudaGetErrorString(rlserve_err_));                                              \
      return ::rlserve::kernels::kernel_status::cuda_error;                                        \
    }                                                                                              \
  } while (0)

// After every launch: launch-configuration errors surface here, not at the next sync.
#define RLSERVE_CUDA_CHECK_LAUNCH() RLSERVE_CUDA_TRY(cudaGetLastError())
