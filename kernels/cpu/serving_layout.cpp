#include "kernels/serving_layout.hpp"

#include <string>

#include "kernels/bf16.hpp"
#include "kernels/int4_quant.hpp"

namespace rlserve::kernels {

namespace {

// Zero point (b, n, g) of the load format: word index within the batch, and slot.
int64_t ct_zp_word(const int4_shape& s, zero_point_layout layout, int64_t b, int64_t n, int64_t g,
                   int* slot) {
  const int64_t groups = int4_groups(s);
  const int64_t w = layout == zero_point_layout::standard ? ct_zp_standard_word(n, g, groups, slot)
                                                          : ct_zp_miles_word(n, g, s.n, slot);
  return b * (s.n / 8) * groups + w;
}

} // namespace

// ---- repack -------------------------------------------------------------------------------------

kernel_status serving_repack_can_implement(const serving_repack_args& a) {
  if (!int4_check_serving_shape(a.shape).empty())
    return kernel_status::invalid_problem;
  if (a.weight_packed == nullptr || a.weight_scale == nullptr || a.serving_weight == nullptr ||
      a.serving_scale == nullptr)
    return kernel_status::invalid_problem;
  if (a.has_zero_point && (a.weight_zero_point == nullptr || a.serving_zero_point == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status serving_repack_ref(const serving_repack_args& a) {
  if (auto st = serving_repack_can_implement(a); st != kernel_status::ok)
    return st;
  const auto& s = a.shape;
  const int64_t groups = int4_groups(s);
  const int64_t kw = s.k / 8;                 // load-format words per row
  const int64_t words = s.k * s.n / 8;        // serving words per matrix
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t* src = a.weight_packed + b * s.n * kw;
    int32_t* dst = a.serving_weight + b * words;
    for (int64_t w = 0; w < words; ++w) {
      uint32_t word = 0;
      for (int e = 0; e < 8; ++e) {
        int64_t k = 0, n = 0;
        serving_weight_source(w, e, s.n, &k, &n);
        uint32_t code = int4_get_nibble(static_cast<uint32_t>(src[n * kw + k / 8]), static_cast<int>(k % 8));
        word = int4_put_nibble(word, int4_interleave_slot(e), code);
      }
      dst[w] = static_cast<int32_t>(word);
    }
  }
  const bool single = groups == 1;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t p = 0; p < s.n; ++p) {
        int64_t n = serving_scale_source(p, single);
        a.serving_scale[(b * groups + g) * s.n + p] = a.weight_scale[(b * s.n + n) * groups + g];
      }
  if (a.has_zero_point)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t m = 0; m < s.n / 8; ++m) {
          uint32_t word = 0;
          for (int slot = 0; slot < 8; ++slot) {
            int src_slot = 0;
            int64_t src = ct_zp_word(s, a.zp_layout, b, serving_zp_source(m, slot), g, &src_slot);
            word = int4_put_nibble(word, slot,
                                   int4_get_nibble(static_cast<uint32_t>(a.weight_zero_point[src]), src_slot));
          }
          a.serving_zero_point[(b * groups + g) * (s.n / 8) + m] = static_cast<int32_t>(word);
        }
  return kernel_status::ok;
}

// ---- restore: the same forward maps, scattering back ---------------------------------------------

kernel_status serving_restore_can_implement(const serving_restore_args& a) {
  if (!int4_check_serving_shape(a.shape).empty())
    return kernel_status::invalid_problem;
  if (a.serving_weight == nullptr || a.serving_scale == nullptr || a.weight_packed == nullptr ||
      a.weight_scale == nullptr)
    return kernel_status::invalid_problem;
  if (a.has_zero_point && (a.serving_zero_point == nullptr || a.weight_zero_point == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status serving_restore_ref(const serving_restore_args& a) {
  if (auto st = serving_restore_can_implement(a); st != kernel_status::ok)
    return st;
  const auto& s = a.shape;
  const int64_t groups = int4_groups(s);
  const int64_t kw = s.k / 8;
  const int64_t words = s.k * s.n / 8;
  for (int64_t i = 0; i < ct_weight_packed_words(s); ++i)
    a.weight_packed[i] = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t* src = a.serving_weight + b * words;
    int32_t* dst = a.weight_packed + b * s.n * kw;
    for (int64_t w = 0; w < words; ++w)
      for (int e = 0; e < 8; ++e) {
        int64_t k = 0, n = 0;
        serving_weight_source(w, e, s.n, &k, &n);
        uint32_t code = int4_get_nibble(static_cast<uint32_t>(src[w]), int4_interleave_slot(e));
        int32_t& out = dst[n * kw + k / 8];
        out = static_cast<int32_t>(int4_put_nibble(static_cast<uint32_t>(out), static_cast<int>(k % 8), code));
      }
  }
  const bool single = groups == 1;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t p = 0; p < s.n; ++p) {
        int64_t n = serving_scale_source(p, single);
        a.weight_scale[(b * s.n + n) * groups + g] = a.serving_scale[(b * groups + g) * s.n + p];
      }
  if (a.has_zero_point) {
    for (int64_t i = 0; i < ct_zero_point_words(s); ++i)
      a.weight_zero_point[i] = 0;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t m = 0; m < s.n / 8; ++m) {
          auto word = static_cast<uint32_t>(a.serving_zero_point[(b * groups + g) * (s.n / 8) + m]);
          for (int slot = 0; slot < 8; ++slot) {
            int dst_slot = 0;
            int64_t dst = ct_zp_word(s, a.zp_layout, b, serving_zp_source(m, slot), g, &dst_slot);
            a.weight_zero_point[dst] = static_cast<int32_t>(
              int4_put_nibble(static_cast<uint32_t>(a.weight_zero_point[dst]), dst_slot, int4_get_nibble(word, slot)));
          }
        }
  }
  return kernel_status::ok;
}

// ---- reference dequantizer: inverse maps ----------------------------------------------------------

kernel_status serving_dequant_can_implement(const serving_dequant_args& a) {
  if (!int4_check_serving_shape(a.shape).empty())
    return kernel_status::invalid_problem;
  if (a.serving_weight == nullptr || a.serving_scale == nullptr || a.out == nullptr ||
      (a.has_zero_point && a.serving_zero_point == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status serving_dequant_ref(const serving_dequant_args& a) {
  if (auto st = serving_dequant_can_implement(a); st != kernel_status::ok)
    return st;
  const auto& s = a.shape;
  const int64_t groups = int4_groups(s), glen = int4_group_len(s);
  const bool single = groups == 1;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t* wq = a.serving_weight + b * (s.k * s.n / 8);
    const uint16_t* sc = a.serving_scale + b * groups * s.n;
    const int32_t* zp = a.has_zero_point ? a.serving_zero_point + b * groups * (s.n / 8) : nullptr;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t k = 0; k < s.k; ++k) {
        const int64_t g = k / glen;
        int slot = 0;
        int64_t w = serving_weight_word(k, n, s.n, &slot);
        uint32_t q = int4_get_nibble(static_cast<uint32_t>(wq[w]), slot);
        uint16_t sb = sc[g * s.n + serving_scale_position(n, single)];
        float scale = a.scale_type == int4_scale_type::bf16 ? bf16_to_float(sb) : f16_to_float(sb);
        int32_t z = 8;
        if (zp) {
          int zslot = 0;
          int64_t zw = serving_zp_word(n, &zslot);
          z = static_cast<int32_t>(int4_get_nibble(static_cast<uint32_t>(zp[g * (s.n / 8) + zw]), zslot));
        }
        a.out[(b * s.n + n) * s.k + k] = float_to_bf16(int4_dequant_float(q, z, scale));
      }
  }
  return kernel_status::ok;
}

// ---- host wrappers ----------------------------------------------------------------------------------

std::string serving_repack_problem(const serving_repack_args& a) {
  if (auto m = int4_check_serving_shape(a.shape); !m.empty())
    return m;
  if (a.weight_packed == nullptr || a.weight_scale == nullptr)
    return "weight_packed and weight_scale are required";
  if (a.serving_weight == nullptr || a.serving_scale == nullptr)
    return "the serving weight and scale buffers are required";
  if (a.has_zero_point && (a.weight_zero_point == nullptr || a.serving_zero_point == nullptr))
    return "asymmetric weights need weight_zero_point and a serving zero-point buffer";
  return {};
}

std::string serving_restore_problem(const serving_restore_args& a) {
  if (auto m = int4_check_serving_shape(a.shape); !m.empty())
    return m;
  if (a.serving_weight == nullptr || a.serving_scale == nullptr)
    return "the serving weight and scale are required";
  if (a.weight_packed == nullptr || a.weight_scale == nullptr)
    return "the weight_packed and weight_scale buffers are required";
  if (a.has_zero_point && (a.weight_zero_point == nullptr || a.serving_zero_point == nullptr))
    return "asymmetric weights need the serving zero points and a weight_zero_point buffer";
  return {};
}

rlserve::status serving_repack(const serving_repack_args& a, std::string_view name) {
  if (auto m = serving_repack_problem(a); !m.empty())
    return rlserve::fail(int4_shape_message(name, "serving repack", m));
  if (auto st = serving_repack_ref(a); st != kernel_status::ok)
    return rlserve::fail(int4_shape_message(name, "serving repack", std::string(to_string(st))));
  return {};
}

rlserve::status serving_restore(const serving_restore_args& a, std::string_view name) {
  if (auto m = serving_restore_problem(a); !m.empty())
    return rlserve::fail(int4_shape_message(name, "serving restore", m));
  if (auto st = serving_restore_ref(a); st != kernel_status::ok)
    return rlserve::fail(int4_shape_message(name, "serving restore", std::string(to_string(st))));
  return {};
}

} // namespace rlserve::kernels
