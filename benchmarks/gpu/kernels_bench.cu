// kernels_bench: the W4A16 GEMM, the BF16 GEMV, the fused MoE, the quantize-to-serving kernel
// and the XXH3-64 checksum kernel on one GPU, in one run, against the ceilings measured in the same run (device-to-device copy
// bandwidth, cuBLAS BF16 on the same GEMM shapes). Prints a table per section and writes them as Markdown (--md).
//
// Method (docs/performance.md): weights rotate over >= 4 x L2 of distinct copies (activations
// stay hot, as in decode), CUDA events around every launch after 10 warm-ups, 200 timed runs,
// median with p10 / p90; back-to-back launches (and for the MoE a CUDA graph of 16 calls) for
// throughput. Bytes: INT4 weights + bf16 scales + zero points + activations + outputs; for the
// MoE, the experts each call actually touches (counted from its routing on the host).
//
// Usage: kernels_bench [--md FILE] [--iters N] [--quick] [--profile] [--only gemm|gemv|moe|quant|xxh3] [--ms 1,16] [--ts 1,16]
//                      [--ctas 132,264]   (GEMM grid caps to compare, m = first of --ms)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/decoder_ops.hpp"
#include "kernels/fused_moe.hpp"
#include "kernels/gemm_w4a16.hpp"
#include "kernels/gemv_bf16.hpp"
#include "kernels/int4_format.hpp"
#include "kernels/int4_quant.hpp"
#include "kernels/moe_bf16.hpp"
#include "kernels/paged_attention.hpp"
#include "kernels/sampler.hpp"
#include "kernels/xxh3.hpp"

using namespace rlserve::kernels;

namespace {

#define CHECK_CUDA(call)                                                                                    \
  do {                                                                                                      \
    cudaError_t e_ = (call);                                                                                \
    if (e_ != cudaSuccess) {                                                                                \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)
#define CHECK_OK(call)                                                                            \
  do {                                                                                            \
    kernel_status s_ = (call);                                                                    \
    if (s_ != kernel_status::ok) {                                                                \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #call, __FILE__, __LINE__,                \
                   std::string(to_string(s_)).c_str());                                           \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)
#define CHECK_CUBLAS(call)                                                                \
  do {                                                                                    \
    cublasStatus_t s_ = (call);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s failed at %s:%d: %d\n", #call, __FILE__, __LINE__, (int)s_); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// splitmix64 of the index: reproducible random bits without a generator state per thread.
__device__ __host__ inline uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_bits(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<uint32_t>(mix(seed * 0x100000000ull + i));
}

// bf16 uniform in [lo, hi).
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(mix(seed * 0x100000000ull + i) >> 40) * 0x1.0p-24f;
    p[i] = __float2bfloat16_rn(lo + (hi - lo) * u);
  }
}

void bits(void* p, size_t bytes, uint64_t seed) {
  fill_bits<<<1024, 256>>>(static_cast<uint32_t*>(p), bytes / 4, seed);
  CHECK_CUDA(cudaGetLastError());
}
void uniform(void* p, size_t count, uint64_t seed, float lo, float hi) {
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), count, seed, lo, hi);
  CHECK_CUDA(cudaGetLastError());
}

void* dalloc(size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return p;
}

struct stats {
  double median_us = 0, p10_us = 0, p90_us = 0, b2b_us = 0;
};

int g_iters = 200;
constexpr int k_warmup = 10;
// --profile: one launch of every timed lambda, after its warm-up, inside a profiler range
// (cudaProfilerStart/Stop), so `ncu --profile-from-start off` sees each kernel once, warm, and
// nothing else (scripts/gpu/run_runner.sh ncu).
bool g_profile = false;

// Events around every launch (per-launch latency), then the same launches back to back; events
// are recorded on `stream`, the stream the launches use. `profiled`: whether --profile shows this
// lambda's kernels to the profiler (not for a graph of many calls already profiled eagerly).
template <class Launch>
stats time_launches(Launch launch, cudaStream_t stream = nullptr, bool profiled = true) {
  std::vector<cudaEvent_t> ev(2 * g_iters);
  for (auto& e : ev)
    CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < k_warmup; ++i)
    launch(i);
  if (g_profile && profiled) {
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaProfilerStart());
    launch(k_warmup);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaProfilerStop());
  }
  for (int i = 0; i < g_iters; ++i) {
    CHECK_CUDA(cudaEventRecord(ev[2 * i], stream));
    launch(i);
    CHECK_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> t(g_iters);
  for (int i = 0; i < g_iters; ++i) {
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = 1e3 * ms;
  }
  std::sort(t.begin(), t.end());
  stats s;
  s.median_us = t[g_iters / 2];
  s.p10_us = t[g_iters / 10];
  s.p90_us = t[g_iters * 9 / 10];
  CHECK_CUDA(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < g_iters; ++i)
    launch(i);
  CHECK_CUDA(cudaEventRecord(ev[1], stream));
  CHECK_CUDA(cudaEventSynchronize(ev[1]));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[1]));
  s.b2b_us = 1e3 * ms / g_iters;
  for (auto& e : ev)
    CHECK_CUDA(cudaEventDestroy(e));
  return s;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

struct table {
  std::string title;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::string markdown() const {
    std::ostringstream o;
    o << "\n" << title << "\n\n|";
    for (auto& h : header)
      o << " " << h << " |";
    o << "\n|";
    for (size_t i = 0; i < header.size(); ++i)
      o << " --- |";
    o << "\n";
    for (auto& r : rows) {
      o << "|";
      for (auto& c : r)
        o << " " << c << " |";
      o << "\n";
    }
    return o.str();
  }
};

// ---- 1. copy bandwidth ------------------------------------------------------------------------------

double copy_bandwidth(size_t bytes) {
  void* a = dalloc(bytes);
  void* b = dalloc(bytes);
  bits(a, bytes, 1);
  const stats s = time_launches([&](int) { CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 2.0 * bytes / (s.median_us * 1e-6);
}

// cuBLAS BF16 with the HF weight [n, k]: y[m, n] = x[m, k] W^T, i.e. column-major y^T = W x^T ("TN"),
// bf16 or fp32 out -- what model/qwen3_gpu.cpp runs.
void cublas_linear(cublasHandle_t h, const void* w, const void* x, void* y, int64_t m, int64_t n, int64_t k,
                   bool f32_out) {
  const float alpha = 1.0f, beta = 0.0f;
  CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                            static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF,
                            static_cast<int>(k), &beta, y, f32_out ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(n),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---- 2. dense GEMM -------------------------------------------------------------------------------------

void bench_gemm(int64_t k, int64_t n, const std::vector<int64_t>& ms, size_t rotate_bytes, double copy_bw, table& out,
                const std::vector<int>& ctas = {}) {
  const int32_t gs = 128;
  const int4_shape s{1, n, k, gs};
  const size_t wq = serving_weight_words(s) * 4, ws = serving_scale_count(s) * 2, wz = serving_zero_point_words(s) * 4;
  const size_t per_copy = wq + ws + wz;
  const int copies = static_cast<int>(std::max<size_t>(2, (rotate_bytes + per_copy - 1) / per_copy));
  std::vector<void*> q(copies), sc(copies), zp(copies);
  for (int i = 0; i < copies; ++i) {
    q[i] = dalloc(wq), sc[i] = dalloc(ws), zp[i] = dalloc(wz);
    bits(q[i], wq, 10 + i);
    uniform(sc[i], ws / 2, 20 + i, 0.002f, 0.012f);
    bits(zp[i], wz, 30 + i);
  }
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  auto* a = static_cast<uint16_t*>(dalloc(max_m * k * 2));
  auto* c = static_cast<uint16_t*>(dalloc(max_m * n * 2));
  uniform(a, max_m * k, 3, -1.0f, 1.0f);

  // cuBLAS BF16 on the same weights in the HF orientation (cublas_linear).
  const size_t wb = static_cast<size_t>(n) * k * 2;
  const int bcopies = static_cast<int>(std::max<size_t>(2, (rotate_bytes + wb - 1) / wb));
  std::vector<void*> w(bcopies);
  for (int i = 0; i < bcopies; ++i) {
    w[i] = dalloc(wb);
    uniform(w[i], wb / 2, 40 + i, -0.05f, 0.05f);
  }
  cublasHandle_t h;
  CHECK_CUBLAS(cublasCreate(&h));

  gemm_w4a16_args g;
  g.m = max_m, g.n = n, g.k = k, g.group_size = gs, g.has_zero_point = true;
  g.a = a, g.b = static_cast<int32_t*>(q[0]), g.scale = static_cast<uint16_t*>(sc[0]);
  g.zero_point = static_cast<int32_t*>(zp[0]), g.c = c;
  void* work = dalloc(gemm_w4a16_workspace_bytes(g));
  CHECK_OK(gemm_w4a16_workspace_init(g, work, nullptr));

  // Grid-cap experiment: the first m with each cap (how the stream-K split points matter).
  for (int cap : ctas) {
    g.m = ms.front();
    g.max_ctas = cap;
    const stats w4 = time_launches([&](int i) {
      gemm_w4a16_args x = g;
      x.b = static_cast<int32_t*>(q[i % copies]);
      x.scale = static_cast<uint16_t*>(sc[i % copies]);
      x.zero_point = static_cast<int32_t*>(zp[i % copies]);
      CHECK_OK(gemm_w4a16_launch(x, work, nullptr));
    });
    std::printf("gemm k=%ld n=%ld m=%ld max_ctas=%d: %.2f us (b2b %.2f), %.2f TB/s\n", static_cast<long>(k),
                static_cast<long>(n), static_cast<long>(g.m), cap, w4.median_us, w4.b2b_us,
                per_copy / (w4.median_us * 1e-6) / 1e12);
  }
  g.max_ctas = 0;
  for (int64_t m : ms) {
    g.m = m;
    const stats w4 = time_launches([&](int i) {
      gemm_w4a16_args x = g;
      x.b = static_cast<int32_t*>(q[i % copies]);
      x.scale = static_cast<uint16_t*>(sc[i % copies]);
      x.zero_point = static_cast<int32_t*>(zp[i % copies]);
      CHECK_OK(gemm_w4a16_launch(x, work, nullptr));
    });
    const stats cb = time_launches([&](int i) { cublas_linear(h, w[i % bcopies], a, c, m, n, k, false); });
    const double bytes = static_cast<double>(per_copy) + 2.0 * m * k + 2.0 * m * n;
    const double tbs = bytes / (w4.median_us * 1e-6) / 1e12;
    const double tflops = 2.0 * m * n * k / (w4.median_us * 1e-6) / 1e12;
    out.rows.push_back({std::to_string(k) + " x " + std::to_string(n), std::to_string(m),
                        fmt("%.2f", w4.median_us), fmt("%.1f", w4.p10_us) + " / " + fmt("%.1f", w4.p90_us),
                        fmt("%.2f", w4.b2b_us), fmt("%.2f", tbs), fmt("%.0f%%", 100.0 * bytes / (w4.median_us * 1e-6) / copy_bw),
                        fmt("%.1f", tflops), fmt("%.2f", cb.median_us), fmt("%.2f", cb.b2b_us),
                        fmt("%.2fx", cb.median_us / w4.median_us)});
    std::printf("gemm k=%ld n=%ld m=%ld: w4a16 %.2f us (p10 %.2f p90 %.2f, b2b %.2f) %.2f TB/s | cublas %.2f us (b2b %.2f) | %.2fx\n",
                static_cast<long>(k), static_cast<long>(n), static_cast<long>(m), w4.median_us, w4.p10_us, w4.p90_us,
                w4.b2b_us, tbs, cb.median_us, cb.b2b_us, cb.median_us / w4.median_us);
    std::fflush(stdout);
  }
  CHECK_CUBLAS(cublasDestroy(h));
  for (int i = 0; i < copies; ++i)
    for (void* p : {q[i], sc[i], zp[i]})
      CHECK_CUDA(cudaFree(p));
  for (auto p : w)
    CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(c));
  CHECK_CUDA(cudaFree(work));
}

// ---- 2b. BF16 GEMV at decode sizes (the model's attention projections, router, lm_head) ----------------

void bench_gemv(int64_t n, int64_t k, bool f32_out, const char* what, const std::vector<int64_t>& ms,
                size_t rotate_bytes, double copy_bw, table& out) {
  const size_t wb = static_cast<size_t>(n) * k * 2;
  const int copies = static_cast<int>(std::max<size_t>(2, (rotate_bytes + wb - 1) / wb));
  std::vector<void*> w(copies);
  for (int i = 0; i < copies; ++i) {
    w[i] = dalloc(wb);
    uniform(w[i], wb / 2, 60 + i, -0.05f, 0.05f);
  }
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  auto* x = static_cast<uint16_t*>(dalloc(max_m * k * 2));
  void* y = dalloc(max_m * n * 4);
  uniform(x, max_m * k, 5, -1.0f, 1.0f);
  cublasHandle_t h;
  CHECK_CUBLAS(cublasCreate(&h));
  for (int64_t m : ms) {
    if (m > k_gemv_max_rows)
      continue;
    const stats gv = time_launches([&](int i) {
      gemv_bf16_args g{x, static_cast<const uint16_t*>(w[i % copies]), y, m, n, k, n, f32_out};
      CHECK_OK(gemv_bf16_launch(g, nullptr));
    });
    const stats cb = time_launches([&](int i) { cublas_linear(h, w[i % copies], x, y, m, n, k, f32_out); });
    const double bytes = static_cast<double>(wb) + 2.0 * m * k + (f32_out ? 4.0 : 2.0) * m * n;
    auto tbs = [&](const stats& s) { return bytes / (s.b2b_us * 1e-6) / 1e12; };
    out.rows.push_back({what, std::to_string(n) + " x " + std::to_string(k), std::to_string(m),
                        fmt("%.2f", gv.median_us), fmt("%.2f", gv.b2b_us), fmt("%.2f", tbs(gv)),
                        fmt("%.0f%%", 100.0 * tbs(gv) * 1e12 / copy_bw), fmt("%.2f", cb.median_us),
                        fmt("%.2f", cb.b2b_us), fmt("%.2f", tbs(cb)), fmt("%.2fx", cb.b2b_us / gv.b2b_us)});
    std::printf("gemv %s n=%ld k=%ld m=%ld: gemv %.2f us (b2b %.2f, %.2f TB/s) | cublas %.2f us (b2b %.2f, %.2f TB/s) | %.2fx\n",
                what, static_cast<long>(n), static_cast<long>(k), static_cast<long>(m), gv.median_us, gv.b2b_us,
                tbs(gv), cb.median_us, cb.b2b_us, tbs(cb), cb.b2b_us / gv.b2b_us);
    std::fflush(stdout);
  }
  CHECK_CUBLAS(cublasDestroy(h));
  for (auto p : w)
    CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(y));
}

// ---- 3. fused MoE --------------------------------------------------------------------------------------

void bench_moe(const std::vector<int64_t>& ts, double copy_bw, table& out) {
  const int64_t E = 128, H = 2048, I = 768;
  const int32_t K = 8, gs = 128;
  const int layers = 2; // 2 x 314 MB of experts: a call never finds the previous call's experts in L2
  const int sets = 16;  // routings per T, cycled
  const int4_shape s13{E, 2 * I, H, gs}, s2{E, H, I, gs};
  struct lw {
    void *w13, *s13, *z13, *w2, *s2, *z2;
  };
  std::vector<lw> L(layers);
  for (int l = 0; l < layers; ++l) {
    L[l].w13 = dalloc(serving_weight_words(s13) * 4), L[l].s13 = dalloc(serving_scale_count(s13) * 2);
    L[l].z13 = dalloc(serving_zero_point_words(s13) * 4);
    L[l].w2 = dalloc(serving_weight_words(s2) * 4), L[l].s2 = dalloc(serving_scale_count(s2) * 2);
    L[l].z2 = dalloc(serving_zero_point_words(s2) * 4);
    bits(L[l].w13, serving_weight_words(s13) * 4, 100 + l);
    uniform(L[l].s13, serving_scale_count(s13), 110 + l, 0.002f, 0.012f);
    bits(L[l].z13, serving_zero_point_words(s13) * 4, 120 + l);
    bits(L[l].w2, serving_weight_words(s2) * 4, 130 + l);
    uniform(L[l].s2, serving_scale_count(s2), 140 + l, 0.002f, 0.012f);
    bits(L[l].z2, serving_zero_point_words(s2) * 4, 150 + l);
  }
  const double expert_bytes =
    (serving_weight_words(s13) * 4.0 + serving_scale_count(s13) * 2.0 + serving_zero_point_words(s13) * 4.0 +
     serving_weight_words(s2) * 4.0 + serving_scale_count(s2) * 2.0 + serving_zero_point_words(s2) * 4.0) / E;
  const int64_t max_t = *std::max_element(ts.begin(), ts.end());
  auto* x = static_cast<uint16_t*>(dalloc(max_t * H * 2));
  auto* y = static_cast<uint16_t*>(dalloc(max_t * H * 2));
  uniform(x, max_t * H, 7, -1.0f, 1.0f);
  std::vector<float*> logits(sets);
  for (auto& p : logits)
    p = static_cast<float*>(dalloc(max_t * E * 4));

  fused_moe_args a;
  a.tokens = max_t, a.hidden = H, a.intermediate = I, a.experts = E, a.top_k = K, a.group_size = gs;
  a.has_zero_point = true, a.max_tokens = max_t;
  a.x = x, a.out = y, a.router_logits = logits[0];
  a.w13 = static_cast<int32_t*>(L[0].w13), a.w13_scale = static_cast<uint16_t*>(L[0].s13);
  a.w13_zero_point = static_cast<int32_t*>(L[0].z13);
  a.w2 = static_cast<int32_t*>(L[0].w2), a.w2_scale = static_cast<uint16_t*>(L[0].s2);
  a.w2_zero_point = static_cast<int32_t*>(L[0].z2);
  void* work = dalloc(fused_moe_workspace_bytes(a));
  CHECK_OK(fused_moe_workspace_init(a, work, nullptr));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  uint64_t seed = 1;
  for (int64_t T : ts) {
    // Routings: Gaussian logits (uniform expert load in expectation); distinct experts per call
    // counted with the CPU top-k twin.
    double touched = 0;
    std::vector<float> hl(static_cast<size_t>(T * E));
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::vector<float> wts(ids.size());
    for (int r = 0; r < sets; ++r) {
      for (auto& v : hl)
        v = static_cast<float>(static_cast<double>(mix(seed++) >> 11) * 0x1.0p-53 * 4.0 - 2.0);
      moe_topk_args ta{T, E, K, true, hl.data(), ids.data(), wts.data()};
      CHECK_OK(moe_topk_ref(ta));
      touched += static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
      CHECK_CUDA(cudaMemcpy(logits[r], hl.data(), hl.size() * 4, cudaMemcpyHostToDevice));
    }
    touched /= sets;
    a.tokens = T;
    // Decode sizes run both paths side by side: GEMV (automatic there) and the tiled GEMMs.
    const std::vector<int> paths = T * K <= k_moe_gemv_auto_ids ? std::vector<int>{1, -1} : std::vector<int>{0};
    for (int path : paths) {
      auto args_for = [&](int i) {
        fused_moe_args x = a;
        x.gemv = path;
        const lw& l = L[i % layers];
        x.router_logits = logits[i % sets];
        x.w13 = static_cast<int32_t*>(l.w13), x.w13_scale = static_cast<uint16_t*>(l.s13);
        x.w13_zero_point = static_cast<int32_t*>(l.z13);
        x.w2 = static_cast<int32_t*>(l.w2), x.w2_scale = static_cast<uint16_t*>(l.s2);
        x.w2_zero_point = static_cast<int32_t*>(l.z2);
        return x;
      };
      const stats eager = time_launches([&](int i) { CHECK_OK(fused_moe_launch(args_for(i), work, nullptr)); });
      // CUDA graph of 2 * sets calls (every routing on both layers), replayed.
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < 2 * sets; ++i)
        CHECK_OK(fused_moe_launch(args_for(i), work, stream));
      CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      const stats replay = time_launches([&](int) { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }, stream, false);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaGraphExecDestroy(exec));
      CHECK_CUDA(cudaGraphDestroy(graph));
      const double graph_us = replay.median_us / (2 * sets);
      const double bytes = touched * expert_bytes + T * H * 4.0;
      const char* path_name = path == 1 ? "gemv" : path == -1 ? "tiled" : "auto";
      out.rows.push_back({std::to_string(T), path_name, fmt("%.1f", touched), fmt("%.1f", bytes / 1e6), fmt("%.2f", eager.median_us),
                          fmt("%.1f", eager.p10_us) + " / " + fmt("%.1f", eager.p90_us), fmt("%.2f", graph_us),
                          fmt("%.2f", bytes / (eager.median_us * 1e-6) / 1e12),
                          fmt("%.0f%%", 100.0 * bytes / (eager.median_us * 1e-6) / copy_bw),
                          fmt("%.2f", bytes / (graph_us * 1e-6) / 1e12),
                          fmt("%.0f%%", 100.0 * bytes / (graph_us * 1e-6) / copy_bw)});
      std::printf("moe T=%ld %s: %.1f experts, %.1f MB, eager %.2f us (p10 %.2f p90 %.2f), graph %.2f us/call, %.2f / %.2f TB/s\n",
                  static_cast<long>(T), path_name, touched, bytes / 1e6, eager.median_us, eager.p10_us, eager.p90_us, graph_us,
                  bytes / (eager.median_us * 1e-6) / 1e12, bytes / (graph_us * 1e-6) / 1e12);
      std::fflush(stdout);
    }
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  for (auto& l : L)
    for (void* p : {l.w13, l.s13, l.z13, l.w2, l.s2, l.z2})
      CHECK_CUDA(cudaFree(p));
  for (auto p : logits)
    CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(y));
  CHECK_CUDA(cudaFree(work));
}

// ---- 4. quantize + pack + repack ---------------------------------------------------------------------------

void bench_quantize(const int4_shape& s, int4_recipe recipe, double copy_bw, table& out) {
  const size_t count = static_cast<size_t>(s.batch * s.n * s.k);
  auto* w = static_cast<uint16_t*>(dalloc(count * 2));
  uniform(w, count, 9, -0.1f, 0.1f);
  auto* q = static_cast<int32_t*>(dalloc(serving_weight_words(s) * 4));
  auto* sc = static_cast<uint16_t*>(dalloc(serving_scale_count(s) * 2));
  auto* zp = static_cast<int32_t*>(dalloc(serving_zero_point_words(s) * 4));
  auto* flag = static_cast<uint64_t*>(dalloc(8));
  int4_quant_serving_args a{s, recipe, w, q, sc, recipe == int4_recipe::asym ? zp : nullptr, flag};
  const int saved = g_iters;
  g_iters = std::min(g_iters, 30);
  const stats st = time_launches([&](int) { CHECK_OK(int4_quantize_serving_launch(a, nullptr)); });
  g_iters = saved;
  const double in_tbs = count * 2.0 / (st.median_us * 1e-6) / 1e12;
  const double traffic = count * 2.0 + serving_weight_words(s) * 4.0 + serving_scale_count(s) * 2.0 +
                         (recipe == int4_recipe::asym ? serving_zero_point_words(s) * 4.0 : 0.0);
  out.rows.push_back({std::to_string(s.batch) + " x " + std::to_string(s.n) + " x " + std::to_string(s.k),
                      std::string(to_string(recipe)) + " g" + std::to_string(s.group_size), fmt("%.1f", st.median_us),
                      fmt("%.2f", in_tbs), fmt("%.2f", traffic / (st.median_us * 1e-6) / 1e12),
                      fmt("%.0f%%", 100.0 * traffic / (st.median_us * 1e-6) / copy_bw)});
  std::printf("quantize %s: %.1f us, %.2f TB/s of bf16 input\n", out.rows.back()[0].c_str(), st.median_us, in_tbs);
  for (void* p : {static_cast<void*>(w), static_cast<void*>(q), static_cast<void*>(sc), static_cast<void*>(zp),
                  static_cast<void*>(flag)})
    CHECK_CUDA(cudaFree(p));
}

// ---- 5. XXH3-64 checksums ------------------------------------------------------------------------------------

// Hashes `lengths` buffers (each starting on a 256-byte boundary of one arena) with one
// xxh3_batch_launch, against a device-to-device copy of the whole arena (the same bytes read,
// and as many written).
void bench_xxh3(const std::string& what, const std::vector<uint64_t>& lengths, table& out) {
  std::vector<const std::byte*> pointers(lengths.size());
  uint64_t total = 0, hashed = 0;
  for (uint64_t n : lengths) {
    total += (n + 255) / 256 * 256;
    hashed += n;
  }
  auto* arena = static_cast<std::byte*>(dalloc(total));
  auto* copy = dalloc(total);
  bits(arena, total, 17);
  for (size_t t = 0, at = 0; t < lengths.size(); at += (lengths[t] + 255) / 256 * 256, ++t)
    pointers[t] = arena + at;
  auto* d_pointers = static_cast<const std::byte**>(dalloc(lengths.size() * sizeof(void*)));
  auto* d_lengths = static_cast<uint64_t*>(dalloc(lengths.size() * 8));
  auto* d_digests = static_cast<uint64_t*>(dalloc(lengths.size() * 8));
  CHECK_CUDA(cudaMemcpy(d_pointers, pointers.data(), lengths.size() * sizeof(void*), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_lengths, lengths.data(), lengths.size() * 8, cudaMemcpyHostToDevice));
  const xxh3_batch_args a{d_pointers, d_lengths, d_digests, static_cast<int64_t>(lengths.size())};
  const int saved = g_iters;
  g_iters = std::min(g_iters, 20);
  const stats hash = time_launches([&](int) { CHECK_OK(xxh3_batch_launch(a, nullptr)); });
  const stats cp = time_launches([&](int) { CHECK_CUDA(cudaMemcpyAsync(copy, arena, total, cudaMemcpyDeviceToDevice)); });
  g_iters = saved;
  const double hash_tbs = hashed / (hash.median_us * 1e-6) / 1e12;
  out.rows.push_back({what, std::to_string(lengths.size()), fmt("%.2f", hashed / 1e9), fmt("%.2f", hash.median_us / 1e3),
                      fmt("%.2f", hash_tbs), fmt("%.2f", cp.median_us / 1e3),
                      fmt("%.2f", 2.0 * total / (cp.median_us * 1e-6) / 1e12),
                      fmt("%.2f", hash.median_us / cp.median_us)});
  std::printf("xxh3 %s: %.2f ms for %.2f GB (%.2f TB/s); copy %.2f ms\n", what.c_str(), hash.median_us / 1e3,
              hashed / 1e9, hash_tbs, cp.median_us / 1e3);
  for (void* p : {static_cast<void*>(arena), copy, static_cast<void*>(d_pointers), static_cast<void*>(d_lengths),
                  static_cast<void*>(d_digests)})
    CHECK_CUDA(cudaFree(p));
}

} // namespace

int main(int argc, char** argv) {
  std::string md, only;
  bool quick = false;
  std::vector<int64_t> ms_opt, ts_opt;
  std::vector<int> ctas;
  auto list = [](const char* s) {
    std::vector<int64_t> v;
    for (const char* p = s; *p;) {
      v.push_back(std::atoll(p));
      while (*p && *p != ',')
        ++p;
      if (*p == ',')
        ++p;
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--md") && i + 1 < argc)
      md = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      g_iters = std::max(20, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--profile"))
      g_profile = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc)
      ms_opt = list(argv[++i]);
    else if (!std::strcmp(argv[i], "--ts") && i + 1 < argc)
      ts_opt = list(argv[++i]);
    else if (!std::strcmp(argv[i], "--ctas") && i + 1 < argc)
      for (int64_t c : list(argv[++i]))
        ctas.push_back(static_cast<int>(c));
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int l2 = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const size_t rotate = std::max<size_t>(256u << 20, 4 * static_cast<size_t>(l2));
  std::printf("device: %s, %d SMs, L2 %d MB; weights rotate over >= %zu MB; %d timed runs\n", prop.name,
              prop.multiProcessorCount, l2 >> 20, rotate >> 20, g_iters);

  const double copy_bw = copy_bandwidth(size_t{1} << 30);
  (void)quick;
  std::printf("device-to-device copy: %.2f TB/s (read + write)\n", copy_bw / 1e12);

  table g{"W4A16 GEMM (asym g128) vs cuBLAS BF16, C[m, n] = A[m, k] W^T; times in us (median of per-launch "
          "events; b2b = back-to-back average)",
          {"k x n", "m", "w4a16", "p10 / p90", "w4a16 b2b", "TB/s", "% copy", "TFLOP/s", "cuBLAS", "cuBLAS b2b",
           "speed-up"}};
  const std::vector<int64_t> ms = !ms_opt.empty() ? ms_opt
                                 : quick          ? std::vector<int64_t>{1, 16}
                                                  : std::vector<int64_t>{1, 4, 16, 32, 64, 128};
  if (only.empty() || only == "gemm") {
    bench_gemm(4096, 14336, ms, rotate, copy_bw, g, ctas);
    if (only.empty())
      bench_gemm(8192, 8192, ms, rotate, copy_bw, g);
  }

  table v{"BF16 GEMV (gemv_bf16_launch) vs cuBLAS at decode sizes, Qwen3-30B-A3B layers; times in us (median of "
          "per-launch events, b2b = back-to-back average; TB/s from b2b)",
          {"layer", "n x k", "m", "gemv", "gemv b2b", "TB/s", "% copy", "cuBLAS", "cuBLAS b2b", "TB/s", "speed-up (b2b)"}};
  if (only.empty() || only == "gemv") {
    const std::vector<int64_t> vms = !ms_opt.empty() ? ms_opt : std::vector<int64_t>{1, 4, 8};
    bench_gemv(5120, 2048, false, "qkv_proj", vms, rotate, copy_bw, v);
    bench_gemv(2048, 4096, false, "o_proj", vms, rotate, copy_bw, v);
    bench_gemv(128, 2048, true, "router", vms, rotate, copy_bw, v);
    bench_gemv(151936, 2048, true, "lm_head", vms, rotate, copy_bw, v);
  }

  table m{"Fused MoE, Qwen3-30B-A3B shapes (E 128, H 2048, I 768, top-8, asym g128): bytes = experts touched "
          "(weights + scales + zero points) + x and out; times in us",
          {"T", "path", "experts touched", "MB", "eager", "p10 / p90", "graph / call", "TB/s eager", "% copy", "TB/s graph",
           "% copy (graph)"}};
  if (only.empty() || only == "moe")
    bench_moe(!ts_opt.empty() ? ts_opt : quick ? std::vector<int64_t>{1, 64} : std::vector<int64_t>{1, 4, 16, 64, 256},
              copy_bw, m);

  table q{"Quantize + pack + repack to the serving layout (int4_quantize_serving_launch); times in us",
          {"shape (E x n x k)", "recipe", "time", "TB/s bf16 in", "TB/s traffic", "% copy"}};
  if (only.empty() || only == "quant") {
    bench_quantize({1, 14336, 4096, 128}, int4_recipe::asym, copy_bw, q);
    bench_quantize({128, 1536, 2048, 128}, int4_recipe::asym, copy_bw, q);
    bench_quantize({1, 14336, 4096, 128}, int4_recipe::sym, copy_bw, q);
  }

  table h{"XXH3-64 checksums (xxh3_batch_launch, one warp per buffer) vs a device-to-device copy of the same "
          "arena; times in ms",
          {"buffers", "count", "GB hashed", "xxh3", "TB/s", "copy", "copy TB/s (read + write)", "xxh3 / copy"}};
  if (only.empty() || only == "xxh3") {
    // Expert-sized tensors (a Qwen3-30B-A3B INT4 checkpoint has ~55,000 tensors, most of them
    // experts' packed weights of a few hundred KB).
    const size_t count = quick ? 12000 : 50000;
    std::vector<uint64_t> experts(count);
    for (size_t t = 0; t < count; ++t)
      experts[t] = 250000 + mix(t) % 100000;
    bench_xxh3("250-350 KB", experts, h);
    // One buffer is one warp: the time of a lone embedding-sized tensor.
    bench_xxh3("one of 622 MB", {151936ull * 2048 * 2}, h);
    // Both: the two 622 MB tensors of that model (embedding, lm_head) with the experts.
    std::vector<uint64_t> model = experts;
    model.push_back(151936ull * 2048 * 2);
    model.push_back(151936ull * 2048 * 2);
    bench_xxh3("both, big ones last", model, h);
    // Longest first, as xxh3_device_digests orders them: the long warps start at once.
    std::sort(model.begin(), model.end(), [](uint64_t x, uint64_t y) { return x > y; });
    bench_xxh3("both, longest first", model, h);
  }

  std::ostringstream all;
  all << "device: " << prop.name << ", " << prop.multiProcessorCount << " SMs, L2 " << (l2 >> 20)
      << " MB; device-to-device copy " << fmt("%.2f", copy_bw / 1e12) << " TB/s (read + write, 1 GiB)\n"
      << g.markdown() << v.markdown() << m.markdown() << q.markdown() << h.markdown();
  std::printf("%s", all.str().c_str());
  if (!md.empty())
    std::ofstream(md) << all.str();
  return 0;
}
