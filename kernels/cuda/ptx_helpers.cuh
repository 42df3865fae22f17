// Small device helpers that more than one kernel file uses: cp.async copies into shared memory,
// the bf16 tensor-core MMA, bf16 rounding and packing. Included by CUDA sources only; the
// definitions stay in an unnamed namespace like the kernels', so every file keeps its own copy.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace rlserve::kernels {
namespace {

// 16-byte global->shared copy that bypasses L1 (.cg: streamed data is read once); `valid` false
// gives src-size 0, which writes 16 zero bytes without reading: padding past a tensor's edge reads
// as 0, never as stale data or NaN.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size));
}
// Closes the group of copies issued for one stage.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N groups are still in flight (the oldest stage has landed).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// D = A * B + D on the tensor cores (mma.sync m16n8k16): A 16x16 bf16 (row), B 16x8 bf16 (col),
// FP32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x rounded to bf16 (nearest even) and back.
__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
// Two floats as bf16 in one word, `lo` in the low half (the order of an mma fragment's pair).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

} // namespace
} // namespace rlserve::kernels
