// XXH3-64 of a batch of device buffers: one warp per buffer, running the schedule of
// kernels/xxh3_warp.hpp (the unit tests run the same template on the host against the CPU twin).
// A buffer's blocks are sequential by the algorithm's design (a non-linear scramble between
// them), so the parallelism is across buffers; within one, 8 KiB of loads are in flight.
#include <algorithm>
#include <numeric>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/xxh3.hpp"
#include "kernels/xxh3_warp.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_warps_per_cta = 4;
constexpr int k_threads = k_warps_per_cta * k_xxh3_warp_size;
constexpr unsigned k_full_mask = 0xffffffffu;

__constant__ uint8_t k_secret_device[k_xxh3_secret_size] = {RLSERVE_XXH3_DEFAULT_SECRET};

// The warp interface of xxh3_64_warp. Host-callable only so that the template compiles for both
// sides; it is used in device code alone.
struct cuda_warp {
  int lane_id;
  RLSERVE_HD int lane() const { return lane_id; }
  RLSERVE_HD uint64_t shfl(uint64_t v, int src_lane) {
#ifdef __CUDA_ARCH__
    return __shfl_sync(k_full_mask, static_cast<unsigned long long>(v), src_lane);
#else
    (void)src_lane;
    return v;
#endif
  }
  RLSERVE_HD uint64_t shfl_xor(uint64_t v, int lane_mask) {
#ifdef __CUDA_ARCH__
    return __shfl_xor_sync(k_full_mask, static_cast<unsigned long long>(v), lane_mask);
#else
    (void)lane_mask;
    return v;
#endif
  }
};

__global__ void __launch_bounds__(k_threads)
xxh3_batch_kernel(const std::byte* const* data, const uint64_t* lengths, uint64_t* digests,
                  int64_t count) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * k_warps_per_cta + threadIdx.x / k_xxh3_warp_size;
  if (t >= count) // the whole warp leaves together
    return;
  cuda_warp warp{static_cast<int>(threadIdx.x % k_xxh3_warp_size)};
  const uint64_t digest = xxh3_64_warp(warp, data[t], lengths[t], k_secret_device);
  if (warp.lane() == 0)
    digests[t] = digest;
}

std::string cuda_problem(const char* what, cudaError_t e) {
  return std::string(what) + " failed: " + cudaGetErrorString(e);
}

} // namespace

kernel_status xxh3_batch_launch(const xxh3_batch_args& a, cudaStream_t stream) {
  if (!xxh3_batch_problem(a).empty())
    return kernel_status::invalid_problem;
  if (a.count == 0)
    return kernel_status::ok;
  const int64_t ctas = (a.count + k_warps_per_cta - 1) / k_warps_per_cta;
  if (ctas > 0x7fffffff)
    return kernel_status::not_supported;
  xxh3_batch_kernel<<<static_cast<unsigned>(ctas), k_threads, 0, stream>>>(a.data, a.lengths,
                                                                          a.digests, a.count);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

rlserve::expected<std::vector<uint64_t>> xxh3_device_digests(const std::vector<xxh3_device_span>& spans,
                                                            cudaStream_t stream) {
  const auto count = static_cast<int64_t>(spans.size());
  std::vector<uint64_t> digests(spans.size());
  if (count == 0)
    return digests;
  for (int64_t t = 0; t < count; ++t)
    if (spans[t].data == nullptr && spans[t].length > 0)
      return rlserve::fail("XXH3 on the device: buffer " + std::to_string(t) + " has " +
                           std::to_string(spans[t].length) + " bytes but a null address");

  // Longest first: the block scheduler starts warps roughly in order, and one buffer is one warp.
  std::vector<int64_t> order(spans.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return spans[x].length > spans[y].length; });
  // One allocation for the three tables: [pointers | lengths | digests], 8 bytes per entry each.
  std::vector<uint64_t> table(2 * spans.size());
  for (int64_t k = 0; k < count; ++k) {
    table[k] = reinterpret_cast<uintptr_t>(spans[order[k]].data);
    table[count + k] = spans[order[k]].length;
  }
  static_assert(sizeof(const std::byte*) == sizeof(uint64_t), "device pointers are 64-bit");
  void* device_table = nullptr;
  const std::size_t table_bytes = 3 * spans.size() * sizeof(uint64_t);
  if (auto e = cudaMallocAsync(&device_table, table_bytes, stream); e != cudaSuccess)
    return rlserve::fail("XXH3 on the device: " + cuda_problem("cudaMallocAsync of the tables", e));
  auto* words = static_cast<uint64_t*>(device_table);
  auto finish = [&](std::string problem) -> rlserve::expected<std::vector<uint64_t>> {
    cudaFreeAsync(device_table, stream);
    if (!problem.empty())
      return rlserve::fail("XXH3 on the device: " + problem);
    return std::move(digests);
  };
  if (auto e = cudaMemcpyAsync(words, table.data(), 2 * spans.size() * sizeof(uint64_t),
                               cudaMemcpyHostToDevice, stream);
      e != cudaSuccess)
    return finish(cuda_problem("cudaMemcpyAsync of the tables", e));
  const xxh3_batch_args args{reinterpret_cast<const std::byte* const*>(words), words + count,
                             words + 2 * count, count};
  if (auto st = xxh3_batch_launch(args, stream); st != kernel_status::ok)
    return finish("the launch failed: " + std::string(to_string(st)));
  std::vector<uint64_t> sorted(spans.size());
  if (auto e = cudaMemcpyAsync(sorted.data(), words + 2 * count, spans.size() * sizeof(uint64_t),
                               cudaMemcpyDeviceToHost, stream);
      e != cudaSuccess)
    return finish(cuda_problem("cudaMemcpyAsync of the digests", e));
  if (auto e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return finish(cuda_problem("hashing (cudaStreamSynchronize)", e));
  for (int64_t k = 0; k < count; ++k)
    digests[order[k]] = sorted[k];
  return finish({});
}

} // namespace rlserve::kernels
