// XXH3-64 of one buffer by one warp of 32 lanes: the schedule the CUDA kernel runs
// (kernels/cuda/xxh3.cu). It is a template over the warp so that the unit tests run this very code
// on the host, with 32 threads standing in for the lanes (tests/kernels/xxh3_test.cpp).
//
// Why this split is exact. Within a 1024-byte block the 8 accumulator lanes only ADD the 16
// stripes' contributions (mod 2^64); the non-linear scramble comes between blocks. So the sum over
// a block's stripes can be formed in any grouping. Warp lane L = 8s + i (s = 0..3, i = 0..7) takes
// accumulator lane i for stripes s, s+4, s+8, s+12 of every block, i.e. the 8-byte words at
// 256j + 8L of the block (j = 0..3): the warp reads 256 contiguous bytes per step. It sums
// product(word i, key) (for lane i) and the word itself (for lane i^1); one shuffle with L^1
// swaps the second sum into place and two xor-shuffles over s (L^8, L^16) add up the four
// groups. Every warp lane then holds lane i's block sum; all four copies of lane i apply the
// same add and scramble, so they stay equal. The blocks themselves stay strictly in order.
//
// Loads: the words of a block are 8k bytes from the buffer's start, so one alignment (8, 4, 2 or 1
// bytes, from the start address) holds for all of them and picks the load width. The input's
// last 64 bytes start at an arbitrary offset and use the width of their own address.
//
// The Warp type provides lane() (0..31), shfl(v, src_lane) and shfl_xor(v, lane_mask) of 64-bit
// values, called by all 32 lanes together (the control flow here is the same in every lane around
// each call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/xxh3.hpp"

namespace rlserve::kernels {

// Full unrolling keeps the per-lane arrays below in registers on the device.
#if defined(__CUDACC__)
#define RLSERVE_XXH3_UNROLL _Pragma("unroll")
#else
#define RLSERVE_XXH3_UNROLL
#endif

constexpr int k_xxh3_warp_size = 32;
// Full blocks whose words a lane loads before it folds any of them in: 8 x 1 KiB in flight per
// warp hides memory latency for a long buffer that runs alone.
constexpr int k_xxh3_blocks_in_flight = 8;

// Reads 8 little-endian bytes at p, whose address is a multiple of Align (8, 4, 2 or 1), with
// loads Align bytes wide.
template <int Align>
RLSERVE_HD inline uint64_t xxh3_load64(const std::byte* p) {
  static_assert(Align == 8 || Align == 4 || Align == 2 || Align == 1, "a power of two up to 8");
#ifdef __CUDA_ARCH__
  // Read-only cache loads (__ldg): the buffers do not change while they are hashed.
  if constexpr (Align == 8) {
    return __ldg(reinterpret_cast<const unsigned long long*>(p));
  } else {
    using unit = std::conditional_t<Align == 4, unsigned int,
                                    std::conditional_t<Align == 2, unsigned short, unsigned char>>;
    const unit* u = reinterpret_cast<const unit*>(p);
    uint64_t v = 0;
RLSERVE_XXH3_UNROLL
    for (int k = 0; k < 8 / Align; ++k)
      v |= static_cast<uint64_t>(__ldg(u + k)) << (8 * Align * k); // the device is little-endian
    return v;
  }
#else
  return xxh3_read64(reinterpret_cast<const uint8_t*>(p));
#endif
}

// The same at an address of any alignment.
RLSERVE_HD inline uint64_t xxh3_load64_any(const std::byte* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  if (address % 8 == 0)
    return xxh3_load64<8>(p);
  if (address % 4 == 0)
    return xxh3_load64<4>(p);
  if (address % 2 == 0)
    return xxh3_load64<2>(p);
  return xxh3_load64<1>(p);
}

// One warp lane's share of a group of stripes: sum of the products for accumulator lane i and
// sum of the raw words, which belong to accumulator lane i^1.
struct xxh3_lane_sums {
  uint64_t products = 0;
  uint64_t words = 0;
};

RLSERVE_HD inline void xxh3_lane_add(xxh3_lane_sums& sums, uint64_t word, uint64_t key) {
  sums.products += xxh3_stripe_product(word, key);
  sums.words += word;
}

// Accumulator lane i's total over the warp: this lane's products, lane L^1's words, then the four
// stripe groups s added (every lane gets the total of its own i).
template <class Warp>
RLSERVE_HD inline uint64_t xxh3_warp_total(Warp& warp, const xxh3_lane_sums& sums) {
  uint64_t total = sums.products + warp.shfl_xor(sums.words, 1);
  total += warp.shfl_xor(total, 8);
  total += warp.shfl_xor(total, 16);
  return total;
}

// The long path (len > 240) with loads Align bytes wide; `in` is a multiple of Align.
template <int Align, class Warp>
RLSERVE_HD inline uint64_t xxh3_64_long_warp(Warp& warp, const std::byte* in, uint64_t len,
                                             const uint8_t* secret) {
  const int lane = warp.lane();
  const int i = lane % 8, s = lane / 8;
  // Stripe n of a block uses the key at secret + 8n; word i of it the 8 bytes at +8i. This lane
  // reads stripes n = s + 4j, so its four keys are fixed for the whole buffer.
  uint64_t key[4];
RLSERVE_XXH3_UNROLL
  for (int j = 0; j < 4; ++j)
    key[j] = xxh3_read64(secret + 8 * (s + 4 * j + i));
  const uint64_t scramble_key = xxh3_read64(secret + k_xxh3_scramble_offset + 8 * i);
  uint64_t acc = xxh3_initial_acc(i);

  const uint64_t full_blocks = (len - 1) / k_xxh3_block_len;
  for (uint64_t first = 0; first < full_blocks; first += k_xxh3_blocks_in_flight) {
    const uint64_t left = full_blocks - first;
    const int blocks_here = left < k_xxh3_blocks_in_flight ? static_cast<int>(left) : k_xxh3_blocks_in_flight;
    uint64_t word[k_xxh3_blocks_in_flight][4];
RLSERVE_XXH3_UNROLL
    for (int b = 0; b < k_xxh3_blocks_in_flight; ++b) {
      if (b < blocks_here) {
        const std::byte* block = in + (first + b) * k_xxh3_block_len;
RLSERVE_XXH3_UNROLL
        for (int j = 0; j < 4; ++j)
          word[b][j] = xxh3_load64<Align>(block + 256 * j + 8 * lane);
      }
    }
RLSERVE_XXH3_UNROLL
    for (int b = 0; b < k_xxh3_blocks_in_flight; ++b) {
      if (b < blocks_here) { // the same in every lane: the shuffles below see the whole warp
        xxh3_lane_sums sums;
RLSERVE_XXH3_UNROLL
        for (int j = 0; j < 4; ++j)
          xxh3_lane_add(sums, word[b][j], key[j]);
        acc = xxh3_scramble(acc + xxh3_warp_total(warp, sums), scramble_key);
      }
    }
  }

  // The rest: whole stripes of the last (partial) block, then the last 64 bytes; no scramble.
  const uint64_t rest = full_blocks * k_xxh3_block_len;
  const uint64_t rest_stripes = (len - 1 - rest) / k_xxh3_stripe_len; // 0..15
  xxh3_lane_sums sums;
RLSERVE_XXH3_UNROLL
  for (int j = 0; j < 4; ++j) {
    if (static_cast<uint64_t>(s + 4 * j) < rest_stripes)
      xxh3_lane_add(sums, xxh3_load64<Align>(in + rest + 256 * j + 8 * lane), key[j]);
  }
  if (s == 0)
    xxh3_lane_add(sums, xxh3_load64_any(in + len - k_xxh3_stripe_len + 8 * i),
                  xxh3_read64(secret + k_xxh3_last_stripe_offset + 8 * i));
  acc += xxh3_warp_total(warp, sums);

  uint64_t lanes[8]; // warp lane k holds accumulator lane k for k < 8
RLSERVE_XXH3_UNROLL
  for (int k = 0; k < 8; ++k)
    lanes[k] = warp.shfl(acc, k);
  return xxh3_merge(lanes, len, secret);
}

// XXH3-64 of `len` bytes at `in`; every lane returns the digest.
template <class Warp>
RLSERVE_HD inline uint64_t xxh3_64_warp(Warp& warp, const std::byte* in, uint64_t len,
                                        const uint8_t* secret) {
  if (len <= k_xxh3_midsize_max) // a few hundred bytes at most: every lane does the scalar path
    return xxh3_64_short(reinterpret_cast<const uint8_t*>(in), len, secret);
  const auto address = reinterpret_cast<uintptr_t>(in);
  if (address % 8 == 0)
    return xxh3_64_long_warp<8>(warp, in, len, secret);
  if (address % 4 == 0)
    return xxh3_64_long_warp<4>(warp, in, len, secret);
  if (address % 2 == 0)
    return xxh3_64_long_warp<2>(warp, in, len, secret);
  return xxh3_64_long_warp<1>(warp, in, len, secret);
}

} // namespace rlserve::kernels
