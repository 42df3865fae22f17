// Programmatic dependent launch (sm_90) for the decode-step kernels: a kernel launched with
// launch_programmatic may start while the previous kernel of the stream is still running, once
// every CTA of that kernel has called programmatic_trigger() (or exited). It then must call
// programmatic_wait() -- which returns when the previous kernel has completed and its writes are
// visible -- before it reads anything a kernel wrote, and before it exits.
//
// The rule every kernel launched this way follows: programmatic_wait() in every CTA before any
// read of activations, KV, routing or logits; only weights (written between steps, never by a
// kernel that triggers early) may be read before it. Every CTA waits, so a kernel completes only
// after its predecessor has, and the chain stays ordered transitively. Without the launch
// attribute (or before sm_90) both calls are no-ops.
//
// What it buys (docs/performance.md, decode at batch 1): the next kernel's launch, its CTAs'
// start and its weight loads overlap the tail of the previous one, instead of one gap of a few
// microseconds per kernel, nine kernels per layer. RLSERVE_NO_PROGRAMMATIC_LAUNCH=1 in the
// environment launches them as ordinary kernels (to compare, or to rule this out when hunting a
// race); RLSERVE_PROGRAMMATIC_LAUNCH=0 at build time removes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

#ifndef RLSERVE_PROGRAMMATIC_LAUNCH
#define RLSERVE_PROGRAMMATIC_LAUNCH 1
#endif

namespace rlserve::kernels {

__device__ __forceinline__ void programmatic_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void programmatic_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the stream's
// previous kernel.
template <class... Params, class... Args>
cudaError_t launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                                cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  static const bool enabled = RLSERVE_PROGRAMMATIC_LAUNCH && std::getenv("RLSERVE_NO_PROGRAMMATIC_LAUNCH") == nullptr;
  cfg.numAttrs = enabled ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

} // namespace rlserve::kernels
