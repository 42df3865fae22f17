#include "model/quant/int4_method.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "kernels/serving_layout.hpp"

namespace rlserve::model::quant {

namespace k = rlserve::kernels;

expected<int4_module> int4_module::create(int4_module_spec spec) {
  const auto& s = spec.shape;
  if (s.batch < 1 || s.n < 1 || s.k < 1)
    return fail(fmt::format("{}: INT4 module shape [{}, {}, {}] must be positive", spec.name,
                            s.batch, s.n, s.k));
  if (s.group_size != k::k_int4_channel && s.group_size != 32 && s.group_size != 64 &&
      s.group_size != 128)
    return fail(fmt::format("{}: group size {} is not supported (32, 64, 128 or per-channel)",
                            spec.name, s.group_size));
  if (s.group_size != k::k_int4_channel && s.k % s.group_size != 0)
    return fail(fmt::format("{}: k (input features) = {} is not a multiple of the group size {}",
                            spec.name, s.k, s.group_size));
  // The serving layout's own limits (tiles of 16 k x 64 n), named as the kernels name them.
  k::serving_repack_args probe;
  probe.shape = s;
  probe.has_zero_point = !spec.symmetric;
  probe.zp_layout = spec.zp_layout;
  int32_t dummy_i = 0;
  uint16_t dummy_s = 0;
  probe.weight_packed = &dummy_i;
  probe.weight_scale = &dummy_s;
  probe.weight_zero_point = &dummy_i;
  probe.serving_weight = &dummy_i;
  probe.serving_scale = &dummy_s;
  probe.serving_zero_point = &dummy_i;
  if (auto problem = k::serving_repack_problem(probe); !problem.empty())
    return fail(spec.name + ": " + problem);
  int4_module m;
  m.spec_ = std::move(spec);
  m.weight_.assign(static_cast<std::size_t>(s.batch * m.packed_per_expert()), 0);
  m.scale_.assign(static_cast<std::size_t>(s.batch * m.scales_per_expert()), 0);
  if (!m.spec_.symmetric)
    m.zero_point_.assign(static_cast<std::size_t>(s.batch * m.zps_per_expert()), 0);
  return m;
}

int64_t int4_module::packed_per_expert() const { return spec_.shape.n * spec_.shape.k / 8; }
int64_t int4_module::scales_per_expert() const {
  return spec_.shape.n * k::int4_groups(spec_.shape);
}
int64_t int4_module::zps_per_expert() const {
  return spec_.shape.n / 8 * k::int4_groups(spec_.shape);
}

status int4_module::load_expert(int64_t expert, const int4_load_tensors& t) {
  if (state_ != weight_layout_state::load_format)
    return fail(spec_.name + ": holds the serving layout; restore it before loading weights");
  if (expert < 0 || expert >= spec_.shape.batch)
    return fail(fmt::format("{}: expert {} is out of range (the module has {})", spec_.name,
                            expert, spec_.shape.batch));
  auto check = [&](const char* what, std::size_t got, int64_t want) -> status {
    if (static_cast<int64_t>(got) != want)
      return fail(fmt::format("{}: {} has {} words, expected {}", spec_.name, what, got, want));
    return {};
  };
  if (auto ok = check("weight_packed", t.weight_packed.size(), packed_per_expert()); !ok)
    return ok;
  if (auto ok = check("weight_scale", t.weight_scale.size(), scales_per_expert()); !ok)
    return ok;
  if (auto ok = check("weight_zero_point", t.weight_zero_point.size(),
                      spec_.symmetric ? 0 : zps_per_expert());
      !ok)
    return ok;
  std::copy(t.weight_packed.begin(), t.weight_packed.end(),
            weight_.begin() + expert * packed_per_expert());
  std::copy(t.weight_scale.begin(), t.weight_scale.end(),
            scale_.begin() + expert * scales_per_expert());
  if (!spec_.symmetric)
    std::copy(t.weight_zero_point.begin(), t.weight_zero_point.end(),
              zero_point_.begin() + expert * zps_per_expert());
  return {};
}

status int4_module::load_gate_up(int64_t expert, const int4_load_tensors& gate,
                                 const int4_load_tensors& up) {
  const auto n = spec_.shape.n, half = n / 2, groups = k::int4_groups(spec_.shape);
  if (n % 16 != 0)
    return fail(fmt::format("{}: w13 needs an even number of 8-row zero-point words per half "
                            "(n = {})", spec_.name, n));
  const auto words_k = spec_.shape.k / 8;
  auto expect = [&](const int4_load_tensors& t, const char* which) -> status {
    if (static_cast<int64_t>(t.weight_packed.size()) != half * words_k ||
        static_cast<int64_t>(t.weight_scale.size()) != half * groups ||
        static_cast<int64_t>(t.weight_zero_point.size()) != (spec_.symmetric ? 0 : half / 8 * groups))
      return fail(fmt::format("{}: {}_proj of expert {} does not have the shape [{}, {}] of half "
                              "of w13", spec_.name, which, expert, half, spec_.shape.k));
    return {};
  };
  if (auto ok = expect(gate, "gate"); !ok)
    return ok;
  if (auto ok = expect(up, "up"); !ok)
    return ok;
  // Rows of weight_packed and weight_scale: gate, then up.
  std::vector<int32_t> packed(gate.weight_packed.begin(), gate.weight_packed.end());
  packed.insert(packed.end(), up.weight_packed.begin(), up.weight_packed.end());
  std::vector<uint16_t> scale(gate.weight_scale.begin(), gate.weight_scale.end());
  scale.insert(scale.end(), up.weight_scale.begin(), up.weight_scale.end());
  std::vector<int32_t> zp;
  if (!spec_.symmetric) {
    if (spec_.zp_layout == k::zero_point_layout::standard) {
      // [n/8, k/G]: n is the outer dimension — gate's rows, then up's.
      zp.assign(gate.weight_zero_point.begin(), gate.weight_zero_point.end());
      zp.insert(zp.end(), up.weight_zero_point.begin(), up.weight_zero_point.end());
    } else {
      // [k/G, n/8]: n is the inner dimension — per group row, gate's words then up's.
      const auto w = half / 8;
      for (int64_t g = 0; g < groups; ++g) {
        zp.insert(zp.end(), gate.weight_zero_point.begin() + g * w,
                  gate.weight_zero_point.begin() + (g + 1) * w);
        zp.insert(zp.end(), up.weight_zero_point.begin() + g * w,
                  up.weight_zero_point.begin() + (g + 1) * w);
      }
    }
  }
  return load_expert(expert, {packed, scale, zp});
}

// Runs `permute(out_weight, out_scale, out_zero_point)` into scratch buffers and copies the
// result back into the module's own: the buffers keep their addresses across transitions.
template <class Permute>
status rewrite_in_place(std::vector<int32_t>& weight, std::vector<uint16_t>& scale,
                        std::vector<int32_t>& zero_point, Permute&& permute) {
  std::vector<int32_t> w(weight.size());
  std::vector<uint16_t> sc(scale.size());
  std::vector<int32_t> zp(zero_point.size());
  if (auto ok = permute(w.data(), sc.data(), zp.empty() ? nullptr : zp.data()); !ok)
    return ok;
  std::copy(w.begin(), w.end(), weight.begin());
  std::copy(sc.begin(), sc.end(), scale.begin());
  std::copy(zp.begin(), zp.end(), zero_point.begin());
  return {};
}

expected<std::string> int4_module::post_process() {
  if (state_ == weight_layout_state::serving)
    return spec_.name + ": already in the serving layout (nothing done)";
  auto ok = rewrite_in_place(weight_, scale_, zero_point_, [&](int32_t* w, uint16_t* sc, int32_t* zp) {
    k::serving_repack_args a;
    a.shape = spec_.shape;
    a.has_zero_point = !spec_.symmetric;
    a.zp_layout = spec_.zp_layout;
    a.weight_packed = weight_.data();
    a.weight_scale = scale_.data();
    a.weight_zero_point = spec_.symmetric ? nullptr : zero_point_.data();
    a.serving_weight = w;
    a.serving_scale = sc;
    a.serving_zero_point = zp;
    return k::serving_repack(a, spec_.name);
  });
  if (!ok)
    return std::move(ok).take_failure();
  state_ = weight_layout_state::serving;
  return spec_.name + ": repacked to the serving layout";
}

expected<std::string> int4_module::restore() {
  if (state_ == weight_layout_state::load_format)
    return spec_.name + ": already in the load format (nothing done)";
  auto ok = rewrite_in_place(weight_, scale_, zero_point_, [&](int32_t* w, uint16_t* sc, int32_t* zp) {
    k::serving_restore_args a;
    a.shape = spec_.shape;
    a.has_zero_point = !spec_.symmetric;
    a.zp_layout = spec_.zp_layout;
    a.serving_weight = weight_.data();
    a.serving_scale = scale_.data();
    a.serving_zero_point = spec_.symmetric ? nullptr : zero_point_.data();
    a.weight_packed = w;
    a.weight_scale = sc;
    a.weight_zero_point = zp;
    return k::serving_restore(a, spec_.name);
  });
  if (!ok)
    return std::move(ok).take_failure();
  state_ = weight_layout_state::load_format;
  return spec_.name + ": restored to the load format";
}

template <class Op>
expected<std::string> quantized_modules::apply(const char* verb, Op&& op) {
  std::size_t changed = 0, already = 0;
  for (auto& m : int4_) {
    auto before = m.state();
    auto r = op(m);
    if (!r)
      return std::move(r).take_failure();
    (m.state() != before ? changed : already) += 1;
  }
  return fmt::format("{} {} INT4 modules ({} already were); skipped {} without a quantization "
                     "method (norms, embeddings, BF16 layers, LoRA wrappers)",
                     verb, changed, already, unquantized_.size());
}

expected<std::string> quantized_modules::restore_all() {
  return apply("restored", [](int4_module& m) { return m.restore(); });
}

expected<std::string> quantized_modules::post_process_all() {
  return apply("post-processed", [](int4_module& m) { return m.post_process(); });
}

int4_module* quantized_modules::find(std::string_view name) {
  for (auto& m : int4_)
    if (m.spec().name == name)
      return &m;
  return nullptr;
}

} // namespace rlserve::model::quant
