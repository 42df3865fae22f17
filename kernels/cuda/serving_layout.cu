// CUDA twins of kernels/cpu/serving_layout.cpp: repack (load format -> serving tiles) and restore
// (serving tiles -> load format). Pure permutations of nibbles and 16-bit words: every output
// word is assembled by one thread, so no output needs zeroing and no atomics are involved.
// Weights go through shared memory in blocks of 64 columns x 128 k (8 tiles); repack gathers
// through the FORWARD in-tile map (serving word -> (k, n)), restore through the INVERSE one
// ((k, n) -> serving word), while the CPU twins scatter through the forward maps:
// tests/kernels/serving_layout_gpu_test.cu comparing the bytes therefore also checks the two maps
// against each other.
#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/int4_quant.hpp"
#include "kernels/serving_layout.hpp"

namespace rlserve::kernels {

namespace {

constexpr int k_threads = 256;
constexpr int64_t k_max_blocks = int64_t{1} << 20; // grid-stride beyond this

unsigned blocks_for(int64_t items) {
  int64_t blocks = (items + k_threads - 1) / k_threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > k_max_blocks ? k_max_blocks : blocks));
}

// Grid of the weight kernels: (n/64 column blocks, k/128 row blocks, batch).
dim3 weight_grid(const int4_shape& s) {
  return dim3(static_cast<unsigned>(s.n / k_serving_tile_n), static_cast<unsigned>((s.k + 127) / 128),
              static_cast<unsigned>(s.batch));
}
bool grid_fits(const int4_shape& s) {
  return s.n / k_serving_tile_n <= 0x7fffffff && (s.k + 127) / 128 <= 65535 && s.batch <= 65535;
}

// Load-format zero point (n, g) of matrix b: word index in the batch and slot.
__device__ inline int64_t ct_zp_index(zero_point_layout layout, int64_t b, int64_t n, int64_t g,
                                      int64_t n_total, int64_t groups, int* slot) {
  const int64_t w = layout == zero_point_layout::standard ? ct_zp_standard_word(n, g, groups, slot)
                                                          : ct_zp_miles_word(n, g, n_total, slot);
  return b * (n_total / 8) * groups + w;
}

// ---- repack ---------------------------------------------------------------------------------------

// Weights move through shared memory one block of 64 columns x up to 128 k (8 tiles) at a time:
// the CTA reads the block's load-format words row by row (64-byte runs), then writes the 8 tiles
// as whole 512-byte runs. Each thread computes its tile coordinates with shifts only.
constexpr int k_block_k = 128;                   // k per CTA (8 tiles)
constexpr int k_block_words = k_block_k / 8;     // load-format words per row in a block
constexpr int k_ct_stride = k_block_words + 1;   // padded row of the staged load-format words

__global__ void __launch_bounds__(k_threads)
repack_weight_kernel(const int32_t* __restrict__ packed, // [batch, n, k/8]
                     int32_t* __restrict__ out,          // [batch, k/16, 2n]
                     int64_t n, int64_t k) {
  const int64_t nb = blockIdx.x, kb = blockIdx.y, b = blockIdx.z;
  const int kblock = static_cast<int>(k - kb * k_block_k < k_block_k ? k - kb * k_block_k : k_block_k);
  const int kwb = kblock / 8, tiles = kblock / 16;
  __shared__ uint32_t sh[k_serving_tile_n * k_ct_stride];
  const int32_t* src = packed + (b * n + nb * k_serving_tile_n) * (k / 8) + kb * k_block_words;
  for (int idx = threadIdx.x; idx < k_serving_tile_n * kwb; idx += k_threads) {
    const int r = idx / kwb, j = idx % kwb;
    sh[r * k_ct_stride + j] = static_cast<uint32_t>(src[r * (k / 8) + j]);
  }
  __syncthreads();
  const int64_t n_tiles = n / k_serving_tile_n, kt0 = kb * (k_block_k / k_serving_tile_k);
  int32_t* dst = out + b * (k * n / 8);
  for (int idx = threadIdx.x; idx < tiles * k_serving_tile_words; idx += k_threads) {
    const int tl = idx >> 7, tw = idx & 127;
    uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      int k_in = 0, n_in = 0;
      serving_tile_element(tw, e, &k_in, &n_in);
      const int kk = tl * 16 + k_in;
      word = int4_put_nibble(word, int4_interleave_slot(e), int4_get_nibble(sh[n_in * k_ct_stride + kk / 8], kk % 8));
    }
    dst[((kt0 + tl) * n_tiles + nb) * k_serving_tile_words + tw] = static_cast<int32_t>(word);
  }
}

__global__ void repack_scale_kernel(const uint16_t* __restrict__ scale, // [batch, n, groups]
                                    uint16_t* __restrict__ out,         // [batch, groups, n]
                                    int64_t batch, int64_t n, int64_t groups) {
  const int64_t total = batch * groups * n;
  const bool single = groups == 1;
  for (int64_t i = blockIdx.x * int64_t{k_threads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * k_threads) {
    const int64_t p = i % n, g = (i / n) % groups, b = i / (n * groups);
    out[i] = scale[(b * n + serving_scale_source(p, single)) * groups + g];
  }
}

__global__ void repack_zp_kernel(const int32_t* __restrict__ zp, // load layout
                                 int32_t* __restrict__ out,      // [batch, groups, n/8]
                                 zero_point_layout layout, int64_t batch, int64_t n, int64_t groups) {
  const int64_t n8 = n / 8, total = batch * groups * n8;
  for (int64_t i = blockIdx.x * int64_t{k_threads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * k_threads) {
    const int64_t m = i % n8, g = (i / n8) % groups, b = i / (n8 * groups);
    uint32_t word = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      int src_slot = 0;
      const int64_t src = ct_zp_index(layout, b, serving_zp_source(m, s), g, n, groups, &src_slot);
      word = int4_put_nibble(word, s, int4_get_nibble(static_cast<uint32_t>(zp[src]), src_slot));
    }
    out[i] = static_cast<int32_t>(word);
  }
}

// ---- restore --------------------------------------------------------------------------------------

// The inverse, through the same staging: read up to 8 whole tiles (512-byte runs), then write
// each of the 64 rows' load-format words (64-byte runs), gathering nibbles with the in-tile
// inverse map.
__global__ void __launch_bounds__(k_threads)
restore_weight_kernel(const int32_t* __restrict__ serving, // [batch, k/16, 2n]
                      int32_t* __restrict__ packed,        // [batch, n, k/8]
                      int64_t n, int64_t k) {
  const int64_t nb = blockIdx.x, kb = blockIdx.y, b = blockIdx.z;
  const int kblock = static_cast<int>(k - kb * k_block_k < k_block_k ? k - kb * k_block_k : k_block_k);
  const int kwb = kblock / 8, tiles = kblock / 16;
  __shared__ uint32_t sh[(k_block_k / k_serving_tile_k) * k_serving_tile_words];
  const int64_t n_tiles = n / k_serving_tile_n, kt0 = kb * (k_block_k / k_serving_tile_k);
  const int32_t* src = serving + b * (k * n / 8);
  for (int idx = threadIdx.x; idx < tiles * k_serving_tile_words; idx += k_threads) {
    const int tl = idx >> 7, tw = idx & 127;
    sh[idx] = static_cast<uint32_t>(src[((kt0 + tl) * n_tiles + nb) * k_serving_tile_words + tw]);
  }
  __syncthreads();
  int32_t* dst = packed + (b * n + nb * k_serving_tile_n) * (k / 8) + kb * k_block_words;
  for (int idx = threadIdx.x; idx < k_serving_tile_n * kwb; idx += k_threads) {
    const int r = idx / kwb, j = idx % kwb;
    uint32_t word = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const int kk = 8 * j + s;
      int slot = 0;
      const int t = serving_tile_word(kk % 16, r, &slot);
      word = int4_put_nibble(word, s, int4_get_nibble(sh[(kk / 16) * k_serving_tile_words + t], slot));
    }
    dst[r * (k / 8) + j] = static_cast<int32_t>(word);
  }
}

__global__ void restore_scale_kernel(const uint16_t* __restrict__ serving, // [batch, groups, n]
                                     uint16_t* __restrict__ scale,         // [batch, n, groups]
                                     int64_t batch, int64_t n, int64_t groups) {
  const int64_t total = batch * n * groups;
  const bool single = groups == 1;
  for (int64_t i = blockIdx.x * int64_t{k_threads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * k_threads) {
    const int64_t g = i % groups, nn = (i / groups) % n, b = i / (groups * n);
    scale[i] = serving[(b * groups + g) * n + serving_scale_position(nn, single)];
  }
}

__global__ void restore_zp_kernel(const int32_t* __restrict__ serving, // [batch, groups, n/8]
                                  int32_t* __restrict__ zp,            // load layout
                                  zero_point_layout layout, int64_t batch, int64_t n, int64_t groups) {
  const int64_t n8 = n / 8, total = batch * n8 * groups;
  for (int64_t i = blockIdx.x * int64_t{k_threads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * k_threads) {
    // Output word i: standard [n/8, groups] -> (r = row word, g); miles [groups, n/8] -> (g, r).
    const int64_t b = i / (n8 * groups), in_b = i % (n8 * groups);
    const bool standard = layout == zero_point_layout::standard;
    const int64_t r = standard ? in_b / groups : in_b % n8;
    const int64_t g = standard ? in_b % groups : in_b / n8;
    uint32_t word = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const int64_t col = 8 * r + (standard ? s : int4_interleave(s)); // column held by slot s
      int src_slot = 0;
      const int64_t src = serving_zp_word(col, &src_slot);
      word = int4_put_nibble(
        word, s,
        int4_get_nibble(static_cast<uint32_t>(serving[(b * groups + g) * n8 + src]), src_slot));
    }
    zp[i] = static_cast<int32_t>(word);
  }
}

// RLSERVE_CUDA_TRY has printed the failing call and consumed the error; name the status.
std::string launch_problem(kernel_status st) {
  return st == kernel_status::cuda_error ? "a CUDA call failed (the call is printed on stderr)"
                                         : std::string(to_string(st));
}

} // namespace

kernel_status serving_repack_launch(const serving_repack_args& a, cudaStream_t stream) {
  if (auto st = serving_repack_can_implement(a); st != kernel_status::ok)
    return st;
  const auto& s = a.shape;
  const int64_t groups = int4_groups(s);
  if (!grid_fits(s))
    return kernel_status::not_supported;
  repack_weight_kernel<<<weight_grid(s), k_threads, 0, stream>>>(a.weight_packed, a.serving_weight, s.n, s.k);
  RLSERVE_CUDA_CHECK_LAUNCH();
  repack_scale_kernel<<<blocks_for(serving_scale_count(s)), k_threads, 0, stream>>>(
    a.weight_scale, a.serving_scale, s.batch, s.n, groups);
  RLSERVE_CUDA_CHECK_LAUNCH();
  if (a.has_zero_point) {
    repack_zp_kernel<<<blocks_for(serving_zero_point_words(s)), k_threads, 0, stream>>>(
      a.weight_zero_point, a.serving_zero_point, a.zp_layout, s.batch, s.n, groups);
    RLSERVE_CUDA_CHECK_LAUNCH();
  }
  return kernel_status::ok;
}

kernel_status serving_restore_launch(const serving_restore_args& a, cudaStream_t stream) {
  if (auto st = serving_restore_can_implement(a); st != kernel_status::ok)
    return st;
  const auto& s = a.shape;
  const int64_t groups = int4_groups(s);
  if (!grid_fits(s))
    return kernel_status::not_supported;
  restore_weight_kernel<<<weight_grid(s), k_threads, 0, stream>>>(a.serving_weight, a.weight_packed, s.n, s.k);
  RLSERVE_CUDA_CHECK_LAUNCH();
  restore_scale_kernel<<<blocks_for(ct_scale_count(s)), k_threads, 0, stream>>>(
    a.serving_scale, a.weight_scale, s.batch, s.n, groups);
  RLSERVE_CUDA_CHECK_LAUNCH();
  if (a.has_zero_point) {
    restore_zp_kernel<<<blocks_for(ct_zero_point_words(s)), k_threads, 0, stream>>>(
      a.serving_zero_point, a.weight_zero_point, a.zp_layout, s.batch, s.n, groups);
    RLSERVE_CUDA_CHECK_LAUNCH();
  }
  return kernel_status::ok;
}

rlserve::status serving_repack_device(const serving_repack_args& a, std::string_view name,
                                      cudaStream_t stream) {
  if (auto m = serving_repack_problem(a); !m.empty())
    return rlserve::fail(int4_shape_message(name, "serving repack", m));
  if (auto st = serving_repack_launch(a, stream); st != kernel_status::ok)
    return rlserve::fail(int4_shape_message(name, "serving repack", launch_problem(st)));
  return {};
}

rlserve::status serving_restore_device(const serving_restore_args& a, std::string_view name,
                                       cudaStream_t stream) {
  if (auto m = serving_restore_problem(a); !m.empty())
    return rlserve::fail(int4_shape_message(name, "serving restore", m));
  if (auto st = serving_restore_launch(a, stream); st != kernel_status::ok)
    return rlserve::fail(int4_shape_message(name, "serving restore", launch_problem(st)));
  return {};
}

} // namespace rlserve::kernels
