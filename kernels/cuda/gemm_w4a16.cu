// CUDA W4A16 GEMM core (dense GEMM here, fused MoE in fused_moe.cu through gemm_w4a16_problem.cuh).
// This file reads top-down: the design, the kernel, the host side, the public dense API; the
// building blocks the kernel calls (named below) are in gemm_w4a16_device.cuh.
//
// Two orientations share everything but the inner loop (template parameter ROWS = rows per m
// block): ROWS = 8 / 16 run the swap-AB path (compute_stage_swap, described there: weights on the
// mma M dimension, tokens as 1 or 2 n8 tiles, scale and zero point applied once per group chunk);
// ROWS = 32 / 48 / 64 the Marlin orientation described next (MB = ROWS / 16 m16 blocks).
//
// Shape of the computation. Tokens are on the mma M dimension (16-row m blocks, 1..4 per CTA:
// MB), weights on N. A CTA of 8 warps owns an output tile of 16*MB rows x 256
// columns (four 64-column serving tiles, "sub-tiles") and walks its k range in stages of 128 k.
// One stage in shared memory holds
//   B  8 k16-rows x 4 sub-tiles of serving tiles (32 x 512 B = 16 KB, tile-contiguous in global
//      memory, so every lane copies whole 16-byte words),
//   A  16*MB rows x 128 k of bf16 activations, 16-byte chunks XOR-swizzled by row (ldmatrix and
//      cp.async both bank-conflict-free),
//   the scale rows (and zero-point words) of the groups the stage touches, for the 256 columns.
// Warp w takes sub-tile w % 4 and the 4 consecutive k16 rows 4 (w / 4) .. +3 of every stage (64 k:
// one scale group for G >= 64). Its 16-byte shared-memory read of one serving tile is exactly its
// B fragments for 8 mma (4 n16 blocks x 2 n8 halves, docs/formats.md §4), dequantized in registers:
//   lop3((w >> 4i) & 0x000f000f | 0x43004300)  -> bf16x2 (128 + q, 128 + q')   (exact)
//   fma(x, 1, -(128 + z))                      -> q - z                       (exact)
//   fma(x, scale, -0)                          -> bf16_rn((q - z) * scale)    (the one rounding)
// which is bit-identical to serving_dequant_ref (docs/formats.md §1), so the only difference
// from the CPU reference is the FP32 summation order. 17 instructions per 8 weights (4 LOP3,
// 3 SHF, 4 HADD2, 4 HMUL2, 2 HMMA at M <= 16): the same budget as vLLM's BF16 Marlin path.
//
// Partitioning: "units" are (tile, k stage) pairs, numbered tile-major with tile = n-tile *
// m_blocks + m_block (the m blocks sharing weights are neighbours). The persistent grid (SMs x
// CTAs/SM) gives CTA c the contiguous run [c*U/G, (c+1)*U/G): equal work for every SM at any m
// (Marlin's striped partition). A run covers the tail of one tile, whole tiles, and the head of
// another. Whole tiles are written directly; a tile whose k range is split writes an FP32
// partial per CTA, and the last CTA to arrive (atomic counter per tile, CUTLASS-style release /
// acquire by one thread) adds the partials in CTA order and writes the output. No CTA waits for
// another; the order is fixed, so the result is deterministic; the counter is reset by the last
// CTA, so the workspace is reusable.
//
// Pipeline: cp.async.cg 16-byte copies (L2 only; no L2 cache-policy hint: ptxas 13.0-13.3 can drop
// the createpolicy and trap, docs/performance.md, 'W4A16 GEMM design notes'), `stages` buffers,
// stages-1 units in flight, one __syncthreads per 16 KB stage. Each thread copies the same chunk
// positions in every stage, so its source pointers are set once per tile (set_tile): the swap-AB
// variants advance them by one stage per load (load_stage), the Marlin variants add the stage's k
// offset per copy (load_stage_marlin). The prefetch runs across tile boundaries, so a CTA's stream
// of weights does not stall at its split points.
//
// Programmatic dependent launch (the fused MoE): the kernel waits (griddepcontrol.wait) before it
// reads anything the previous kernel writes, optionally after prefetching its first weights into
// L2 (problem::prefetch_units), and lets the next kernel launch right after.
//
// Why the pipeline depth and the copies are what they are, and the measured numbers:
// docs/performance.md ('W4A16 GEMM design notes' and the dated W4A16 sections).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm_w4a16_device.cuh"
#include "kernels/cuda/gemm_w4a16_problem.cuh"
#include "kernels/gemm_w4a16.hpp"
#include "kernels/int4_format.hpp"

namespace rlserve::kernels::w4a16 {

namespace {

// ---- the kernel ------------------------------------------------------------------------------------

template <int ROWS>
__global__ void __launch_bounds__(k_threads, cfg<ROWS>::min_blocks)
w4a16_kernel(const problem p,
             int* __restrict__ counters,   // [tiles] zero between launches
             float* __restrict__ partials) // [grid, 2, ROWS, 256] FP32 split-K partial tiles
{
  using C = cfg<ROWS>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* red = reinterpret_cast<float*>(smem + C::red_off);
  int* flag = reinterpret_cast<int*>(smem + C::flag_off);

  // Programmatic dependent launch: without a prefetch everything below may read what the previous
  // kernel writes (num_padded, A), so wait first; with one, the m blocks and experts were written
  // before the previous kernel started (see problem::prefetch_units).
  if (p.prefetch_units == 0)
    grid_dep_wait();
  shape_info s;
  s.mblk_per_batch = p.moe ? 1 : (p.m + C::rows - 1) / C::rows;
  s.num_mblk = p.moe ? min(*p.num_padded / C::rows, p.max_m_blocks) : p.batch * s.mblk_per_batch;
  s.n64 = p.n / 64;
  s.n_tiles = p.ep == epilogue::silu_mul_bf16 ? (p.up_tile_offset + 1) / 2 : (s.n64 + k_sub - 1) / k_sub;
  s.ki = (p.k + k_stage_k - 1) / k_stage_k;
  s.units = s.n_tiles * s.num_mblk * s.ki;
  // Whole tiles: one tile per CTA (the host launches a CTA for every tile the workspace holds),
  // so run c is exactly tile c's k stages and the split-tile code below never runs.
  s.grid = min(static_cast<int32_t>(gridDim.x), p.whole_tiles ? s.n_tiles * s.num_mblk : s.units);
  s.glen_log2 = 31 - __clz(max(p.glen, 1));
  s.stage_groups = (p.groups > 1 && p.glen < k_stage_k) ? k_stage_k / p.glen : 1;
  s.k16 = p.k / 16;
  s.row_words = static_cast<int64_t>(s.n64) * k_serving_tile_words;
  s.k_tail = p.k % k_stage_k != 0;
  s.mul32 = static_cast<int64_t>(s.units) * s.grid < (int64_t{1} << 31);
  const int32_t cta = blockIdx.x;
  if (cta >= s.grid)
    return;
  const int32_t u0 = run_start(cta, s), u1 = run_start(cta + 1, s);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (RLSERVE_W4A16_PDL && p.prefetch_units > 0) {
    prefetch_run(p, s, u0, u1);
    grid_dep_wait();
  }
  grid_dep_launch();
  const int wn = warp % k_sub, kw = warp / k_sub;

  // Rows never valid in any tile (dense with one m block: rows >= m) stay zero from here on and
  // are never copied; everything else is copied or zero-filled per stage.
  const int a_rows_loaded = (!p.moe && s.mblk_per_batch == 1) ? p.m : C::rows;
  if (a_rows_loaded < C::rows) {
    for (int st = 0; st < C::stages; ++st)
      for (int idx = tid; idx < C::a_halves / 8; idx += k_threads)
        reinterpret_cast<uint4*>(smem + st * C::stage_bytes + C::a_off)[idx] = make_uint4(0, 0, 0, 0);
    __syncthreads();
  }

  cursor load_at = cursor_at(u0, s), comp_at = load_at;
  using ctx_t = std::conditional_t<C::swap, load_ctx<ROWS>, load_ctx_marlin<ROWS>>;
  ctx_t ctx;
  auto set_tile_ = [&](const cursor& cu) {
    if constexpr (C::swap)
      set_tile<ROWS>(p, s, cu, ctx);
    else
      set_tile_marlin<ROWS>(p, s, cu, ctx);
  };
  auto load_stage_ = [&](unsigned char* st, int32_t kk) {
    if constexpr (C::swap)
      load_stage<ROWS>(p, s, st, ctx, kk, a_rows_loaded);
    else
      load_stage_marlin<ROWS>(p, s, st, ctx, kk, a_rows_loaded);
  };
  set_tile_(load_at);
#pragma unroll 1
  for (int st = 0; st < C::stages - 1; ++st) {
    if (u0 + st < u1) {
      if (load_at.kk == 0 && st > 0)
        set_tile_(load_at);
      load_stage_(smem + st * C::stage_bytes, load_at.kk);
      advance(load_at, s);
    }
    cp_async_commit();
  }

  float acc[C::acc0][C::acc1][4];
#pragma unroll
  for (int m = 0; m < C::acc0; ++m)
#pragma unroll
    for (int t = 0; t < C::acc1; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[m][t][e] = 0.0f;

  int read_stage = 0, write_stage = C::stages - 1;
  int32_t seg_start = u0;
  for (int32_t u = u0; u < u1; ++u) {
    cp_async_wait<C::stages - 2>();
    __syncthreads();
    if (u + C::stages - 1 < u1) {
      if (load_at.kk == 0)
        set_tile_(load_at);
      load_stage_(smem + write_stage * C::stage_bytes, load_at.kk);
      advance(load_at, s);
    }
    cp_async_commit();
    write_stage = write_stage + 1 == C::stages ? 0 : write_stage + 1;

    if constexpr (C::swap)
      compute_stage_swap<ROWS>(p, s, smem + read_stage * C::stage_bytes, lane, wn, kw, acc);
    else
      compute_stage_marlin<ROWS>(p, s, smem + read_stage * C::stage_bytes, lane, wn, kw, acc);
    read_stage = read_stage + 1 == C::stages ? 0 : read_stage + 1;

    const cursor here = comp_at;
    advance(comp_at, s);
    if (u + 1 != u1 && here.kk + 1 != s.ki)
      continue;

    // ---- end of this CTA's segment of tile t ----
    const int32_t t = here.t;
    const int32_t nt = here.nt, mb = here.mb;

    // 1. The two warps of each sub-tile add their partial sums into `red` (kw 0 then kw 1).
    const int g = lane >> 2, q = lane & 3;
#pragma unroll 1
    for (int r = 0; r < k_kw; ++r) {
      if (kw == r) {
       if constexpr (C::swap) {
        // acc[j][t][e]: column wn*64 + 16j + g + 8(e/2), token 8t + 2q + (e%2).
#pragma unroll
        for (int j = 0; j < C::acc0; ++j)
#pragma unroll
          for (int tt = 0; tt < C::acc1; ++tt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float* d = red + (8 * tt + 2 * q + (e & 1)) * C::red_stride + wn * 64 + 16 * j + g + 8 * (e >> 1);
              *d = r == 0 ? acc[j][tt][e] : *d + acc[j][tt][e];
            }
       } else {
#pragma unroll
        for (int m = 0; m < C::acc0; ++m)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            float2* lo = reinterpret_cast<float2*>(red + (m * 16 + g) * C::red_stride + wn * 64 + j * 8 + 2 * q);
            float2* hi = lo + 4 * C::red_stride; // 8 rows further
            if (r == 0) {
              *lo = make_float2(acc[m][j][0], acc[m][j][1]);
              *hi = make_float2(acc[m][j][2], acc[m][j][3]);
            } else {
              const float2 a = *lo, b = *hi;
              *lo = make_float2(a.x + acc[m][j][0], a.y + acc[m][j][1]);
              *hi = make_float2(b.x + acc[m][j][2], b.y + acc[m][j][3]);
            }
          }
       }
      }
      __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < C::acc0; ++m)
#pragma unroll
      for (int j = 0; j < C::acc1; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[m][j][e] = 0.0f;

    // Rows with an output: dense a prefix of the block; moe ids are a prefix too (padding is
    // at the end of each expert's run).
    int nrows;
    if (p.moe)
      nrows = __syncthreads_count(tid < C::rows && p.sorted_ids[mb * C::rows + tid] < p.num_ids);
    else
      nrows = min(C::rows, p.m - (mb % s.mblk_per_batch) * C::rows);

    // 2. Split tile: publish the partial; the last CTA to arrive adds all of them in CTA order.
    const int32_t tile_u0 = t * s.ki;
    const bool whole = seg_start == tile_u0 && u + 1 == tile_u0 + s.ki;
    const int32_t this_start = seg_start;
    seg_start = u + 1;
    if (!whole) {
      const int slot = this_start == u0 ? 0 : 1;
      float* mine = partials + static_cast<int64_t>(cta * 2 + slot) * (C::rows * k_tile_n);
      for (int idx = tid; idx < nrows * (k_tile_n / 4); idx += k_threads) {
        const int r = idx / (k_tile_n / 4), c4 = idx % (k_tile_n / 4);
        __stcg(reinterpret_cast<float4*>(mine + r * k_tile_n + c4 * 4),
               *reinterpret_cast<const float4*>(red + r * C::red_stride + c4 * 4));
      }
      __syncthreads(); // all partial stores of the CTA precede thread 0's release below
      const int32_t c_first = cta_of_unit(tile_u0, s), c_last = cta_of_unit(tile_u0 + s.ki - 1, s);
      if (tid == 0) {
        fence_acq_rel_gpu(); // release this CTA's partial
        const int arrived = atomicAdd(counters + t, 1);
        const int last = arrived == c_last - c_first;
        if (last) {
          counters[t] = 0;     // every contributor has arrived: ready for the next launch
          fence_acq_rel_gpu(); // acquire the others' partials for the whole CTA (bar.sync below)
        }
        *flag = last;
      }
      __syncthreads();
      if (!*flag)
        continue;
      // Sum the partials in CTA order; loads go out k_batch at a time (one L2 round trip per
      // batch instead of one per contributor), the adds stay in order. (4 at a time pushed the
      // 1-block variant over its 128-register cap and spilled in the main loop.)
      constexpr int k_batch = C::swap ? 2 : 4;
      for (int idx = tid; idx < nrows * (k_tile_n / 4); idx += k_threads) {
        const int r = idx / (k_tile_n / 4), c4 = idx % (k_tile_n / 4);
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int32_t c0 = c_first; c0 <= c_last; c0 += k_batch) {
          float4 v[k_batch];
#pragma unroll
          for (int j = 0; j < k_batch; ++j) {
            const int32_t cc = c0 + j;
            if (cc <= c_last) {
              const int sl = run_start(cc, s) >= tile_u0 ? 0 : 1; // run began inside this tile: head slot
              v[j] = __ldcg(reinterpret_cast<const float4*>(
                partials + static_cast<int64_t>(cc * 2 + sl) * (C::rows * k_tile_n) + r * k_tile_n + c4 * 4));
            }
          }
#pragma unroll
          for (int j = 0; j < k_batch; ++j)
            if (c0 + j <= c_last)
              sum.x += v[j].x, sum.y += v[j].y, sum.z += v[j].z, sum.w += v[j].w;
        }
        *reinterpret_cast<float4*>(red + r * C::red_stride + c4 * 4) = sum;
      }
      __syncthreads();
    }

    // 3. Epilogue.
    epilogue_store<ROWS>(p, s, red, nt, mb, nrows);
    __syncthreads();
  }
  cp_async_wait<0>();
}

// ---- host side -------------------------------------------------------------------------------------

constexpr int k_max_devices = 64;

struct variant_cache {
  bool ready = false;
  int grid = 0; // SMs x CTAs per SM
};

std::mutex g_cache_mutex;
constexpr int k_variants = 5; // 8, 16, 32, 48, 64 rows
variant_cache g_cache[k_max_devices][k_variants];

int variant_index(int block_rows) {
  switch (block_rows) {
    case 8: return 0;
    case 16: return 1;
    case 32: return 2;
    case 48: return 3;
    case 64: return 4;
    default: return -1;
  }
}

template <int ROWS>
kernel_status prepare_variant(int device, int* grid) {
  using C = cfg<ROWS>;
  RLSERVE_CUDA_TRY(cudaFuncSetAttribute(w4a16_kernel<ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::smem_bytes));
  int per_sm = 0, sms = 0;
  RLSERVE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, w4a16_kernel<ROWS>, k_threads, C::smem_bytes));
  RLSERVE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (per_sm < 1)
    return kernel_status::not_supported;
  *grid = per_sm * sms;
  return kernel_status::ok;
}

kernel_status variant_grid(int block_rows, int* grid) {
  int device = 0;
  RLSERVE_CUDA_TRY(cudaGetDevice(&device));
  const int v = variant_index(block_rows);
  if (device < 0 || device >= k_max_devices || v < 0)
    return kernel_status::not_supported;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  variant_cache& vc = g_cache[device][v];
  if (!vc.ready) {
    kernel_status st = kernel_status::ok;
    switch (block_rows) {
      case 8: st = prepare_variant<8>(device, &vc.grid); break;
      case 16: st = prepare_variant<16>(device, &vc.grid); break;
      case 32: st = prepare_variant<32>(device, &vc.grid); break;
      case 48: st = prepare_variant<48>(device, &vc.grid); break;
      default: st = prepare_variant<64>(device, &vc.grid); break;
    }
    if (st != kernel_status::ok)
      return st;
    vc.ready = true;
  }
  *grid = vc.grid;
  return kernel_status::ok;
}

} // namespace

bool block_rows_valid(int block_rows) { return variant_index(block_rows) >= 0; }

int block_rows_for(int64_t rows) {
  if (rows <= 8)
    return 8;
  if (rows <= 16)
    return 16;
  if (rows <= 32)
    return 32;
  if (rows <= 48)
    return 48;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 48;
  return optin >= cfg<64>::smem_bytes ? 64 : 48;
}

int grid_for(int block_rows, int max_ctas) {
  int grid = 0;
  if (variant_grid(block_rows, &grid) != kernel_status::ok)
    return 0;
  return max_ctas > 0 ? std::min(grid, max_ctas) : grid;
}

std::size_t counter_bytes(int64_t max_tiles) {
  return static_cast<std::size_t>((max_tiles * 4 + 255) / 256 * 256);
}

// Sized for the full grid of every variant, whatever max_ctas caps a launch to, so the counters
// behind this region sit at the same offset for every launch on this device.
std::size_t partial_bytes() {
  std::size_t bytes = 0;
  for (int rows : {8, 16, 32, 48, 64})
    bytes = std::max(bytes, static_cast<std::size_t>(grid_for(rows, 0)) * 2 * rows * k_tile_n * sizeof(float));
  return (bytes + 255) / 256 * 256;
}

int64_t n_tiles_of(const problem& p) {
  return p.ep == epilogue::silu_mul_bf16 ? (p.up_tile_offset + 1) / 2 : (p.n / 64 + k_sub - 1) / k_sub;
}

int64_t tiles_of(const problem& p, int block_rows) {
  const int64_t rows = block_rows;
  const int64_t mblk = p.moe ? p.max_m_blocks : p.batch * ((p.m + rows - 1) / rows);
  return n_tiles_of(p) * mblk;
}

template <int ROWS>
cudaError_t launch_variant(const problem& p, int grid, int* counters, float* partials, cudaStream_t stream, bool pdl) {
  cudaLaunchConfig_t cfg_{};
  cfg_.gridDim = dim3(static_cast<unsigned>(grid));
  cfg_.blockDim = dim3(k_threads);
  cfg_.dynamicSmemBytes = cfg<ROWS>::smem_bytes;
  cfg_.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg_.attrs = attr;
  cfg_.numAttrs = pdl && RLSERVE_W4A16_PDL ? 1 : 0;
  return cudaLaunchKernelEx(&cfg_, w4a16_kernel<ROWS>, p, counters, partials);
}

kernel_status run(const problem& p, int block_rows, int grid, int* counters, float* partials, cudaStream_t stream,
                  bool pdl) {
  if (grid < 1)
    return kernel_status::invalid_problem;
  if (counters == nullptr || partials == nullptr)
    return kernel_status::workspace_null;
  cudaError_t e = cudaSuccess;
  switch (block_rows) {
    case 8: e = launch_variant<8>(p, grid, counters, partials, stream, pdl); break;
    case 16: e = launch_variant<16>(p, grid, counters, partials, stream, pdl); break;
    case 32: e = launch_variant<32>(p, grid, counters, partials, stream, pdl); break;
    case 48: e = launch_variant<48>(p, grid, counters, partials, stream, pdl); break;
    case 64: e = launch_variant<64>(p, grid, counters, partials, stream, pdl); break;
    default: return kernel_status::invalid_problem;
  }
  RLSERVE_CUDA_TRY(e);
  RLSERVE_CUDA_CHECK_LAUNCH();
  return kernel_status::ok;
}

} // namespace rlserve::kernels::w4a16

// ---- public dense API ---------------------------------------------------------------------------------

namespace rlserve::kernels {

namespace {

w4a16::problem dense_problem(const gemm_w4a16_args& a) {
  w4a16::problem p;
  const int64_t lda = a.lda ? a.lda : a.k, ldc = a.ldc ? a.ldc : a.n;
  const int64_t groups = a.group_size == k_int4_channel ? 1 : a.k / a.group_size;
  p.moe = false;
  p.m = static_cast<int32_t>(a.m);
  p.batch = static_cast<int32_t>(a.batch);
  p.a = a.a;
  p.lda = lda;
  p.a_batch_stride = a.m * lda;
  p.b = a.b;
  p.b_batch_stride = a.k * a.n / 8;
  p.scale = a.scale;
  p.scale_batch_stride = groups * a.n;
  p.zero_point = a.has_zero_point ? a.zero_point : nullptr;
  p.zp_batch_stride = groups * (a.n / 8);
  p.n = static_cast<int32_t>(a.n);
  p.k = static_cast<int32_t>(a.k);
  p.glen = static_cast<int32_t>(a.k / groups);
  p.groups = static_cast<int32_t>(groups);
  p.has_zero_point = a.has_zero_point;
  p.ep = w4a16::epilogue::store_bf16;
  p.c = a.c;
  p.ldc = ldc;
  p.c_batch_stride = a.m * ldc;
  return p;
}

int dense_block_rows(const gemm_w4a16_args& a) {
  if (a.batch_invariant)
    return 8; // one variant at every m: its in-CTA k split is part of the summation order
  return w4a16::block_rows_valid(a.block_rows) ? a.block_rows : w4a16::block_rows_for(a.m);
}

} // namespace

// Workspace: [FP32 partials for any variant][one counter per 8-row tile of args.m]; the layout
// does not depend on m, so one workspace serves every m up to the one it was sized for.
std::size_t gemm_w4a16_workspace_bytes(const gemm_w4a16_args& a) {
  if (gemm_w4a16_can_implement(a) != kernel_status::ok || a.m == 0)
    return 0;
  return w4a16::partial_bytes() + w4a16::counter_bytes(w4a16::tiles_of(dense_problem(a), 8));
}

kernel_status gemm_w4a16_workspace_init(const gemm_w4a16_args& a, void* workspace, cudaStream_t stream) {
  if (auto st = gemm_w4a16_can_implement(a); st != kernel_status::ok)
    return st;
  if (a.m == 0)
    return kernel_status::ok;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  const std::size_t off = w4a16::partial_bytes();
  RLSERVE_CUDA_TRY(cudaMemsetAsync(static_cast<unsigned char*>(workspace) + off, 0,
                                   w4a16::counter_bytes(w4a16::tiles_of(dense_problem(a), 8)), stream));
  return kernel_status::ok;
}

kernel_status gemm_w4a16_launch(const gemm_w4a16_args& a, void* workspace, cudaStream_t stream) {
  if (auto st = gemm_w4a16_can_implement(a); st != kernel_status::ok)
    return st;
  if (a.m == 0)
    return kernel_status::ok;
  if (workspace == nullptr)
    return kernel_status::workspace_null;
  w4a16::problem p = dense_problem(a);
  const int mb = dense_block_rows(a);
  auto* partials = static_cast<float*>(workspace);
  auto* counters = reinterpret_cast<int*>(static_cast<unsigned char*>(workspace) + w4a16::partial_bytes());
  if (a.batch_invariant) { // whole tiles: a CTA per tile
    p.whole_tiles = true;
    return w4a16::run(p, mb, static_cast<int>(w4a16::tiles_of(p, mb)), counters, partials, stream);
  }
  const int grid = w4a16::grid_for(mb, a.max_ctas);
  if (grid < 1)
    return kernel_status::cuda_error;
  const int64_t units = w4a16::tiles_of(p, mb) * ((a.k + w4a16::k_stage_k - 1) / w4a16::k_stage_k);
  return w4a16::run(p, mb, static_cast<int>(std::min<int64_t>(grid, units)), counters, partials, stream);
}

} // namespace rlserve::kernels
