// compressed-tensors `pack-quantized` (WNA16, 4 bits) load format: packing of codes and zero
// points, the two zero-point layouts (standard and miles/AWQ-interleaved), telling them apart,
// and a reference dequantizer. The bit order is defined in kernels/int4_format.hpp and drawn in
// docs/formats.md. CPU only: these run on checkpoint tensors and in tests; the GPU works on the
// serving layout (kernels/serving_layout.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/int4_format.hpp"
#include "kernels/kernel_status.hpp"
#include "messages/expected.hpp"

namespace rlserve::kernels {

// ---- weights ----------------------------------------------------------------------------------

// codes [rows, k], one code 0..15 per byte  ->  weight_packed [rows, k/8]
// (code (r, c) in word (r, c/8), bits 4*(c%8)..+3). invalid_problem if k % 8 != 0 or a code > 15.
kernel_status ct_pack_weight_ref(const uint8_t* codes, // [rows, k]
                                 int32_t* packed,      // [rows, k/8]
                                 int64_t rows, int64_t k);
// The inverse (every word is valid: 8 codes of 4 bits).
kernel_status ct_unpack_weight_ref(const int32_t* packed, // [rows, k/8]
                                   uint8_t* codes,        // [rows, k]
                                   int64_t rows, int64_t k);

// ---- zero points ------------------------------------------------------------------------------

// zero-point codes [batch, n, k/G] (one code 0..15 per byte, the natural [n, groups] matrix)
//   -> weight_zero_point in `layout`: standard [batch, n/8, k/G] or miles [batch, k/G, n/8].
kernel_status ct_pack_zero_point_ref(const uint8_t* zp, // [batch, n, k/G]
                                     int32_t* packed,   // layout-dependent, see above
                                     const int4_shape& shape, zero_point_layout layout);
kernel_status ct_unpack_zero_point_ref(const int32_t* packed, uint8_t* zp, const int4_shape& shape,
                                       zero_point_layout layout);
// Re-packs zero points from one layout into the other (a standard checkpoint fed to the
// miles-layout MoE path, or the reverse). `in` and `out` must not overlap.
kernel_status ct_convert_zero_point_ref(const int32_t* in, zero_point_layout from, int32_t* out,
                                        zero_point_layout to, const int4_shape& shape);

// What the caller knows about the layout of a weight_zero_point tensor.
enum class zero_point_layout_hint : uint8_t {
  auto_detect = 0, // decide from the shape; ambiguous when n/8 == k/G (then a hint is required)
  standard,        // the checkpoint says compressed-tensors standard [n/8, k/G]
  miles,           // the checkpoint says miles/AWQ [k/G, n/8]
};

// Tells the two layouts apart from the tensor's shape (its last two dimensions; a leading batch
// dimension must equal shape.batch) and the hint. Failures name the tensor and the shapes that
// would have fitted: "<name>: weight_zero_point has shape [16, 4], which is neither the
// standard [n/8, k/G] = [8, 16] nor the miles [k/G, n/8] = [16, 8] layout".
rlserve::expected<zero_point_layout> detect_zero_point_layout(std::span<const int64_t> zp_shape,
                                                              const int4_shape& shape,
                                                              zero_point_layout_hint hint,
                                                              std::string_view tensor_name);

// Checks the shapes of one module's load-format tensors against its weight_shape (n, k) and the
// configured group size (k_int4_channel for strategy "channel") and returns the problem shape.
// weight_packed must be [.., n, k/8]; weight_scale [.., n, k/G]; a leading dimension (experts)
// must agree between the two and becomes shape.batch.
rlserve::expected<int4_shape> ct_infer_shape(std::span<const int64_t> packed_shape,
                                             std::span<const int64_t> scale_shape, int64_t n,
                                             int64_t k, int32_t group_size,
                                             std::string_view tensor_name);

// ---- reference dequantizer --------------------------------------------------------------------

struct ct_dequant_args {
  int4_shape shape;
  bool has_zero_point = false;                               // asymmetric; else z = 8
  zero_point_layout zp_layout = zero_point_layout::standard; // of weight_zero_point
  int4_scale_type scale_type = int4_scale_type::bf16;
  const int32_t* weight_packed = nullptr;     // [batch, n, k/8]
  const uint16_t* weight_scale = nullptr;     // [batch, n, k/G] bf16 or f16 bits
  const int32_t* weight_zero_point = nullptr; // asym: layout-dependent
  uint16_t* out = nullptr;                    // bf16 bits [batch, n, k]: bf16_rn((q - z) * scale)
};

kernel_status ct_dequant_can_implement(const ct_dequant_args& args);
kernel_status ct_dequant_ref(const ct_dequant_args& args);

} // namespace rlserve::kernels
