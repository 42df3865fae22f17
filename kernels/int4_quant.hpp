// INT4 quantization recipes: BF16 weights [batch, n, k] -> 4-bit codes, bf16 scales and (asym)
// zero points, per group of G consecutive inputs k of one output row n. The arithmetic below is
// the specification; the CPU reference (kernels/cpu/int4_quant.cpp) and the CUDA kernels
// (kernels/cuda/int4_quant.cu) both call these inline functions, so they agree bit for bit.
//
// Precision and order of operations (all FP32, IEEE round-to-nearest-even; x is the exact float
// value of a bf16 weight):
//   symmetric QAT  (int4-sym-qat)  scale = max(amax / 7, 1e-5)      q = clamp(rint(x / scale), -7, 7)
//   symmetric      (int4-sym)      scale = max(amax / 7.5, 1e-5)    q = clamp(rint(x / scale), -8, 7)
//                                  stored nibble = q + 8 (compressed-tensors offset)
//   asymmetric     (int4-asym)     lo = min(min x, 0), hi = max(max x, 0)
//                                  scale = max((hi - lo) / 15, 1e-5)
//                                  zero  = clamp(rint(-lo / scale), 0, 15)
//                                  q     = clamp(rint(x / scale) + zero, 0, 15)   (round, then add)
//   amax = max |x| over the group; rint = round half to even; "/" is one IEEE division
//   (__fdiv_rn on the device, never a reciprocal multiply); stored scale = bf16_rn(scale).
// No step has the shape a*b+c, so FMA contraction cannot change a result on either side.
// The codes are computed with the FP32 scale (as the trainer's fake-quant forward does); the
// checkpoint stores bf16(scale), so dequant = bf16_rn((q - z) * float(bf16 scale)) differs from
// the trainer's fp32 fake weight by at most ~2^-9 relative: inherent to the format.
//
// Corner cases: an all-zero group gets scale 1e-5 (bf16 0x3728), zero point 0 (asym), codes
// 8 (sym) / 0 (asym). A constant group c > 0 (asym) gets range [0, c], zero 0, codes 15; c < 0
// gets range [c, 0], zero 15, codes 0. -0.0 and +0.0 give identical results. A NaN or Inf
// anywhere is an error naming the tensor and element (nonfinite index, below).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kernels/int4_format.hpp"
#include "kernels/kernel_status.hpp"
#include "messages/expected.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

constexpr float k_int4_min_scale = 1e-5f; // scale floor: all-zero groups, and the QAT recipe's clamp
constexpr uint64_t k_int4_all_finite = ~uint64_t{0}; // *nonfinite when every input was finite

// ---- the arithmetic (host and device) ----------------------------------------------------------

RLSERVE_HD inline float int4_fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b); // IEEE division whatever -prec-div / --use_fast_math say
#else
  return a / b;
#endif
}
RLSERVE_HD inline float int4_fsub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
RLSERVE_HD inline float int4_rint(float x) { // round half to even (default rounding mode on host)
#ifdef __CUDA_ARCH__
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
RLSERVE_HD inline float int4_bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
RLSERVE_HD inline uint32_t int4_float_to_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
RLSERVE_HD inline float int4_bf16_to_float(uint16_t bits) {
  return int4_bits_to_float(static_cast<uint32_t>(bits) << 16);
}
// float -> bf16 bits, round to nearest even, NaN kept quiet (same as kernels/bf16.hpp and
// __float2bfloat16_rn).
RLSERVE_HD inline uint16_t int4_float_to_bf16(float f) {
  uint32_t u = int4_float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
RLSERVE_HD inline bool int4_bf16_is_finite(uint16_t bits) { return (bits & 0x7f80u) != 0x7f80u; }

// Running group statistics. Updates are plain comparisons, so the result is the exact max/min of
// the set in any order (warp-shuffle trees included); NaN never enters, and starting from +0.0
// no -0.0 ever replaces a +0.0.
struct int4_group_stats {
  float amax = 0.0f; // max |x|
  float lo = 0.0f;   // min(x, 0)
  float hi = 0.0f;   // max(x, 0)
};

RLSERVE_HD inline void int4_stats_add(int4_group_stats& s, float x) {
  float a = x < 0.0f ? -x : x;
  if (a > s.amax)
    s.amax = a;
  if (x < s.lo)
    s.lo = x;
  if (x > s.hi)
    s.hi = x;
}
RLSERVE_HD inline void int4_stats_merge(int4_group_stats& s, const int4_group_stats& o) {
  if (o.amax > s.amax)
    s.amax = o.amax;
  if (o.lo < s.lo)
    s.lo = o.lo;
  if (o.hi > s.hi)
    s.hi = o.hi;
}

struct int4_group_params {
  float scale = k_int4_min_scale; // FP32 scale the codes are computed with (store bf16_rn of it)
  int32_t zero = 8;               // z of w = scale * (q - z): 8 for symmetric, 0..15 for asym
};

RLSERVE_HD inline int4_group_params int4_params(int4_recipe r, const int4_group_stats& s) {
  int4_group_params p;
  if (r == int4_recipe::asym)
    p.scale = int4_fdiv(int4_fsub(s.hi, s.lo), 15.0f);
  else
    p.scale = int4_fdiv(s.amax, r == int4_recipe::sym_qat ? 7.0f : 7.5f);
  if (!(p.scale >= k_int4_min_scale)) // also maps NaN to the floor (non-finite input is an error)
    p.scale = k_int4_min_scale;
  if (r == int4_recipe::asym) {
    float z = int4_rint(int4_fdiv(-s.lo, p.scale));
    z = z >= 0.0f ? z : 0.0f;
    z = z <= 15.0f ? z : 15.0f;
    p.zero = static_cast<int32_t>(z);
  } else {
    p.zero = 8;
  }
  return p;
}

// The stored nibble (0..15) of weight x. Clamps before converting, so any input (even NaN) gives
// a defined value.
RLSERVE_HD inline uint32_t int4_code_of_rounded(int4_recipe r, float q, const int4_group_params& p);
RLSERVE_HD inline uint32_t int4_code(int4_recipe r, float x, const int4_group_params& p) {
  return int4_code_of_rounded(r, int4_rint(int4_fdiv(x, p.scale)), p);
}
// The nibble from q = rint(x / scale) (the CUDA kernel computes q faster, with the same value).
RLSERVE_HD inline uint32_t int4_code_of_rounded(int4_recipe r, float q, const int4_group_params& p) {
  q = q >= -32.0f ? q : -32.0f; // wide clamp first: the integer steps below stay exact
  q = q <= 32.0f ? q : 32.0f;
  int32_t qi = static_cast<int32_t>(q);
  int32_t lo = r == int4_recipe::sym_qat ? -7 : -8, hi = 7;
  if (r == int4_recipe::asym) {
    qi += p.zero;
    lo = 0;
    hi = 15;
  }
  qi = qi < lo ? lo : (qi > hi ? hi : qi);
  return static_cast<uint32_t>(r == int4_recipe::asym ? qi : qi + 8);
}

// Dequantized value of a stored nibble: bf16_rn((q - z) * scale). (q - z) has at most 5
// significant bits and the scale at most 11, so the FP32 product is exact and only the final
// conversion rounds.
RLSERVE_HD inline float int4_dequant_float(uint32_t q, int32_t zero, float scale) {
  return static_cast<float>(static_cast<int32_t>(q) - zero) * scale;
}

// ---- BF16 -> compressed-tensors load format ----------------------------------------------------

struct int4_quant_args {
  int4_shape shape;
  int4_recipe recipe = int4_recipe::asym;
  zero_point_layout zp_layout = zero_point_layout::standard; // of weight_zero_point (asym only)
  const uint16_t* w = nullptr;          // bf16 bits [batch, n, k] (HF Linear weight, row-major)
  int32_t* weight_packed = nullptr;     // [batch, n, k/8] int32, lowest nibble = lowest k
  uint16_t* weight_scale = nullptr;     // bf16 bits [batch, n, k/G]
  int32_t* weight_zero_point = nullptr; // asym: [batch, n/8, k/G] (standard) | [batch, k/G, n/8]
                                        // (miles); symmetric: unused, may be null
  uint64_t* nonfinite = nullptr;        // [1] out: flat index (b*n + row)*k + col of the first
                                        // NaN/Inf in w, or k_int4_all_finite
};

kernel_status int4_quant_can_implement(const int4_quant_args& args);
// CPU reference. Writes every output; groups holding a NaN/Inf get unspecified codes.
kernel_status int4_quantize_ref(const int4_quant_args& args);
// CUDA twin: device pointers; bit-identical outputs and *nonfinite (read it after the stream).
kernel_status int4_quantize_launch(const int4_quant_args& args, cudaStream_t stream);

// ---- BF16 -> serving layout in one pass (quantize + pack + repack) ------------------------------

struct int4_quant_serving_args {
  int4_shape shape;
  int4_recipe recipe = int4_recipe::asym;
  const uint16_t* w = nullptr;           // bf16 bits [batch, n, k]
  int32_t* serving_weight = nullptr;     // [batch, k/16, 2n] Marlin tiles
  uint16_t* serving_scale = nullptr;     // bf16 bits [batch, k/G, n], permuted columns
  int32_t* serving_zero_point = nullptr; // asym: [batch, k/G, n/8]; symmetric: unused
  uint64_t* nonfinite = nullptr;         // [1] out, as above
};

kernel_status int4_quant_serving_can_implement(const int4_quant_serving_args& args);
// CPU reference: int4_quantize_ref followed by serving_repack_ref (the definition of the fused op).
kernel_status int4_quantize_serving_ref(const int4_quant_serving_args& args);
// CUDA: one kernel from bf16 to tiles, bit-identical with the reference.
kernel_status int4_quantize_serving_launch(const int4_quant_serving_args& args, cudaStream_t stream);

// ---- host wrappers: statuses and data errors as sentences naming the tensor --------------------

// "experts.3.w1: element [0, 5, 17] is NaN; INT4 quantization needs finite weights"
std::string int4_nonfinite_message(std::string_view tensor_name, const int4_shape& shape,
                                   uint64_t flat_index, uint16_t bf16_bits);
// "experts.3.w1: int4-asym quantization: k (input features) = 100 is not a multiple of 8 ..."
std::string int4_shape_message(std::string_view tensor_name, std::string_view what,
                               const std::string& problem);

// What is wrong with the arguments (shape, recipe, missing buffer), as a sentence; empty = fine.
std::string int4_quant_problem(const int4_quant_args& args);
std::string int4_quant_serving_problem(const int4_quant_serving_args& args);

// CPU: shape problems and non-finite weights become a failure naming `tensor_name`. The
// `nonfinite` field may be null here.
rlserve::status int4_quantize(int4_quant_args args, std::string_view tensor_name);
rlserve::status int4_quantize_serving(int4_quant_serving_args args, std::string_view tensor_name);
// CUDA: launches, waits for `stream`, and reads the non-finite flag back. `nonfinite` may be null
// (a temporary device word is used then).
rlserve::status int4_quantize_device(int4_quant_args args, std::string_view tensor_name,
                                     cudaStream_t stream);
rlserve::status int4_quantize_serving_device(int4_quant_serving_args args,
                                             std::string_view tensor_name, cudaStream_t stream);

} // namespace rlserve::kernels
