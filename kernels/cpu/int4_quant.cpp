#include "kernels/int4_quant.hpp"

#include <vector>

#include "kernels/serving_layout.hpp"

namespace rlserve::kernels {

namespace {

bool recipe_known(int4_recipe r) {
  return r == int4_recipe::sym_qat || r == int4_recipe::sym || r == int4_recipe::asym;
}

bool layout_known(zero_point_layout l) {
  return l == zero_point_layout::standard || l == zero_point_layout::miles;
}

} // namespace

// ---- argument checks ----------------------------------------------------------------------------

std::string int4_quant_problem(const int4_quant_args& a) {
  if (!recipe_known(a.recipe))
    return "unknown INT4 recipe " + std::to_string(static_cast<int>(a.recipe));
  const bool asym = a.recipe == int4_recipe::asym;
  if (auto m = int4_check_load_shape(a.shape, asym); !m.empty())
    return m;
  if (asym && !layout_known(a.zp_layout))
    return "unknown zero-point layout " + std::to_string(static_cast<int>(a.zp_layout));
  if (a.w == nullptr)
    return "the bf16 weight is required";
  if (a.weight_packed == nullptr || a.weight_scale == nullptr)
    return "the weight_packed and weight_scale buffers are required";
  if (asym && a.weight_zero_point == nullptr)
    return "asymmetric quantization needs a weight_zero_point buffer";
  if (a.nonfinite == nullptr)
    return "the non-finite flag word is required";
  return {};
}

std::string int4_quant_serving_problem(const int4_quant_serving_args& a) {
  if (!recipe_known(a.recipe))
    return "unknown INT4 recipe " + std::to_string(static_cast<int>(a.recipe));
  if (auto m = int4_check_serving_shape(a.shape); !m.empty())
    return m;
  if (a.w == nullptr)
    return "the bf16 weight is required";
  if (a.serving_weight == nullptr || a.serving_scale == nullptr)
    return "the serving weight and scale buffers are required";
  if (a.recipe == int4_recipe::asym && a.serving_zero_point == nullptr)
    return "asymmetric quantization needs a serving zero-point buffer";
  if (a.nonfinite == nullptr)
    return "the non-finite flag word is required";
  return {};
}

kernel_status int4_quant_can_implement(const int4_quant_args& a) {
  return int4_quant_problem(a).empty() ? kernel_status::ok : kernel_status::invalid_problem;
}

kernel_status int4_quant_serving_can_implement(const int4_quant_serving_args& a) {
  return int4_quant_serving_problem(a).empty() ? kernel_status::ok : kernel_status::invalid_problem;
}

// ---- CPU reference ------------------------------------------------------------------------------

kernel_status int4_quantize_ref(const int4_quant_args& a) {
  if (auto st = int4_quant_can_implement(a); st != kernel_status::ok)
    return st;
  const auto& s = a.shape;
  const bool asym = a.recipe == int4_recipe::asym;
  const int64_t glen = int4_group_len(s), groups = int4_groups(s), kw = s.k / 8;
  uint64_t first_bad = k_int4_all_finite;
  if (asym)
    for (int64_t i = 0; i < ct_zero_point_words(s); ++i)
      a.weight_zero_point[i] = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t row = b * s.n + n;
      const uint16_t* x = a.w + row * s.k;
      for (int64_t g = 0; g < groups; ++g) {
        int4_group_stats st;
        for (int64_t i = g * glen; i < (g + 1) * glen; ++i) {
          if (!int4_bf16_is_finite(x[i]) && first_bad == k_int4_all_finite)
            first_bad = static_cast<uint64_t>(row * s.k + i); // flat order: the first is the least
          int4_stats_add(st, int4_bf16_to_float(x[i]));
        }
        const int4_group_params p = int4_params(a.recipe, st);
        a.weight_scale[row * groups + g] = int4_float_to_bf16(p.scale);
        for (int64_t j = g * glen / 8; j < (g + 1) * glen / 8; ++j) {
          uint32_t word = 0;
          for (int e = 0; e < 8; ++e)
            word |= int4_code(a.recipe, int4_bf16_to_float(x[8 * j + e]), p) << (4 * e);
          a.weight_packed[row * kw + j] = static_cast<int32_t>(word);
        }
        if (asym) {
          int slot = 0;
          int64_t w = a.zp_layout == zero_point_layout::standard
                        ? ct_zp_standard_word(n, g, groups, &slot)
                        : ct_zp_miles_word(n, g, s.n, &slot);
          int32_t& out = a.weight_zero_point[b * (s.n / 8) * groups + w];
          out = static_cast<int32_t>(int4_put_nibble(static_cast<uint32_t>(out), slot,
                                                     static_cast<uint32_t>(p.zero)));
        }
      }
    }
  *a.nonfinite = first_bad;
  return kernel_status::ok;
}

kernel_status int4_quantize_serving_ref(const int4_quant_serving_args& a) {
  if (auto st = int4_quant_serving_can_implement(a); st != kernel_status::ok)
    return st;
  const bool asym = a.recipe == int4_recipe::asym;
  std::vector<int32_t> packed(static_cast<std::size_t>(ct_weight_packed_words(a.shape)));
  std::vector<uint16_t> scale(static_cast<std::size_t>(ct_scale_count(a.shape)));
  std::vector<int32_t> zp(asym ? static_cast<std::size_t>(ct_zero_point_words(a.shape)) : 0);
  int4_quant_args q;
  q.shape = a.shape;
  q.recipe = a.recipe;
  q.zp_layout = zero_point_layout::standard;
  q.w = a.w;
  q.weight_packed = packed.data();
  q.weight_scale = scale.data();
  q.weight_zero_point = asym ? zp.data() : nullptr;
  q.nonfinite = a.nonfinite;
  if (auto st = int4_quantize_ref(q); st != kernel_status::ok)
    return st;
  serving_repack_args r;
  r.shape = a.shape;
  r.has_zero_point = asym;
  r.zp_layout = zero_point_layout::standard;
  r.weight_packed = packed.data();
  r.weight_scale = scale.data();
  r.weight_zero_point = q.weight_zero_point;
  r.serving_weight = a.serving_weight;
  r.serving_scale = a.serving_scale;
  r.serving_zero_point = asym ? a.serving_zero_point : nullptr;
  return serving_repack_ref(r);
}

// ---- messages and host wrappers -----------------------------------------------------------------

std::string int4_shape_message(std::string_view name, std::string_view what,
                               const std::string& problem) {
  std::string out(name);
  if (!out.empty())
    out += ": ";
  if (!what.empty())
    out += std::string(what) + ": ";
  return out + problem;
}

std::string int4_nonfinite_message(std::string_view name, const int4_shape& s, uint64_t idx,
                                   uint16_t bits) {
  const auto i = static_cast<int64_t>(idx);
  const int64_t col = i % s.k, row = (i / s.k) % s.n, b = i / (s.k * s.n);
  std::string where = "[";
  if (s.batch > 1)
    where += std::to_string(b) + ", ";
  where += std::to_string(row) + ", " + std::to_string(col) + "]";
  const char* what = (bits & 0x7fffu) > 0x7f80u ? "NaN" : ((bits & 0x8000u) ? "-Inf" : "+Inf");
  std::string out(name);
  if (!out.empty())
    out += ": ";
  return out + "element " + where + " is " + what + "; INT4 quantization needs finite weights";
}

rlserve::status int4_quantize(int4_quant_args a, std::string_view name) {
  uint64_t local = k_int4_all_finite;
  if (a.nonfinite == nullptr)
    a.nonfinite = &local;
  const std::string what = std::string(to_string(a.recipe)) + " quantization";
  if (auto m = int4_quant_problem(a); !m.empty())
    return rlserve::fail(int4_shape_message(name, what, m));
  if (auto st = int4_quantize_ref(a); st != kernel_status::ok)
    return rlserve::fail(int4_shape_message(name, what, std::string(to_string(st))));
  if (*a.nonfinite != k_int4_all_finite)
    return rlserve::fail(int4_nonfinite_message(name, a.shape, *a.nonfinite, a.w[*a.nonfinite]));
  return {};
}

rlserve::status int4_quantize_serving(int4_quant_serving_args a, std::string_view name) {
  uint64_t local = k_int4_all_finite;
  if (a.nonfinite == nullptr)
    a.nonfinite = &local;
  const std::string what = std::string(to_string(a.recipe)) + " quantization";
  if (auto m = int4_quant_serving_problem(a); !m.empty())
    return rlserve::fail(int4_shape_message(name, what, m));
  if (auto st = int4_quantize_serving_ref(a); st != kernel_status::ok)
    return rlserve::fail(int4_shape_message(name, what, std::string(to_string(st))));
  if (*a.nonfinite != k_int4_all_finite)
    return rlserve::fail(int4_nonfinite_message(name, a.shape, *a.nonfinite, a.w[*a.nonfinite]));
  return {};
}

} // namespace rlserve::kernels
