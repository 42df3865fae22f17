// CUDA twins of kernels/cpu/int4_quant.cpp: BF16 -> compressed-tensors load format, and BF16 ->
// serving layout in one pass (quantize + pack + repack, no intermediate in global memory). Both
// use the arithmetic of kernels/int4_quant.hpp (__fdiv_rn, rintf, exact min/max), so every code,
// scale and zero point is bit-identical with the CPU reference; tests/kernels/
// int4_quant_gpu_test.cu holds them together.
//
// Work decomposition (one kernel template for both outputs): a CTA of 256 threads owns 64 output
// rows n (one serving tile width) x one quantization group g of one matrix b.
//   0. (G = 32, 64, 128) the 64 x G bf16 block is staged in shared memory with 16-byte loads, all
//      issued before use; per-channel groups (G = k) are read from global memory instead;
//   1. statistics (exact max/min, any order): staged = 4 threads per row + 2 xor-shuffle steps, so
//      the 64 rows' parameters are computed in parallel; per-channel = one warp per row over k.
//      Any NaN/Inf lowers *nonfinite to its flat index (atomicMin: the least index wins, as on
//      the CPU, which scans in flat order);
//   2. scales and zero points of the 64 rows (serving: in permuted order, whole zero-point words);
//   3. codes: load format = one thread per int32 word of 8 consecutive k; serving = one thread per
//      tile word, gathering its 8 codes through the in-tile map; a warp stores 512 contiguous
//      bytes of a tile.
// What bounds it is instruction issue (an IEEE division per weight, the per-element gather), not
// memory: it runs well under the copy ceiling (docs/performance.md, 'INT4 quantize by group
// size').
// Every variant must stay bit-identical to the CPU twin (tests/kernels/int4_quant_gpu_test.cu).
#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/int4_quant.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_threads = 256;            // 8 warps
constexpr int k_rows = k_serving_tile_n;  // output rows per CTA (64 = one serving tile width)
constexpr unsigned k_full_mask = 0xffffffffu;

struct quant_outputs {
  // load format
  int32_t* weight_packed;     // [batch, n, k/8]
  uint16_t* weight_scale;     // [batch, n, k/G]
  int32_t* weight_zero_point; // asym: standard [batch, n/8, k/G] | miles [batch, k/G, n/8]
  zero_point_layout zp_layout;
  // serving layout
  int32_t* serving_weight;     // [batch, k/16, 2n]
  uint16_t* serving_scale;     // [batch, k/G, n]
  int32_t* serving_zero_point; // asym: [batch, k/G, n/8]
};

// Eight consecutive bf16 words; one 16-byte load when the address allows it.
__device__ inline void load8(const uint16_t* p, bool aligned16, uint16_t (&v)[8]) {
  if (aligned16) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    v[0] = u.x & 0xffffu, v[1] = u.x >> 16, v[2] = u.y & 0xffffu, v[3] = u.y >> 16;
    v[4] = u.z & 0xffffu, v[5] = u.z >> 16, v[6] = u.w & 0xffffu, v[7] = u.w >> 16;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      v[e] = p[e];
  }
}

// rint(x / scale) with the IEEE quotient (__fdiv_rn) of the CPU twin, mostly without dividing:
// y = x * (1 / scale) (both rounded to nearest) is within |y| 2^-22.4 of the exact quotient, and
// the rounded quotient is within |y| 2^-24 of it, so unless a half-integer lies within |y| 2^-20
// of y, both round to the same integer and rint(y) is the answer. Near a half-integer (rare:
// ties are where the exact division matters) it divides. Inf / NaN y take the fast path and
// give the same clamped code as the division would (int4_code_of_rounded clamps both).
__device__ __forceinline__ float int4_rounded_quotient(float x, float scale, float inv_scale) {
  const float y = x * inv_scale;
  const float r = rintf(y);
  const float frac = fabsf(y - r); // exact: y and r are within a factor 2 (or r = 0)
  if (fabsf(frac - 0.5f) <= fabsf(y) * 0x1p-20f)
    return rintf(__fdiv_rn(x, scale));
  return r;
}

// Staged path: the CTA's 64 rows x G inputs (G <= 128) are copied to shared memory with 16-byte
// loads, all issued before any is used (up to 16 KB in flight per CTA, several CTAs per SM), and
// every later read comes from there. Rows are padded by 8 halves (16 B): the uint4 stores stay
// aligned and consecutive rows start 4 banks apart.
constexpr int k_stage_max_group = 128;
constexpr int k_stage_stride = k_stage_max_group + 8; // halves per shared-memory row

template <bool Serving, // false: compressed-tensors load format; true: serving tiles
          bool Staged>  // true: group staged in shared memory (G <= 128, G % 32 == 0);
                        // false: per-channel groups, read from global memory
__global__ void __launch_bounds__(k_threads)
int4_quant_kernel(int4_recipe recipe,
                  const uint16_t* __restrict__ w, // bf16 bits [batch, n, k]
                  int64_t n, int64_t k,
                  int64_t glen,   // group length along k (k for per-channel)
                  int64_t groups, // k / glen
                  bool aligned16, // w is 16-byte aligned (rows are: k % 8 == 0)
                  quant_outputs out,
                  unsigned long long* nonfinite) { // [1] least flat index of a NaN/Inf
  const int64_t nb = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = threadIdx.x;
  const bool asym = recipe == int4_recipe::asym;
  const int64_t rows_here = n - nb * k_rows < k_rows ? n - nb * k_rows : k_rows;
  const int64_t row0 = b * n + nb * k_rows; // global row of local row 0
  __shared__ float sh_scale[k_rows];
  __shared__ int32_t sh_zero[k_rows];
  __shared__ __align__(16) uint16_t tile[Staged ? k_rows : 1][Staged ? k_stage_stride : 8];

  // bf16 bits of local row r, group-local column c.
  auto at = [&](int64_t r, int64_t c) -> uint16_t {
    if constexpr (Staged)
      return tile[r][c];
    else
      return w[(row0 + r) * k + g * glen + c];
  };

  // 0. stage the group (16-byte loads when aligned).
  if constexpr (Staged) {
    const int chunks = static_cast<int>(glen / 8);
    for (int idx = t; idx < rows_here * chunks; idx += k_threads) {
      const int r = idx / chunks, c = idx % chunks;
      const uint16_t* src = w + (row0 + r) * k + g * glen + 8 * c;
      if (aligned16) {
        *reinterpret_cast<uint4*>(&tile[r][8 * c]) = *reinterpret_cast<const uint4*>(src);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          tile[r][8 * c + e] = src[e];
      }
    }
    __syncthreads();
  }

  // 1. group statistics. Staged: 4 threads per row (G/4 <= 32 inputs each, read as 16-byte
  // shared-memory vectors), 2 xor-shuffle steps, and every row's parameters computed in parallel.
  // Per-channel: one warp per row over all of k.
  if constexpr (Staged) {
    constexpr int k_parts = k_threads / k_rows; // 4 threads per row
    static_assert(k_parts == 4, "the quad reduction below assumes 4 threads per row");
    const int r = t / k_parts, part = t % k_parts;
    const int per = static_cast<int>(glen / k_parts); // 8, 16 or 32: whole 16-byte vectors
    int4_group_stats st;
    if (r < rows_here) {
      for (int c = part * per; c < (part + 1) * per; c += 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(&tile[r][c]);
        const uint32_t pairs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const uint16_t bits = static_cast<uint16_t>(pairs[e / 2] >> (16 * (e % 2)));
          if (!int4_bf16_is_finite(bits))
            atomicMin(nonfinite, static_cast<unsigned long long>((row0 + r) * k + g * glen + c + e));
          int4_stats_add(st, int4_bf16_to_float(bits));
        }
      }
    }
#pragma unroll
    for (int offset = 1; offset < k_parts; offset *= 2) { // lanes 4q..4q+3 hold one row
      int4_group_stats o;
      o.amax = __shfl_xor_sync(k_full_mask, st.amax, offset);
      o.lo = __shfl_xor_sync(k_full_mask, st.lo, offset);
      o.hi = __shfl_xor_sync(k_full_mask, st.hi, offset);
      int4_stats_merge(st, o);
    }
    if (part == 0 && r < rows_here) {
      const int4_group_params p = int4_params(recipe, st);
      sh_scale[r] = p.scale;
      sh_zero[r] = p.zero;
    }
  } else {
    for (int r = warp; r < rows_here; r += k_threads / 32) {
      int4_group_stats st;
      for (int64_t i = lane; i < glen; i += 32) {
        const uint16_t bits = at(r, i);
        if (!int4_bf16_is_finite(bits))
          atomicMin(nonfinite, static_cast<unsigned long long>((row0 + r) * k + g * glen + i));
        int4_stats_add(st, int4_bf16_to_float(bits));
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        int4_group_stats o;
        o.amax = __shfl_xor_sync(k_full_mask, st.amax, offset);
        o.lo = __shfl_xor_sync(k_full_mask, st.lo, offset);
        o.hi = __shfl_xor_sync(k_full_mask, st.hi, offset);
        int4_stats_merge(st, o);
      }
      if (lane == 0) {
        const int4_group_params p = int4_params(recipe, st);
        sh_scale[r] = p.scale;
        sh_zero[r] = p.zero;
      }
    }
  }
  __syncthreads();

  // 2. scales and zero points.
  if constexpr (!Serving) {
    if (t < rows_here)
      out.weight_scale[(row0 + t) * groups + g] = int4_float_to_bf16(sh_scale[t]);
    if (asym && t < rows_here / 8) { // asym needs n % 8 == 0: words are whole
      const int64_t n8 = nb * (k_rows / 8) + t; // word column along n
      uint32_t word = 0;
      int64_t idx;
      if (out.zp_layout == zero_point_layout::standard) {
        for (int s = 0; s < 8; ++s)
          word = int4_put_nibble(word, s, static_cast<uint32_t>(sh_zero[8 * t + s]));
        idx = b * (n / 8) * groups + n8 * groups + g;
      } else {
        for (int s = 0; s < 8; ++s)
          word = int4_put_nibble(word, s, static_cast<uint32_t>(sh_zero[8 * t + int4_interleave(s)]));
        idx = b * (n / 8) * groups + g * (n / 8) + n8;
      }
      out.weight_zero_point[idx] = static_cast<int32_t>(word);
    }
  } else {
    const bool single = groups == 1;
    if (t < k_rows) { // n % 64 == 0 here: every CTA has 64 rows
      const int64_t p = nb * k_rows + t;
      const int64_t src = serving_scale_source(p, single) - nb * k_rows;
      out.serving_scale[(b * groups + g) * n + p] = int4_float_to_bf16(sh_scale[src]);
    }
    if (asym && t < k_rows / 8) {
      const int64_t m = nb * (k_rows / 8) + t;
      uint32_t word = 0;
      for (int s = 0; s < 8; ++s)
        word = int4_put_nibble(word, s, static_cast<uint32_t>(sh_zero[serving_zp_source(m, s) - nb * k_rows]));
      out.serving_zero_point[(b * groups + g) * (n / 8) + m] = static_cast<int32_t>(word);
    }
  }

  // 3. codes.
  if constexpr (!Serving) {
    const int wpr = static_cast<int>(glen / 8); // words per row in this group (< 2^28: k < 2^31)
    for (int64_t idx = t; idx < rows_here * wpr; idx += k_threads) {
      const int r = static_cast<int>(idx / wpr), j = static_cast<int>(idx % wpr);
      uint16_t v[8];
      if constexpr (Staged) {
        const uint4 u = *reinterpret_cast<const uint4*>(&tile[r][8 * j]);
        v[0] = u.x & 0xffffu, v[1] = u.x >> 16, v[2] = u.y & 0xffffu, v[3] = u.y >> 16;
        v[4] = u.z & 0xffffu, v[5] = u.z >> 16, v[6] = u.w & 0xffffu, v[7] = u.w >> 16;
      } else {
        load8(w + (row0 + r) * k + g * glen + 8 * j, aligned16, v);
      }
      const int4_group_params p{sh_scale[r], sh_zero[r]};
      uint32_t word = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        word |= int4_code(recipe, int4_bf16_to_float(v[e]), p) << (4 * e);
      out.weight_packed[(row0 + r) * (k / 8) + g * wpr + j] = static_cast<int32_t>(word);
    }
  } else if constexpr (Staged) {
    // Word idx = t + 256 i is word t % 128 of tile t / 128 + 2 i: a thread always assembles the
    // same word position, so its 8 sources (row, k in the tile), scales, reciprocals and zero
    // points are fixed; only the tile's k offset moves.
    static_assert(k_threads % k_serving_tile_words == 0, "a thread keeps one word position");
    const int tiles = static_cast<int>(glen / k_serving_tile_k);
    const int64_t kt0 = g * tiles;
    const int64_t n_tiles = n / k_serving_tile_n;
    int32_t* ob = out.serving_weight + b * (k * n / 8);
    const int tw = t % k_serving_tile_words;
    const uint16_t* src[8];
    float sc[8], inv[8];
    int32_t zr[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      int k_in = 0, r = 0;
      serving_tile_element(tw, e, &k_in, &r);
      src[e] = &tile[r][k_in];
      sc[e] = sh_scale[r];
      inv[e] = __frcp_rn(sc[e]);
      zr[e] = sh_zero[r];
    }
    for (int tl = t / k_serving_tile_words; tl < tiles; tl += k_threads / k_serving_tile_words) {
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x = int4_bf16_to_float(src[e][tl * k_serving_tile_k]);
        const uint32_t code =
          int4_code_of_rounded(recipe, int4_rounded_quotient(x, sc[e], inv[e]), int4_group_params{sc[e], zr[e]});
        packed |= code << (4 * int4_interleave_slot(e));
      }
      ob[((kt0 + tl) * n_tiles + nb) * k_serving_tile_words + tw] = static_cast<int32_t>(packed);
    }
  } else {
    const int64_t tiles = glen / k_serving_tile_k;
    const int64_t kt0 = g * tiles;
    const int64_t n_tiles = n / k_serving_tile_n;
    int32_t* ob = out.serving_weight + b * (k * n / 8);
    for (int64_t idx = t; idx < tiles * k_serving_tile_words; idx += k_threads) {
      const int64_t tl = idx / k_serving_tile_words; // tile within the group (a shift)
      const int tw = static_cast<int>(idx % k_serving_tile_words);
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        int k_in = 0, r = 0;
        serving_tile_element(tw, e, &k_in, &r); // r: local row = column of the 64-wide tile
        const int4_group_params p{sh_scale[r], sh_zero[r]};
        const uint32_t code = int4_code(recipe, int4_bf16_to_float(at(r, tl * 16 + k_in)), p);
        packed = int4_put_nibble(packed, int4_interleave_slot(e), code);
      }
      ob[((kt0 + tl) * n_tiles + nb) * k_serving_tile_words + tw] = static_cast<int32_t>(packed);
    }
  }
}

constexpr int64_t k_max_grid_yz = 65535;

kernel_status launch_quant(bool serving, int4_recipe recipe, const uint16_t* w, const int4_shape& s,
                           const quant_outputs& out, uint64_t* nonfinite, cudaStream_t stream) {
  const int64_t groups = int4_groups(s), glen = int4_group_len(s);
  const int64_t blocks_n = (s.n + k_rows - 1) / k_rows;
  if (groups > k_max_grid_yz || s.batch > k_max_grid_yz || blocks_n > 0x7fffffff)
    return kernel_status::not_supported;
  RLSERVE_CUDA_TRY(cudaMemsetAsync(nonfinite, 0xff, sizeof(uint64_t), stream));
  const dim3 grid(static_cast<unsigned>(blocks_n), static_cast<unsigned>(groups),
                  static_cast<unsigned>(s.batch));
  const bool aligned16 = reinterpret_cast<uintptr_t>(w) % 16 == 0;
  auto* flag = reinterpret_cast<unsigned long long*>(nonfinite);
  // Staged needs the group in shared memory (G <= 128) split into 4 runs of whole 16-byte vectors.
  const bool staged = glen <= k_stage_max_group && glen % 32 == 0;
  if (serving && staged)
    int4_quant_kernel<true, true><<<grid, k_threads, 0, stream>>>(recipe, w, s.n, s.k, glen, groups,
                                                                  aligned16, out, flag);
  else if (serving)
    int4_quant_kernel<true, false><<<grid, k_threads, 0, stream>>>(recipe, w, s.n, s.k, glen, groups,
                                                                   aligned16, out, flag);
  else if (staged)
    int4_quant_kernel<false, true><<<grid, k_threads, 0, stream>>>(recipe, w, s.n, s.k, glen, groups,
                                                                   aligned16, out, flag);
  else
    int4_quant_kernel<false, false><<<grid, k_threads, 0, stream>>>(recipe, w, s.n, s.k, glen, groups,
                                                                    aligned16, out, flag);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

// Sentence for a failed CUDA call in a host wrapper.
std::string cuda_problem(const char* what, cudaError_t e) {
  return std::string(what) + " failed: " + cudaGetErrorString(e);
}

// Runs a launch, waits, and turns the non-finite word into a message.
template <class Launch>
rlserve::status run_and_check(Launch launch, uint64_t* nonfinite, const uint16_t* w,
                              const int4_shape& shape, std::string_view name,
                              const std::string& what, cudaStream_t stream) {
  uint64_t* temp = nullptr;
  if (nonfinite == nullptr) {
    if (auto e = cudaMalloc(&temp, sizeof(uint64_t)); e != cudaSuccess)
      return rlserve::fail(int4_shape_message(name, what, cuda_problem("cudaMalloc", e)));
    nonfinite = temp;
  }
  auto finish = [&](rlserve::status st) {
    if (temp != nullptr)
      cudaFree(temp);
    return st;
  };
  if (auto st = launch(nonfinite); st != kernel_status::ok)
    return finish(rlserve::fail(int4_shape_message(name, what, std::string(to_string(st)))));
  uint64_t index = k_int4_all_finite;
  if (auto e = cudaMemcpyAsync(&index, nonfinite, sizeof index, cudaMemcpyDeviceToHost, stream);
      e != cudaSuccess)
    return finish(rlserve::fail(int4_shape_message(name, what, cuda_problem("cudaMemcpyAsync", e))));
  if (auto e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return finish(rlserve::fail(int4_shape_message(name, what, cuda_problem("cudaStreamSynchronize", e))));
  if (index != k_int4_all_finite) {
    uint16_t bits = 0x7fc0;
    cudaMemcpy(&bits, w + index, sizeof bits, cudaMemcpyDeviceToHost);
    return finish(rlserve::fail(int4_nonfinite_message(name, shape, index, bits)));
  }
  return finish({});
}

} // namespace

kernel_status int4_quantize_launch(const int4_quant_args& a, cudaStream_t stream) {
  if (auto st = int4_quant_can_implement(a); st != kernel_status::ok)
    return st;
  quant_outputs out{a.weight_packed, a.weight_scale, a.weight_zero_point, a.zp_layout,
                    nullptr,         nullptr,        nullptr};
  return launch_quant(false, a.recipe, a.w, a.shape, out, a.nonfinite, stream);
}

kernel_status int4_quantize_serving_launch(const int4_quant_serving_args& a, cudaStream_t stream) {
  if (auto st = int4_quant_serving_can_implement(a); st != kernel_status::ok)
    return st;
  quant_outputs out{nullptr,          nullptr,         nullptr,
                    zero_point_layout::standard,
                    a.serving_weight, a.serving_scale, a.serving_zero_point};
  return launch_quant(true, a.recipe, a.w, a.shape, out, a.nonfinite, stream);
}

rlserve::status int4_quantize_device(int4_quant_args a, std::string_view name, cudaStream_t stream) {
  const std::string what = std::string(to_string(a.recipe)) + " quantization";
  int4_quant_args probe = a;
  uint64_t dummy = 0;
  if (probe.nonfinite == nullptr)
    probe.nonfinite = &dummy; // checked for presence only; the launch gets a device word
  if (auto m = int4_quant_problem(probe); !m.empty())
    return rlserve::fail(int4_shape_message(name, what, m));
  return run_and_check(
    [&](uint64_t* flag) {
      a.nonfinite = flag;
      return int4_quantize_launch(a, stream);
    },
    a.nonfinite, a.w, a.shape, name, what, stream);
}

rlserve::status int4_quantize_serving_device(int4_quant_serving_args a, std::string_view name,
                                             cudaStream_t stream) {
  const std::string what = std::string(to_string(a.recipe)) + " quantization";
  int4_quant_serving_args probe = a;
  uint64_t dummy = 0;
  if (probe.nonfinite == nullptr)
    probe.nonfinite = &dummy;
  if (auto m = int4_quant_serving_problem(probe); !m.empty())
    return rlserve::fail(int4_shape_message(name, what, m));
  return run_and_check(
    [&](uint64_t* flag) {
      a.nonfinite = flag;
      return int4_quantize_serving_launch(a, stream);
    },
    a.nonfinite, a.w, a.shape, name, what, stream);
}

} // namespace rlserve::kernels
