// INT4 W4A16 formats: the one place that says where every 4-bit code of a quantized weight lives,
// in the LOAD format (compressed-tensors `pack-quantized`, what checkpoints and trainers provide)
// and in the SERVING layout (Marlin-style tensor-core tiles, what the W4A16 GEMM / fused-MoE
// kernels read). Everything here is plain index arithmetic usable from host code and from CUDA
// kernels (RLSERVE_HD); docs/formats.md draws the same maps in words.
//
// Value encoding, both formats, per group of G consecutive inputs k of one output row n:
//     w = scale * (q - z)          q: a stored 4-bit code 0..15
//     symmetric:  z = 8 implicit   (signed code q - 8 in [-8, 7]; the QAT recipe uses [-7, 7])
//     asymmetric: z = 0..15 stored per group (one nibble)
// Bits per weight: 4 + 16/G (bf16 scale) [+ 4/G (zero point, asymmetric)]:
//     sym g128 4.125, asym g128 4.156, asym g64 4.31, asym g32 4.625.
//
// Orientation. A weight is the Hugging Face Linear weight [n, k] = [out_features, in_features].
// `batch` matrices of the same shape (the experts of one MoE projection) lie back to back.
//
// LOAD format (compressed-tensors pack-quantized), per matrix:
//     weight_packed      int32 [n, k/8]     code (n, k) in word (n, k/8), bits 4*(k%8)..+3
//     weight_scale       bf16  [n, k/G]     (per-channel: [n, 1])
//     weight_zero_point  int32, asymmetric only, one of two layouts:
//        standard        [n/8, k/G]         zp (n, g) in word (n/8, g), bits 4*(n%8)..+3
//        miles           [k/G, n/8]         zp (n, g) in word (g, n/8), slot s holds n%8 = interleave[s]
//     weight_shape       int64 [2]          (n, k)
//
// SERVING layout, per matrix (byte-compatible with vLLM/SGLang gptq_marlin_repack,
// marlin_permute_scales and marlin_zero_points; see docs/formats.md):
//     weight      int32 [k/16, 2n]: 16(k) x 64(n) tiles of 128 words (512 B), tile (kt, nt) at
//                 word (kt * n/64 + nt) * 128; word t = 4*lane + j of a tile holds the 8 codes one
//                 mma.sync m16n8k16 lane needs for n16 sub-block j (see serving_weight_source).
//     scale       bf16  [k/G, n], columns permuted inside 64-blocks (32-blocks when k/G == 1)
//     zero_point  int32 [k/G, n/8], columns permuted like grouped scales, then interleaved
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#if defined(__CUDACC__)
#define RLSERVE_HD __host__ __device__
#else
#define RLSERVE_HD
#endif

namespace rlserve::kernels {

// ---- recipes and layouts ------------------------------------------------------------------------

// How BF16 weights become 4-bit codes (kernels/int4_quant.hpp has the exact arithmetic).
enum class int4_recipe : uint8_t {
  sym_qat = 1, // "int4-sym-qat": scale = max(amax/7, 1e-5), q in [-7, 7] (miles/Megatron QAT)
  sym,         // "int4-sym":     scale = max(amax/7.5, 1e-5), q in [-8, 7] (compressed-tensors RTN)
  asym,        // "int4-asym":    range [min(w,0), max(w,0)] over 15 steps, zero point 0..15
};

constexpr bool int4_symmetric(int4_recipe r) { return r != int4_recipe::asym; }

constexpr std::string_view to_string(int4_recipe r) {
  switch (r) {
    case int4_recipe::sym_qat: return "int4-sym-qat";
    case int4_recipe::sym: return "int4-sym";
    case int4_recipe::asym: return "int4-asym";
  }
  return "unknown";
}

std::optional<int4_recipe> parse_int4_recipe(std::string_view name);

// Where the asymmetric zero points of the LOAD format sit.
enum class zero_point_layout : uint8_t {
  standard = 1, // compressed-tensors: [n/8, k/G], packed along n, natural nibble order
  miles,        // miles/slime converter: [k/G, n/8], packed along n, AWQ order [0,2,4,6,1,3,5,7]
};

constexpr std::string_view to_string(zero_point_layout l) {
  switch (l) {
    case zero_point_layout::standard: return "standard";
    case zero_point_layout::miles: return "miles";
  }
  return "unknown";
}

std::optional<zero_point_layout> parse_zero_point_layout(std::string_view name);

// The 16-bit float type of stored scales. The quantizer writes bf16 (the activation type of the
// W4A16 kernels); the load format also accepts f16 checkpoints (repack/restore only move the
// 16-bit words, dequantization reads them by this type).
enum class int4_scale_type : uint8_t { bf16 = 1, f16 };

// ---- constants ----------------------------------------------------------------------------------

constexpr int32_t k_int4_channel = -1;        // group_size meaning "one group spanning all of k"
constexpr int k_int4_per_word = 8;            // codes per int32 word (lowest nibble first)
constexpr int k_serving_tile_k = 16;          // serving tile rows: one mma k16 step
constexpr int k_serving_tile_n = 64;          // serving tile columns: 8 n8 mma tiles
constexpr int k_serving_tile_words = 128;     // 16*64 codes / 8 per word
constexpr int k_serving_scale_block = 64;     // grouped scale / zero-point permutation block
constexpr int k_serving_scale_block_single = 32; // per-channel ("single") scale permutation block

// One serving tile: 16(k) x 64(n) codes = 128 words = 512 bytes, one 16-byte load per lane of a
// warp (word 4*lane + j, j = 0..3). Tiles are stored back to back, k-tile major.
struct int4_serving_tile {
  uint32_t words[k_serving_tile_words];
};
static_assert(sizeof(int4_serving_tile) == 512, "a serving tile is 16 x 64 nibbles");

// Nibble slot s of a Marlin word holds element interleave[s] of the word's 8 logical values, so
// that masking bits 0-3 and 16-19 yields the pair (v0, v1) the bf16 lop3 conversion turns into
// one bf16x2 register (docs/formats.md, '4. Serving layout'). The miles/AWQ zero-point packing uses
// the same order along n.
// interleave = [0,2,4,6,1,3,5,7], written as arithmetic so device code needs no table.
RLSERVE_HD constexpr int int4_interleave(int slot) { return 2 * (slot & 3) + (slot >> 2); }
// Inverse, [0,4,1,5,2,6,3,7]: the slot that holds logical element e.
RLSERVE_HD constexpr int int4_interleave_slot(int e) { return 4 * (e & 1) + (e >> 1); }
static_assert(int4_interleave(1) == 2 && int4_interleave(4) == 1 && int4_interleave(6) == 5);
static_assert(int4_interleave_slot(int4_interleave(3)) == 3 && int4_interleave_slot(5) == 6);

// ---- problem shape ------------------------------------------------------------------------------

struct int4_shape {
  int64_t batch = 1;         // matrices (experts) back to back, each [n, k]
  int64_t n = 0;             // output features: rows of the HF weight
  int64_t k = 0;             // input features: the reduction dimension, quantized in groups
  int32_t group_size = 128;  // 32, 64, 128, or k_int4_channel (one group of length k)
};

// Group length along k (k itself for per-channel) and groups per row.
RLSERVE_HD constexpr int64_t int4_group_len(const int4_shape& s) {
  return s.group_size == k_int4_channel ? s.k : s.group_size;
}
RLSERVE_HD constexpr int64_t int4_groups(const int4_shape& s) {
  return s.group_size == k_int4_channel ? 1 : s.k / s.group_size;
}

// Is this a group size the formats and kernels define? (32, 64, 128, or k_int4_channel.)
constexpr bool int4_group_size_supported(int32_t g) {
  return g == 32 || g == 64 || g == 128 || g == k_int4_channel;
}

// Shape checks, as sentences (empty = fine). The load format needs k % 8 == 0 (codes pack along
// k), k % G == 0, and n % 8 == 0 when there are zero points (they pack along n). The serving
// layout also needs k % 16 == 0 and n % 64 == 0 (its tile).
std::string int4_check_load_shape(const int4_shape& s, bool has_zero_point);
std::string int4_check_serving_shape(const int4_shape& s);

// ---- element counts (per whole batch) ----------------------------------------------------------

constexpr int64_t ct_weight_packed_words(const int4_shape& s) { return s.batch * s.n * (s.k / 8); }
constexpr int64_t ct_scale_count(const int4_shape& s) { return s.batch * s.n * int4_groups(s); }
constexpr int64_t ct_zero_point_words(const int4_shape& s) {
  return s.batch * (s.n / 8) * int4_groups(s);
}
constexpr int64_t serving_weight_words(const int4_shape& s) { return s.batch * s.k * s.n / 8; }
constexpr int64_t serving_scale_count(const int4_shape& s) { return s.batch * int4_groups(s) * s.n; }
constexpr int64_t serving_zero_point_words(const int4_shape& s) {
  return s.batch * int4_groups(s) * (s.n / 8);
}

// ---- nibbles ------------------------------------------------------------------------------------

RLSERVE_HD inline uint32_t int4_get_nibble(uint32_t word, int slot) {
  return (word >> (4 * slot)) & 0xfu;
}
RLSERVE_HD inline uint32_t int4_put_nibble(uint32_t word, int slot, uint32_t code) {
  return (word & ~(0xfu << (4 * slot))) | ((code & 0xfu) << (4 * slot));
}

// ---- load-format maps (one matrix; add the batch offset outside) --------------------------------

// Zero-point word and slot of (n, g) in the standard [n/8, G'] layout, G' = groups.
RLSERVE_HD inline int64_t ct_zp_standard_word(int64_t n, int64_t g, int64_t groups, int* slot) {
  *slot = static_cast<int>(n % 8);
  return (n / 8) * groups + g;
}
// ... and in the miles [G', n/8] AWQ-order layout.
RLSERVE_HD inline int64_t ct_zp_miles_word(int64_t n, int64_t g, int64_t n_total, int* slot) {
  *slot = int4_interleave_slot(static_cast<int>(n % 8));
  return g * (n_total / 8) + n / 8;
}

// ---- serving maps (one matrix of n_total columns; add the batch offset outside) -----------------

// Forward map: element e (0..7, logical order, before the interleave) of serving word `word`
// comes from code (k, n). With tile (kt, nt) = (word / (2n_total), (word % (2n_total)) / 128),
// t = word % 128, lane = t / 4, j = t % 4, c = lane / 4, r = 2 * (lane % 4):
//     k = 16 kt + r + (e & 1) + 8 * ((e >> 1) & 1)      -> rows r, r+1, r+8, r+9
//     n = 64 nt + 16 j + c + 8 * (e >> 2)               -> columns c and c+8 of n16 block j
// which is exactly the B fragment of lane `lane` for the two n8 mma tiles of n16 block j.
// Inside one tile: element e of word t (0..127) is code (k_in, n_in), k_in 0..15, n_in 0..63.
// Constant shifts and masks only, so kernels call it per element at no cost.
RLSERVE_HD inline void serving_tile_element(int t, int e, int* k_in, int* n_in) {
  const int lane = t >> 2, j = t & 3, c = lane >> 2, r = 2 * (lane & 3);
  *k_in = r + (e & 1) + 8 * ((e >> 1) & 1);
  *n_in = 16 * j + c + 8 * (e >> 2);
}

RLSERVE_HD inline void serving_weight_source(int64_t word, int e, int64_t n_total, int64_t* k,
                                             int64_t* n) {
  const int64_t row_words = 2 * n_total; // words per 16-row k-slab
  const int64_t kt = word / row_words;
  const int64_t in_row = word % row_words;
  const int64_t nt = in_row / k_serving_tile_words;
  int k_in = 0, n_in = 0;
  serving_tile_element(static_cast<int>(in_row % k_serving_tile_words), e, &k_in, &n_in);
  *k = kt * 16 + k_in;
  *n = nt * 64 + n_in;
}

// Inverse inside one tile: the word t (0..127) and nibble slot holding code (k_in, n_in).
RLSERVE_HD inline int serving_tile_word(int k_in, int n_in, int* slot) {
  const int j = n_in / 16, c = n_in % 8, half = (n_in % 16) / 8;
  const int lane = 4 * c + (k_in % 8) / 2;
  const int e = (k_in % 2) + 2 * (k_in / 8) + 4 * half;
  *slot = int4_interleave_slot(e);
  return 4 * lane + j;
}

// Inverse map: the serving word and nibble slot that hold code (k, n).
RLSERVE_HD inline int64_t serving_weight_word(int64_t k, int64_t n, int64_t n_total, int* slot) {
  const int t = serving_tile_word(static_cast<int>(k % 16), static_cast<int>(n % 64), slot);
  return (k / 16) * (2 * n_total) + (n / 64) * k_serving_tile_words + t;
}

// Serving scale column: position p of a scale row holds source column serving_scale_source(p).
// Grouped (groups > 1): inside each 64-block, p = 8i + jj holds column i + 8jj (an 8x8
// transpose), so lane/4 = c reads the scales of columns c, c+8, ..., c+56 with one 16-byte load.
// Single (groups == 1): inside each 32-block, p = 8i + jj holds column 2i + {0,1,8,9,16,17,24,25}[jj].
RLSERVE_HD inline int64_t serving_scale_source(int64_t p, bool single) {
  if (!single) {
    const int64_t pp = p % 64;
    return p - pp + pp / 8 + 8 * (pp % 8);
  }
  const int64_t pp = p % 32;
  const int64_t jj = pp % 8;
  return p - pp + 2 * (pp / 8) + 8 * (jj / 2) + (jj % 2);
}
// Inverse: the scale-row position that holds column n.
RLSERVE_HD inline int64_t serving_scale_position(int64_t n, bool single) {
  if (!single) {
    const int64_t nn = n % 64;
    return n - nn + 8 * (nn % 8) + nn / 8;
  }
  const int64_t nn = n % 32;
  return n - nn + 8 * ((nn % 8) / 2) + 2 * (nn / 8) + (nn % 2);
}

// Serving zero points: word m of a zero-point row, slot s, holds the zero point of column
//     n = 64 (m / 8) + (m % 8) + 8 * interleave[s]
// (grouped scale permutation, never the single one, then the weight interleave within each word:
// the word a lane loads holds columns c, c+8, ..., c+56 in lop3 pair order).
RLSERVE_HD inline int64_t serving_zp_source(int64_t m, int slot) {
  return 64 * (m / 8) + (m % 8) + 8 * int4_interleave(slot);
}
RLSERVE_HD inline int64_t serving_zp_word(int64_t n, int* slot) {
  const int64_t nn = n % 64;
  *slot = int4_interleave_slot(static_cast<int>(nn / 8));
  return 8 * (n / 64) + nn % 8;
}

} // namespace rlserve::kernels
