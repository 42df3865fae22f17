// XXH3-64 (seed 0, default 192-byte secret): the digest check_weights(checksum) reports per
// tensor, equal to XXH3_64bits() of libxxhash and xxhash.xxh3_64_hexdigest() in Python. The CPU
// twin (kernels/cpu/xxh3.cpp) follows the published algorithm step by step; the CUDA kernel
// (kernels/cuda/xxh3.cu) hashes a batch of device buffers, one warp per buffer, with the schedule
// in kernels/xxh3_warp.hpp. Both call the inline functions below, so the pieces they share are
// one piece of code.
//
// The algorithm, by input length (all arithmetic mod 2^64, reads little-endian, secret = S):
//   0           avalanche64(read64(S+56) ^ read64(S+64))
//   1..3        the 3 bytes first, middle, last and the length in one 32-bit word, xor a key
//   4..8        the first and last 4 bytes, xor a key, rrmxmx
//   9..16       the first and last 8 bytes, a 128-bit multiply folded to 64 bits, avalanche
//   17..128     1 to 4 pairs of 16-byte chunks from both ends, mixed with S+0..S+127 (mix16)
//   129..240    16-byte chunks in order: 8 with S+16i, avalanche, the rest with S+3+16(i-8),
//               the last 16 bytes with S+119; avalanche
//   241..       8 accumulator lanes over 64-byte stripes; stripe n of a 1024-byte block uses
//               S+8n; after each full block every lane is scrambled with S+128. The bytes after
//               the last full block (1..1024 of them: a length that is a multiple of 1024 leaves
//               its last block here) are whole stripes with S+8n, then the input's last 64
//               bytes (which may overlap them) with S+121, no scramble; the 8 lanes are merged
//               pairwise with S+11.
// Per stripe, lane i adds the data word i^1 to itself and lo32(w)*hi32(w) of w = word i ^ key i.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/int4_format.hpp" // RLSERVE_HD
#include "kernels/kernel_status.hpp"
#include "messages/expected.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- constants of the specification --------------------------------------------------------------

constexpr uint32_t k_xxh_prime32_1 = 0x9E3779B1u;
constexpr uint32_t k_xxh_prime32_2 = 0x85EBCA77u;
constexpr uint32_t k_xxh_prime32_3 = 0xC2B2AE3Du;
constexpr uint64_t k_xxh_prime64_1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t k_xxh_prime64_2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t k_xxh_prime64_3 = 0x165667B19E3779F9ull;
constexpr uint64_t k_xxh_prime64_4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t k_xxh_prime64_5 = 0x27D4EB2F165667C5ull;
constexpr uint64_t k_xxh_prime_mx1 = 0x165667919E3779F9ull;
constexpr uint64_t k_xxh_prime_mx2 = 0x9FB21C651E98DF25ull;

constexpr int k_xxh3_secret_size = 192;
constexpr int k_xxh3_stripe_len = 64;                                     // 8 lanes x 8 bytes
constexpr int k_xxh3_stripes_per_block = (k_xxh3_secret_size - 64) / 8;   // 16: key moves 8 B/stripe
constexpr int k_xxh3_block_len = k_xxh3_stripe_len * k_xxh3_stripes_per_block; // 1024
constexpr int k_xxh3_scramble_offset = k_xxh3_secret_size - k_xxh3_stripe_len; // 128
constexpr int k_xxh3_last_stripe_offset = k_xxh3_secret_size - k_xxh3_stripe_len - 7; // 121
constexpr int k_xxh3_merge_offset = 11;
constexpr uint64_t k_xxh3_midsize_max = 240; // longer inputs take the 8-lane path

// The default secret, as a brace list so that the CUDA file can put the same bytes in constant
// memory (a host constexpr array cannot be indexed from device code).
#define RLSERVE_XXH3_DEFAULT_SECRET                                                                \
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,  \
  0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,  \
  0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,  \
  0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,  \
  0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,  \
  0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,  \
  0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,  \
  0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,  \
  0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,  \
  0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,  \
  0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,  \
  0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e

inline constexpr uint8_t k_xxh3_default_secret[k_xxh3_secret_size] = {RLSERVE_XXH3_DEFAULT_SECRET};

// ---- primitives (host and device) ----------------------------------------------------------------

// Little-endian reads assembled from bytes: any alignment, any host byte order. Host compilers
// turn these into one load.
RLSERVE_HD inline uint32_t xxh3_read32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
RLSERVE_HD inline uint64_t xxh3_read64(const uint8_t* p) {
  return static_cast<uint64_t>(xxh3_read32(p)) | static_cast<uint64_t>(xxh3_read32(p + 4)) << 32;
}

RLSERVE_HD inline uint64_t xxh3_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

RLSERVE_HD inline uint64_t xxh3_swap64(uint64_t x) {
  x = ((x & 0x00000000FFFFFFFFull) << 32) | ((x & 0xFFFFFFFF00000000ull) >> 32);
  x = ((x & 0x0000FFFF0000FFFFull) << 16) | ((x & 0xFFFF0000FFFF0000ull) >> 16);
  x = ((x & 0x00FF00FF00FF00FFull) << 8) | ((x & 0xFF00FF00FF00FF00ull) >> 8);
  return x;
}

// The full 128-bit product of a and b, low half xor high half.
RLSERVE_HD inline uint64_t xxh3_mul128_fold64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}

// XXH64's final mix (the empty input and lengths 1..3).
RLSERVE_HD inline uint64_t xxh64_avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= k_xxh_prime64_2;
  h ^= h >> 29;
  h *= k_xxh_prime64_3;
  h ^= h >> 32;
  return h;
}

// XXH3's final mix (lengths 9 and up).
RLSERVE_HD inline uint64_t xxh3_avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= k_xxh_prime_mx1;
  h ^= h >> 32;
  return h;
}

// Lengths 4..8: a stronger mix, because the input there is a single 64-bit word.
RLSERVE_HD inline uint64_t xxh3_rrmxmx(uint64_t h, uint64_t len) {
  h ^= xxh3_rotl64(h, 49) ^ xxh3_rotl64(h, 24);
  h *= k_xxh_prime_mx2;
  h ^= (h >> 35) + len;
  h *= k_xxh_prime_mx2;
  return h ^ (h >> 28);
}

RLSERVE_HD inline uint64_t xxh3_mix16(const uint8_t* in, const uint8_t* secret) {
  return xxh3_mul128_fold64(xxh3_read64(in) ^ xxh3_read64(secret),
                            xxh3_read64(in + 8) ^ xxh3_read64(secret + 8));
}

// Inputs of at most 240 bytes (seed 0: the seed terms of the specification vanish).
RLSERVE_HD inline uint64_t xxh3_64_short(const uint8_t* in, uint64_t len, const uint8_t* secret) {
  if (len == 0)
    return xxh64_avalanche(xxh3_read64(secret + 56) ^ xxh3_read64(secret + 64));
  if (len <= 3) {
    const uint32_t c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
    const uint32_t combined = (c1 << 16) | (c2 << 24) | c3 | (static_cast<uint32_t>(len) << 8);
    const uint64_t bitflip = xxh3_read32(secret) ^ xxh3_read32(secret + 4);
    return xxh64_avalanche(static_cast<uint64_t>(combined) ^ bitflip);
  }
  if (len <= 8) {
    const uint64_t input1 = xxh3_read32(in), input2 = xxh3_read32(in + len - 4);
    const uint64_t bitflip = xxh3_read64(secret + 8) ^ xxh3_read64(secret + 16);
    return xxh3_rrmxmx((input2 + (input1 << 32)) ^ bitflip, len);
  }
  if (len <= 16) {
    const uint64_t bitflip1 = xxh3_read64(secret + 24) ^ xxh3_read64(secret + 32);
    const uint64_t bitflip2 = xxh3_read64(secret + 40) ^ xxh3_read64(secret + 48);
    const uint64_t lo = xxh3_read64(in) ^ bitflip1;
    const uint64_t hi = xxh3_read64(in + len - 8) ^ bitflip2;
    return xxh3_avalanche(len + xxh3_swap64(lo) + hi + xxh3_mul128_fold64(lo, hi));
  }
  uint64_t acc = len * k_xxh_prime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += xxh3_mix16(in + 48, secret + 96);
          acc += xxh3_mix16(in + len - 64, secret + 112);
        }
        acc += xxh3_mix16(in + 32, secret + 64);
        acc += xxh3_mix16(in + len - 48, secret + 80);
      }
      acc += xxh3_mix16(in + 16, secret + 32);
      acc += xxh3_mix16(in + len - 32, secret + 48);
    }
    acc += xxh3_mix16(in, secret);
    acc += xxh3_mix16(in + len - 16, secret + 16);
    return xxh3_avalanche(acc);
  }
  const int rounds = static_cast<int>(len / 16);
  for (int i = 0; i < 8; ++i)
    acc += xxh3_mix16(in + 16 * i, secret + 16 * i);
  acc = xxh3_avalanche(acc);
  for (int i = 8; i < rounds; ++i)
    acc += xxh3_mix16(in + 16 * i, secret + 16 * (i - 8) + 3);
  acc += xxh3_mix16(in + len - 16, secret + 136 - 17);
  return xxh3_avalanche(acc);
}

// ---- the 8-lane long-input path, one lane at a time ----------------------------------------------

RLSERVE_HD inline uint64_t xxh3_initial_acc(int lane) {
  switch (lane) {
    case 0: return k_xxh_prime32_3;
    case 1: return k_xxh_prime64_1;
    case 2: return k_xxh_prime64_2;
    case 3: return k_xxh_prime64_3;
    case 4: return k_xxh_prime64_4;
    case 5: return k_xxh_prime32_2;
    case 6: return k_xxh_prime64_5;
    default: return k_xxh_prime32_1;
  }
}

// Lane i's term from data word i of a stripe (the word itself is added to lane i^1).
RLSERVE_HD inline uint64_t xxh3_stripe_product(uint64_t word, uint64_t key) {
  const uint64_t keyed = word ^ key;
  return (keyed & 0xFFFFFFFFull) * (keyed >> 32);
}

RLSERVE_HD inline uint64_t xxh3_scramble(uint64_t acc, uint64_t key) {
  acc ^= acc >> 47;
  acc ^= key;
  return acc * k_xxh_prime32_1;
}

// The digest from the 8 lanes after the last stripe.
RLSERVE_HD inline uint64_t xxh3_merge(const uint64_t acc[8], uint64_t len, const uint8_t* secret) {
  uint64_t h = len * k_xxh_prime64_1;
  for (int i = 0; i < 4; ++i) {
    const uint8_t* key = secret + k_xxh3_merge_offset + 16 * i;
    h += xxh3_mul128_fold64(acc[2 * i] ^ xxh3_read64(key), acc[2 * i + 1] ^ xxh3_read64(key + 8));
  }
  return xxh3_avalanche(h);
}

// ---- the batch API ---------------------------------------------------------------------------------

struct xxh3_batch_args {
  const std::byte* const* data = nullptr; // [count] start of each buffer (any alignment; may be
                                          // null when its length is 0)
  const uint64_t* lengths = nullptr;      // [count] bytes
  uint64_t* digests = nullptr;            // [count] out: XXH3-64 of each buffer
  int64_t count = 0;
};

// What is wrong with the arguments, as a sentence; empty = fine. Checks the arrays themselves
// only (the launch cannot look inside device arrays).
std::string xxh3_batch_problem(const xxh3_batch_args& args);

// CPU twin: XXH3-64 of one buffer (libxxhash's XXH3_64bits).
uint64_t xxh3_64(const void* data, uint64_t length);
// CPU twin over a batch: host pointers. A null buffer with a non-zero length is invalid_problem.
kernel_status xxh3_batch_ref(const xxh3_batch_args& args);
// CUDA: data, lengths and digests are device arrays (of device pointers); one warp per buffer.
// Asynchronous on `stream`. The buffers must stay unchanged until the stream reaches the end.
kernel_status xxh3_batch_launch(const xxh3_batch_args& args, cudaStream_t stream);

// One device buffer for xxh3_device_digests.
struct xxh3_device_span {
  const std::byte* data = nullptr; // device pointer (any alignment)
  uint64_t length = 0;             // bytes
};

// CUDA, host side: uploads the tables, launches (longest buffers first, so that a long one does
// not start last and run alone at the end), waits for `stream` and returns one digest per span,
// in the order given.
rlserve::expected<std::vector<uint64_t>> xxh3_device_digests(const std::vector<xxh3_device_span>& spans,
                                                            cudaStream_t stream);

} // namespace rlserve::kernels
