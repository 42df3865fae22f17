#include "kernels/compressed_tensors.hpp"

#include <string>

#include "kernels/bf16.hpp"
#include "kernels/int4_quant.hpp"

namespace rlserve::kernels {

namespace {

std::string shape_text(std::span<const int64_t> s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string dims2(int64_t a, int64_t b) {
  std::string out = "[";
  out += std::to_string(a);
  out += ", ";
  out += std::to_string(b);
  return out + "]";
}

std::string prefixed(std::string_view name, const std::string& msg) {
  return name.empty() ? msg : std::string(name) + ": " + msg;
}

// Word index (within the whole batch) and slot of zero point (b, n, g).
int64_t zp_word(const int4_shape& s, zero_point_layout layout, int64_t b, int64_t n, int64_t g,
                int* slot) {
  const int64_t groups = int4_groups(s);
  const int64_t per_matrix = (s.n / 8) * groups;
  const int64_t w = layout == zero_point_layout::standard ? ct_zp_standard_word(n, g, groups, slot)
                                                          : ct_zp_miles_word(n, g, s.n, slot);
  return b * per_matrix + w;
}

} // namespace

kernel_status ct_pack_weight_ref(const uint8_t* codes, int32_t* packed, int64_t rows, int64_t k) {
  if (rows < 0 || k < 0 || k % 8 != 0 || ((codes == nullptr || packed == nullptr) && rows * k > 0))
    return kernel_status::invalid_problem;
  for (int64_t i = 0; i < rows * k; ++i)
    if (codes[i] > 15)
      return kernel_status::invalid_problem;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k / 8; ++j) {
      uint32_t word = 0;
      for (int s = 0; s < 8; ++s)
        word |= static_cast<uint32_t>(codes[r * k + 8 * j + s]) << (4 * s);
      packed[r * (k / 8) + j] = static_cast<int32_t>(word);
    }
  return kernel_status::ok;
}

kernel_status ct_unpack_weight_ref(const int32_t* packed, uint8_t* codes, int64_t rows, int64_t k) {
  if (rows < 0 || k < 0 || k % 8 != 0 || ((codes == nullptr || packed == nullptr) && rows * k > 0))
    return kernel_status::invalid_problem;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k / 8; ++j) {
      auto word = static_cast<uint32_t>(packed[r * (k / 8) + j]);
      for (int s = 0; s < 8; ++s)
        codes[r * k + 8 * j + s] = static_cast<uint8_t>(int4_get_nibble(word, s));
    }
  return kernel_status::ok;
}

kernel_status ct_pack_zero_point_ref(const uint8_t* zp, int32_t* packed, const int4_shape& s,
                                     zero_point_layout layout) {
  if (!int4_check_load_shape(s, true).empty() || zp == nullptr || packed == nullptr)
    return kernel_status::invalid_problem;
  const int64_t groups = int4_groups(s);
  for (int64_t i = 0; i < s.batch * s.n * groups; ++i)
    if (zp[i] > 15)
      return kernel_status::invalid_problem;
  for (int64_t i = 0; i < ct_zero_point_words(s); ++i)
    packed[i] = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        int slot = 0;
        int64_t w = zp_word(s, layout, b, n, g, &slot);
        packed[w] = static_cast<int32_t>(int4_put_nibble(static_cast<uint32_t>(packed[w]), slot,
                                                         zp[(b * s.n + n) * groups + g]));
      }
  return kernel_status::ok;
}

kernel_status ct_unpack_zero_point_ref(const int32_t* packed, uint8_t* zp, const int4_shape& s,
                                       zero_point_layout layout) {
  if (!int4_check_load_shape(s, true).empty() || zp == nullptr || packed == nullptr)
    return kernel_status::invalid_problem;
  const int64_t groups = int4_groups(s);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        int slot = 0;
        int64_t w = zp_word(s, layout, b, n, g, &slot);
        zp[(b * s.n + n) * groups + g] =
          static_cast<uint8_t>(int4_get_nibble(static_cast<uint32_t>(packed[w]), slot));
      }
  return kernel_status::ok;
}

kernel_status ct_convert_zero_point_ref(const int32_t* in, zero_point_layout from, int32_t* out,
                                        zero_point_layout to, const int4_shape& s) {
  if (!int4_check_load_shape(s, true).empty() || in == nullptr || out == nullptr || in == out)
    return kernel_status::invalid_problem;
  const int64_t groups = int4_groups(s);
  for (int64_t i = 0; i < ct_zero_point_words(s); ++i)
    out[i] = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        int src_slot = 0, dst_slot = 0;
        int64_t src = zp_word(s, from, b, n, g, &src_slot);
        int64_t dst = zp_word(s, to, b, n, g, &dst_slot);
        uint32_t code = int4_get_nibble(static_cast<uint32_t>(in[src]), src_slot);
        out[dst] = static_cast<int32_t>(int4_put_nibble(static_cast<uint32_t>(out[dst]), dst_slot, code));
      }
  return kernel_status::ok;
}

rlserve::expected<zero_point_layout> detect_zero_point_layout(std::span<const int64_t> zp_shape,
                                                              const int4_shape& s,
                                                              zero_point_layout_hint hint,
                                                              std::string_view name) {
  if (auto m = int4_check_load_shape(s, true); !m.empty())
    return rlserve::fail(prefixed(name, "weight_zero_point: " + m));
  const int64_t rows8 = s.n / 8, groups = int4_groups(s);
  const std::string standard = "the standard [n/8, k/G] = " + dims2(rows8, groups);
  const std::string miles = "the miles [k/G, n/8] = " + dims2(groups, rows8);
  if (zp_shape.size() < 2 || zp_shape.size() > 3)
    return rlserve::fail(prefixed(name, "weight_zero_point has shape " + shape_text(zp_shape) +
                                          "; expected 2 dimensions (" + standard + " or " + miles +
                                          ") or 3 with experts first"));
  if (zp_shape.size() == 3 && zp_shape[0] != s.batch)
    return rlserve::fail(prefixed(name, "weight_zero_point has shape " + shape_text(zp_shape) +
                                          ", but there are " + std::to_string(s.batch) +
                                          " experts"));
  if (zp_shape.size() == 2 && s.batch != 1)
    return rlserve::fail(prefixed(name, "weight_zero_point has shape " + shape_text(zp_shape) +
                                          " without an experts dimension, but there are " +
                                          std::to_string(s.batch) + " experts"));
  const int64_t r = zp_shape[zp_shape.size() - 2], c = zp_shape[zp_shape.size() - 1];
  const bool fits_standard = r == rows8 && c == groups;
  const bool fits_miles = r == groups && c == rows8;
  switch (hint) {
    case zero_point_layout_hint::standard:
      if (fits_standard)
        return zero_point_layout::standard;
      return rlserve::fail(prefixed(name, "weight_zero_point has shape " + shape_text(zp_shape) +
                                            ", but the configuration says " + standard));
    case zero_point_layout_hint::miles:
      if (fits_miles)
        return zero_point_layout::miles;
      return rlserve::fail(prefixed(name, "weight_zero_point has shape " + shape_text(zp_shape) +
                                            ", but the configuration says " + miles));
    case zero_point_layout_hint::auto_detect:
      if (fits_standard && fits_miles)
        return rlserve::fail(prefixed(
          name, "weight_zero_point has shape " + shape_text(zp_shape) +
                  ", which fits both " + standard + " and " + miles +
                  " (n/8 == k/G); the zero-point layout must be given explicitly (standard or miles)"));
      if (fits_standard)
        return zero_point_layout::standard;
      if (fits_miles)
        return zero_point_layout::miles;
      return rlserve::fail(prefixed(name, "weight_zero_point has shape " + shape_text(zp_shape) +
                                            ", which is neither " + standard + " nor " + miles +
                                            " layout"));
  }
  return rlserve::fail(prefixed(name, "unknown zero-point layout hint"));
}

rlserve::expected<int4_shape> ct_infer_shape(std::span<const int64_t> packed_shape,
                                             std::span<const int64_t> scale_shape, int64_t n,
                                             int64_t k, int32_t group_size,
                                             std::string_view name) {
  int4_shape s;
  s.n = n;
  s.k = k;
  s.group_size = group_size;
  if (packed_shape.size() < 2 || packed_shape.size() > 3)
    return rlserve::fail(prefixed(name, "weight_packed has shape " + shape_text(packed_shape) +
                                          "; expected [n, k/8] or [experts, n, k/8]"));
  s.batch = packed_shape.size() == 3 ? packed_shape[0] : 1;
  if (auto m = int4_check_load_shape(s, false); !m.empty())
    return rlserve::fail(prefixed(name, m));
  const int64_t groups = int4_groups(s);
  auto lead = [&](std::span<const int64_t> t) {
    std::string out = "[";
    if (t.size() == 3) {
      out += std::to_string(s.batch);
      out += ", ";
    }
    return out;
  };
  if (packed_shape[packed_shape.size() - 2] != n || packed_shape.back() != k / 8)
    return rlserve::fail(prefixed(name, "weight_packed has shape " + shape_text(packed_shape) +
                                          ", but weight_shape (" + std::to_string(n) + ", " +
                                          std::to_string(k) + ") needs " + lead(packed_shape) +
                                          std::to_string(n) + ", " + std::to_string(k / 8) + "]"));
  if (scale_shape.size() != packed_shape.size() ||
      (scale_shape.size() == 3 && scale_shape[0] != s.batch) ||
      scale_shape[scale_shape.size() - 2] != n || scale_shape.back() != groups)
    return rlserve::fail(prefixed(
      name, "weight_scale has shape " + shape_text(scale_shape) + ", but n = " + std::to_string(n) +
              ", k = " + std::to_string(k) + " and group size " + std::to_string(group_size) +
              " need " + lead(packed_shape) + std::to_string(n) + ", " + std::to_string(groups) + "]"));
  return s;
}

kernel_status ct_dequant_can_implement(const ct_dequant_args& a) {
  if (!int4_check_load_shape(a.shape, a.has_zero_point).empty())
    return kernel_status::invalid_problem;
  if (a.weight_packed == nullptr || a.weight_scale == nullptr || a.out == nullptr ||
      (a.has_zero_point && a.weight_zero_point == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status ct_dequant_ref(const ct_dequant_args& a) {
  if (auto st = ct_dequant_can_implement(a); st != kernel_status::ok)
    return st;
  const auto& s = a.shape;
  const int64_t groups = int4_groups(s), glen = int4_group_len(s);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t k = 0; k < s.k; ++k) {
        const int64_t row = b * s.n + n, g = k / glen;
        uint32_t q = int4_get_nibble(static_cast<uint32_t>(a.weight_packed[row * (s.k / 8) + k / 8]),
                                     static_cast<int>(k % 8));
        uint16_t sb = a.weight_scale[row * groups + g];
        float scale = a.scale_type == int4_scale_type::bf16 ? bf16_to_float(sb) : f16_to_float(sb);
        int32_t z = 8;
        if (a.has_zero_point) {
          int slot = 0;
          int64_t w = zp_word(s, a.zp_layout, b, n, g, &slot);
          z = static_cast<int32_t>(int4_get_nibble(static_cast<uint32_t>(a.weight_zero_point[w]), slot));
        }
        a.out[row * s.k + k] = float_to_bf16(int4_dequant_float(q, z, scale));
      }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
