#include "kernels/cuda/cuda_check.cuh"
#include "kernels/weight_copy.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

namespace rlserve::kernels {

namespace {

constexpr int k_threads = 256;
constexpr int k_blocks_per_tensor = 64; // grid x: enough blocks to stream a large tensor

__device__ inline float element(const void* src, uint8_t type, int64_t i) {
  if (type == static_cast<uint8_t>(weight_type::f32))
    return static_cast<const float*>(src)[i];
  const uint16_t h = static_cast<const uint16_t*>(src)[i];
  if (type == static_cast<uint8_t>(weight_type::bf16))
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
  return __half2float(__ushort_as_half(h));
}

__device__ inline bool finite_bits_bf16(uint32_t h) { return (h & 0x7f80u) != 0x7f80u; }

// One y-slice of the grid per tensor (looping when there are more tensors than gridDim.y).
__global__ void scan_kernel(int64_t tensors, const void* const* src, const int64_t* count,
                            const uint8_t* type, unsigned long long* nonfinite) {
  for (int64_t t = blockIdx.y; t < tensors; t += gridDim.y) {
    const uint8_t ty = type[t];
    if (ty == static_cast<uint8_t>(weight_type::other))
      continue;
    const int64_t n = count[t];
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (ty == static_cast<uint8_t>(weight_type::bf16) && reinterpret_cast<uintptr_t>(src[t]) % 16 == 0) {
      // Eight bf16 per 16-byte load; the exponent test needs no conversion.
      const uint4* v = static_cast<const uint4*>(src[t]);
      const int64_t vectors = n / 8;
      for (int64_t j = first; j < vectors; j += stride) {
        const uint4 w = v[j];
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (!finite_bits_bf16((words[e / 2] >> (16 * (e % 2))) & 0xffffu))
            atomicMin(&nonfinite[t], static_cast<unsigned long long>(8 * j + e));
      }
      for (int64_t i = 8 * vectors + first; i < n; i += stride)
        if (!isfinite(element(src[t], ty, i)))
          atomicMin(&nonfinite[t], static_cast<unsigned long long>(i));
      continue;
    }
    for (int64_t i = first; i < n; i += stride)
      if (!isfinite(element(src[t], ty, i)))
        atomicMin(&nonfinite[t], static_cast<unsigned long long>(i));
  }
}

__global__ void to_bf16_kernel(int64_t tensors, const void* const* src, void* const* dst,
                               const int64_t* count, const uint8_t* type) {
  for (int64_t t = blockIdx.y; t < tensors; t += gridDim.y) {
    const uint8_t ty = type[t];
    const int64_t n = count[t];
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    uint16_t* out = static_cast<uint16_t*>(dst[t]);
    if (ty == static_cast<uint8_t>(weight_type::bf16) && reinterpret_cast<uintptr_t>(src[t]) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(out) % 16 == 0) {
      const uint4* v = static_cast<const uint4*>(src[t]);
      uint4* o = reinterpret_cast<uint4*>(out);
      const int64_t vectors = n / 8;
      for (int64_t j = first; j < vectors; j += stride)
        o[j] = v[j];
      for (int64_t i = 8 * vectors + first; i < n; i += stride)
        out[i] = static_cast<const uint16_t*>(src[t])[i];
      continue;
    }
    for (int64_t i = first; i < n; i += stride) {
      if (ty == static_cast<uint8_t>(weight_type::bf16)) {
        out[i] = static_cast<const uint16_t*>(src[t])[i];
      } else {
        // __float2bfloat16_rn rounds to nearest even, as float_to_bf16 does on the host.
        __nv_bfloat16 b = __float2bfloat16_rn(element(src[t], ty, i));
        out[i] = *reinterpret_cast<uint16_t*>(&b);
      }
    }
  }
}

dim3 grid_for(int64_t tensors) {
  return dim3(k_blocks_per_tensor, static_cast<unsigned>(tensors < 65535 ? tensors : 65535));
}

// Carves the device table: src | dst | count | nonfinite | type.
struct table_view {
  const void** src;
  void** dst;
  int64_t* count;
  uint64_t* nonfinite;
  uint8_t* type;
};
table_view carve(void* base, std::size_t n) {
  auto* b = static_cast<unsigned char*>(base);
  table_view v;
  v.src = reinterpret_cast<const void**>(b);
  v.dst = reinterpret_cast<void**>(b + 8 * n);
  v.count = reinterpret_cast<int64_t*>(b + 16 * n);
  v.nonfinite = reinterpret_cast<uint64_t*>(b + 24 * n);
  v.type = b + 32 * n;
  return v;
}

// Fills a host mirror of the table and copies it to `table` (the copy is from pageable memory,
// which the driver stages before returning, so the mirror may die at once).
rlserve::status upload(std::span<const weight_batch_item> items, void* table, cudaStream_t stream,
                       weight_batch_args& a) {
  const std::size_t n = items.size();
  std::vector<unsigned char> host(weight_batch_table_bytes(n));
  auto h = carve(host.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    h.src[i] = items[i].src;
    h.dst[i] = items[i].dst;
    h.count[i] = items[i].count;
    h.nonfinite[i] = k_weight_all_finite;
    h.type[i] = static_cast<uint8_t>(weight_type_of(items[i].type));
  }
  if (auto e = cudaMemcpyAsync(table, host.data(), host.size(), cudaMemcpyHostToDevice, stream);
      e != cudaSuccess)
    return rlserve::fail(std::string("CUDA: copying the weight table failed: ") + cudaGetErrorString(e));
  // Pageable copies return once the source was consumed; make sure of it before `host` dies.
  if (auto e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return rlserve::fail(std::string("CUDA: ") + cudaGetErrorString(e));
  auto d = carve(table, n);
  a.tensors = static_cast<int64_t>(n);
  a.src = d.src;
  a.dst = d.dst;
  a.count = d.count;
  a.type = d.type;
  a.nonfinite = d.nonfinite;
  return {};
}

} // namespace

kernel_status weight_scan_launch(const weight_batch_args& a, cudaStream_t stream) {
  if (auto s = weight_batch_can_implement(a, false); s != kernel_status::ok)
    return s;
  if (a.tensors == 0)
    return kernel_status::ok;
  RLSERVE_CUDA_TRY(cudaMemsetAsync(a.nonfinite, 0xff, static_cast<std::size_t>(a.tensors) * 8, stream));
  scan_kernel<<<grid_for(a.tensors), k_threads, 0, stream>>>(
    a.tensors, a.src, a.count, a.type, reinterpret_cast<unsigned long long*>(a.nonfinite));
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

kernel_status weight_to_bf16_launch(const weight_batch_args& a, cudaStream_t stream) {
  if (auto s = weight_batch_can_implement(a, true); s != kernel_status::ok)
    return s;
  if (a.tensors == 0)
    return kernel_status::ok;
  to_bf16_kernel<<<grid_for(a.tensors), k_threads, 0, stream>>>(a.tensors, a.src, a.dst, a.count,
                                                                a.type);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

rlserve::expected<std::vector<uint64_t>> weight_scan_device(std::span<const weight_batch_item> items,
                                                             void* table, cudaStream_t stream) {
  std::vector<uint64_t> out(items.size(), k_weight_all_finite);
  if (items.empty())
    return out;
  weight_batch_args a;
  if (auto s = upload(items, table, stream, a); !s)
    return std::move(s).take_failure();
  if (auto st = weight_scan_launch(a, stream); st != kernel_status::ok)
    return rlserve::fail(std::string("weight scan on the device failed: ") + std::string(to_string(st)));
  if (auto e = cudaMemcpyAsync(out.data(), a.nonfinite, out.size() * 8, cudaMemcpyDeviceToHost, stream);
      e != cudaSuccess)
    return rlserve::fail(std::string("CUDA: ") + cudaGetErrorString(e));
  if (auto e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return rlserve::fail(std::string("CUDA: weight scan failed: ") + cudaGetErrorString(e));
  return out;
}

rlserve::status weight_to_bf16_device(std::span<const weight_batch_item> items, void* table,
                                      cudaStream_t stream) {
  if (items.empty())
    return {};
  for (const auto& it : items)
    if (weight_type_of(it.type) == weight_type::other)
      return rlserve::fail("weight copy to bf16: a source tensor is not a floating type");
  weight_batch_args a;
  if (auto s = upload(items, table, stream, a); !s)
    return s;
  if (auto st = weight_to_bf16_launch(a, stream); st != kernel_status::ok)
    return rlserve::fail(std::string("weight copy on the device failed: ") + std::string(to_string(st)));
  return {};
}

} // namespace rlserve::kernels
