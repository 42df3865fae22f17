// kernels/weight_copy on the device: the batched NaN/Inf scan and bf16 conversion equal their CPU
// references bit for bit, over many tensors of every float dtype at odd alignments.
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/weight_copy.hpp"

using namespace rlserve;
using namespace rlserve::kernels;

BOOST_AUTO_TEST_SUITE(weight_copy_gpu_test)

BOOST_AUTO_TEST_CASE(device_scan_and_convert_equal_the_references) {
  std::mt19937_64 rng(11);
  const dtype types[] = {dtype::bf16, dtype::f16, dtype::f32};
  const int tensors = 300;
  std::vector<std::vector<unsigned char>> host(tensors);
  std::vector<weight_batch_item> items;
  std::vector<void*> frees;
  std::vector<const void*> src_h;
  std::vector<void*> dst_h;
  std::vector<int64_t> count;
  std::vector<uint8_t> type;
  std::vector<std::vector<uint16_t>> out_h(tensors);
  for (int t = 0; t < tensors; ++t) {
    const dtype ty = types[t % 3];
    const std::size_t es = ty == dtype::f32 ? 4 : 2;
    const int64_t n = 1 + static_cast<int64_t>(rng() % (t % 10 == 0 ? 300000 : 3000));
    const std::size_t misalign = es * (rng() % 8);
    host[t].resize(n * es);
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (int64_t i = 0; i < n; ++i) {
      float v = d(rng);
      if (t % 7 == 3 && i == n / 2)
        v = std::nanf("");
      if (t % 11 == 5 && i == n - 1)
        v = -INFINITY;
      if (ty == dtype::f32) {
        std::memcpy(&host[t][4 * i], &v, 4);
      } else {
        uint16_t b = ty == dtype::bf16 ? float_to_bf16(v) : float_to_f16(v);
        std::memcpy(&host[t][2 * i], &b, 2);
      }
    }
    void *s = nullptr, *o = nullptr;
    BOOST_REQUIRE(cudaMalloc(&s, n * es + 64) == cudaSuccess);
    BOOST_REQUIRE(cudaMalloc(&o, n * 2 + 64) == cudaSuccess);
    frees.push_back(s);
    frees.push_back(o);
    auto* at = static_cast<unsigned char*>(s) + misalign;
    BOOST_REQUIRE(cudaMemcpy(at, host[t].data(), host[t].size(), cudaMemcpyHostToDevice) == cudaSuccess);
    auto* out = static_cast<unsigned char*>(o) + 2 * (t % 3);
    items.push_back({at, out, n, ty});
    src_h.push_back(host[t].data());
    out_h[t].resize(n);
    dst_h.push_back(out_h[t].data());
    count.push_back(n);
    type.push_back(static_cast<uint8_t>(weight_type_of(ty)));
  }
  std::vector<uint64_t> want_flags(tensors);
  weight_batch_args ref{tensors, src_h.data(), dst_h.data(), count.data(), type.data(), want_flags.data()};
  BOOST_REQUIRE(weight_scan_ref(ref) == kernel_status::ok);
  BOOST_REQUIRE(weight_to_bf16_ref(ref) == kernel_status::ok);

  void* table = nullptr;
  BOOST_REQUIRE(cudaMalloc(&table, weight_batch_table_bytes(tensors)) == cudaSuccess);
  auto flags = weight_scan_device(items, table, nullptr);
  BOOST_REQUIRE_MESSAGE(flags, (flags ? "" : flags.error()));
  int nonfinite = 0;
  for (int t = 0; t < tensors; ++t) {
    BOOST_TEST((*flags)[t] == want_flags[t], "tensor " << t);
    nonfinite += want_flags[t] != k_weight_all_finite;
  }
  BOOST_TEST(nonfinite > 10);
  auto ok = weight_to_bf16_device(items, table, nullptr);
  BOOST_REQUIRE_MESSAGE(ok, (ok ? "" : ok.error()));
  BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  for (int t = 0; t < tensors; ++t) {
    std::vector<uint16_t> got(count[t]);
    BOOST_REQUIRE(cudaMemcpy(got.data(), items[t].dst, got.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    // NaN payloads may differ between host and device conversions: compare NaN-ness there.
    int64_t bad = 0;
    for (int64_t i = 0; i < count[t]; ++i) {
      const bool nan_h = (out_h[t][i] & 0x7fff) > 0x7f80, nan_d = (got[i] & 0x7fff) > 0x7f80;
      if (nan_h ? !nan_d : got[i] != out_h[t][i])
        ++bad;
    }
    BOOST_TEST(bad == 0, "tensor " << t << " (" << torch_name(items[t].type) << ", " << count[t] << " elements)");
  }
  cudaFree(table);
  for (auto* p : frees)
    cudaFree(p);
}

BOOST_AUTO_TEST_SUITE_END()
