// Serving layout of INT4 weights: repack from the compressed-tensors load format into the
// Marlin-style tiles the W4A16 GEMM and fused-MoE kernels read, and `restore`, its exact inverse
// (pure permutations of nibbles and 16-bit words, so restore(repack(x)) == x for ANY bits and a
// partial weight update leaves untouched tensors bit-identical). Maps: kernels/int4_format.hpp;
// the picture in words: docs/formats.md.
//
// Repack does, per matrix (= per expert):
//   weight_packed [n, k/8]  -> weight [k/16, 2n]    transpose to [k, n], 16x64 tiles, lane order,
//                                                   [0,2,4,6,1,3,5,7] nibble interleave
//   weight_scale  [n, k/G]  -> scale  [k/G, n]      transpose, 64-column 8x8 transpose blocks
//                                                   (32-column "single" permutation if k/G == 1)
//   zero_point    [n/8,k/G] or [k/G,n/8] -> [k/G, n/8]   unpack (undo AWQ order for miles),
//                                                   64-column block permutation, interleave, pack
// Shapes the tiles cannot hold (k % 16, n % 64) are invalid_problem; the host wrappers say which
// dimension and which multiple.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/int4_format.hpp"
#include "kernels/kernel_status.hpp"
#include "messages/expected.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

struct serving_repack_args {
  int4_shape shape;
  bool has_zero_point = false;                               // asymmetric
  zero_point_layout zp_layout = zero_point_layout::standard; // of weight_zero_point
  const int32_t* weight_packed = nullptr;     // [batch, n, k/8]
  const uint16_t* weight_scale = nullptr;     // [batch, n, k/G] 16-bit words (moved, never read)
  const int32_t* weight_zero_point = nullptr; // asym: [batch, n/8, k/G] | [batch, k/G, n/8]
  int32_t* serving_weight = nullptr;          // [batch, k/16, 2n]
  uint16_t* serving_scale = nullptr;          // [batch, k/G, n]
  int32_t* serving_zero_point = nullptr;      // asym: [batch, k/G, n/8]
};

struct serving_restore_args {
  int4_shape shape;
  bool has_zero_point = false;
  zero_point_layout zp_layout = zero_point_layout::standard; // layout to write (what was loaded)
  const int32_t* serving_weight = nullptr;     // [batch, k/16, 2n]
  const uint16_t* serving_scale = nullptr;     // [batch, k/G, n]
  const int32_t* serving_zero_point = nullptr; // asym: [batch, k/G, n/8]
  int32_t* weight_packed = nullptr;            // [batch, n, k/8]
  uint16_t* weight_scale = nullptr;            // [batch, n, k/G]
  int32_t* weight_zero_point = nullptr;        // asym: layout-dependent
};

kernel_status serving_repack_can_implement(const serving_repack_args& args);
kernel_status serving_repack_ref(const serving_repack_args& args);
kernel_status serving_repack_launch(const serving_repack_args& args, cudaStream_t stream);

kernel_status serving_restore_can_implement(const serving_restore_args& args);
kernel_status serving_restore_ref(const serving_restore_args& args);
kernel_status serving_restore_launch(const serving_restore_args& args, cudaStream_t stream);

// What is wrong with the arguments, as a sentence naming the dimension and the multiple it needs
// (or the missing buffer); empty when the call can run.
std::string serving_repack_problem(const serving_repack_args& args);
std::string serving_restore_problem(const serving_restore_args& args);

// Host wrappers (CPU): shape problems as sentences naming the tensor, e.g. "<name>: serving
// repack: n (output features) = 100 is not a multiple of 64 (the serving layout stores 16 (k) x
// 64 (n) tiles)".
rlserve::status serving_repack(const serving_repack_args& args, std::string_view tensor_name);
rlserve::status serving_restore(const serving_restore_args& args, std::string_view tensor_name);
// CUDA: the same checks, then launch on `stream` (asynchronous; no data errors exist here).
rlserve::status serving_repack_device(const serving_repack_args& args, std::string_view tensor_name,
                                      cudaStream_t stream);
rlserve::status serving_restore_device(const serving_restore_args& args,
                                       std::string_view tensor_name, cudaStream_t stream);

// ---- reference dequantizer reading the serving layout directly ---------------------------------
// Walks (b, n, k) and finds each code, scale and zero point through the INVERSE maps
// (serving_weight_word, serving_scale_position, serving_zp_word), while repack uses the forward
// maps: the property test dequant(serving) == dequant(load) checks one against the other.

struct serving_dequant_args {
  int4_shape shape;
  bool has_zero_point = false; // asymmetric; else z = 8
  int4_scale_type scale_type = int4_scale_type::bf16;
  const int32_t* serving_weight = nullptr;     // [batch, k/16, 2n]
  const uint16_t* serving_scale = nullptr;     // [batch, k/G, n]
  const int32_t* serving_zero_point = nullptr; // asym: [batch, k/G, n/8]
  uint16_t* out = nullptr;                     // bf16 bits [batch, n, k]
};

kernel_status serving_dequant_can_implement(const serving_dequant_args& args);
kernel_status serving_dequant_ref(const serving_dequant_args& args);

} // namespace rlserve::kernels
