#include "model/qwen3.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "kernels/bf16.hpp"
#include "kernels/compressed_tensors.hpp"
#include "kernels/cpu_ops.hpp"
#include "kernels/fused_moe.hpp"
#include "kernels/int4_quant.hpp"
#include "kernels/rms_norm.hpp"
#include "model/quant/int4_method.hpp"
#include "model/safetensors.hpp"

namespace rlserve::model {

namespace {

// One parameter the config implies, and where its fp32 copy goes in the arena.
struct layout_entry {
  std::string name;
  std::vector<int64_t> shape;
  std::size_t offset;
};

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

bool is_float_type(dtype t) { return t == dtype::bf16 || t == dtype::f16 || t == dtype::f32; }

// Lists at most `limit` names, then "and N more": an error about 300 missing tensors should
// still fit on a screen.
std::string name_list(const std::vector<std::string>& names, std::size_t limit = 8) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > limit)
    out += fmt::format(" and {} more", names.size() - limit);
  return out;
}

// Checkpoint bytes -> fp32. memcpy per element: tensors aliasing a safetensors mapping need not
// be aligned to their element size (the format packs them back to back).
void to_float(const HostTensor& t, float* dst) {
  const auto* src = reinterpret_cast<const unsigned char*>(t.data.get());
  const int64_t n = t.numel();
  switch (t.type) {
    case dtype::f32: std::memcpy(dst, src, static_cast<std::size_t>(n) * 4); break;
    case dtype::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = kernels::bf16_to_float(bits);
      }
      break;
    case dtype::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = kernels::f16_to_float(bits);
      }
      break;
    default: break; // rejected by load/validate before we get here
  }
}

// The parameters a Qwen3 / Qwen3-MoE config implies, with arena offsets chosen so q/k/v and each
// MLP's (or expert's) gate/up are contiguous (fused matmuls). Returns the arena size in floats.
std::size_t make_layout(const model_config& c, std::vector<layout_entry>& out) {
  std::size_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    const auto n = static_cast<std::size_t>(numel(shape));
    out.push_back({std::move(name), std::move(shape), offset});
    offset += n;
    return out.back().offset;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  add("model.embed_tokens.weight", {c.vocab_size, H});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {nq * D, H});
    add(p + "self_attn.k_proj.weight", {nkv * D, H});
    add(p + "self_attn.v_proj.weight", {nkv * D, H});
    add(p + "self_attn.q_norm.weight", {D});
    add(p + "self_attn.k_norm.weight", {D});
    add(p + "self_attn.o_proj.weight", {H, nq * D});
    add(p + "post_attention_layernorm.weight", {H});
    if (qwen3_layer_is_sparse(c, l)) {
      const int64_t Im = c.moe_intermediate_size;
      add(p + "mlp.gate.weight", {c.num_experts, H});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
        add(x + "gate_proj.weight", {Im, H});
        add(x + "up_proj.weight", {Im, H});
        add(x + "down_proj.weight", {H, Im});
      }
    } else {
      add(p + "mlp.gate_proj.weight", {I, H});
      add(p + "mlp.up_proj.weight", {I, H});
      add(p + "mlp.down_proj.weight", {H, I});
    }
  }
  add("model.norm.weight", {H});
  if (!c.tie_word_embeddings)
    add("lm_head.weight", {c.vocab_size, H});
  return offset;
}

// Names a checkpoint may carry that the model does not own and transformers ignores.
bool ignorable(const model_config& c, const std::string& name) {
  if (c.tie_word_embeddings && name == "lm_head.weight")
    return true;
  return name.ends_with("rotary_emb.inv_freq");
}

status check_supported(const model_config& c) {
  const bool moe_arch = c.architecture == k_qwen3_moe_architecture;
  if (c.architecture != "Qwen3ForCausalLM" && !moe_arch)
    return fail(fmt::format("architecture '{}' is not supported; expected Qwen3ForCausalLM or "
                            "Qwen3MoeForCausalLM", c.architecture));
  if (!moe_arch && c.is_moe())
    return fail(fmt::format("config sets num_experts {} but its architecture is {}; a MoE "
                            "checkpoint says Qwen3MoeForCausalLM (model_type qwen3_moe)",
                            c.num_experts, c.architecture));
  if (moe_arch && c.is_moe()) {
    // Limits of the router top-k (kernels/fused_moe.hpp), shared with the CUDA runner.
    if (c.num_experts > 256 || c.num_experts_per_tok < 1 || c.num_experts_per_tok > 32 ||
        c.num_experts_per_tok > c.num_experts)
      return fail(fmt::format("Qwen3-MoE with {} experts, top-{} is not supported (at most 256 "
                              "experts, top-k in [1, min(experts, 32)])", c.num_experts,
                              c.num_experts_per_tok));
    if (c.moe_intermediate_size <= 0)
      return fail(fmt::format("Qwen3-MoE config needs a positive moe_intermediate_size, got {}",
                              c.moe_intermediate_size));
    if (c.decoder_sparse_step <= 0)
      return fail(fmt::format("Qwen3-MoE config needs decoder_sparse_step >= 1, got {}",
                              c.decoder_sparse_step));
  }
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 ||
      c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.head_dim <= 0 || c.head_dim % 2 != 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    return fail("model config has inconsistent sizes (load it with load_model_config, which "
                "checks them)");
  if (c.vocab_size > int64_t{1} << 31)
    return fail(fmt::format("vocab_size {} does not fit 32-bit token ids", c.vocab_size));
  return {};
}


namespace k4 = rlserve::kernels;

constexpr std::size_t k_no_offset = static_cast<std::size_t>(-1); // INT4 tensors have no fp32 copy

std::string module_of(std::string_view weight_name) {
  return std::string(weight_name.substr(0, weight_name.size() - std::string_view(".weight").size()));
}

// The INT4 views hand out int32/uint16 spans: a tensor aliasing a safetensors mapping may sit at
// any byte offset, so an unaligned one is copied once.
HostTensor aligned(HostTensor t, std::size_t alignment) {
  if (reinterpret_cast<std::uintptr_t>(t.data.get()) % alignment == 0)
    return t;
  return HostTensor::copy_of(t.type, t.shape, t.bytes());
}

// weight_shape's values, int64 or int32 as stored.
std::vector<int64_t> shape_values(const HostTensor& t) {
  std::vector<int64_t> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t.type == dtype::i64) {
      std::memcpy(&v[i], reinterpret_cast<const char*>(t.data.get()) + 8 * i, 8);
    } else {
      int32_t x;
      std::memcpy(&x, reinterpret_cast<const char*>(t.data.get()) + 4 * i, 4);
      v[i] = x;
    }
  }
  return v;
}

// The INT4 module a GPU runner builds for `prefix` (model/quant/int4_method.hpp): a routed
// expert's gate/up become one w13 of n = 2 * moe_intermediate, down one w2; any other Linear is
// its own module. Its create() refuses what the W4A16 kernels cannot run.
quant::int4_module_spec kernel_module_of(const std::string& prefix, const k4::int4_shape& s, bool symmetric,
                                         k4::zero_point_layout layout) {
  quant::int4_module_spec spec{prefix, {1, s.n, s.k, s.group_size}, symmetric, layout};
  if (quant::is_routed_expert_weight(prefix + ".weight")) {
    const std::string layer = prefix.substr(0, prefix.rfind(".experts."));
    if (prefix.ends_with("down_proj")) {
      spec.name = layer + ".experts.w2 (" + prefix + ")";
    } else {
      spec.name = layer + ".experts.w13 (" + prefix + ")";
      spec.shape.n = 2 * s.n;
    }
  }
  return spec;
}

} // namespace

bool qwen3_layer_is_sparse(const model_config& c, int64_t layer) {
  if (c.architecture != k_qwen3_moe_architecture || c.num_experts <= 0 ||
      c.decoder_sparse_step <= 0)
    return false;
  if (std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), layer) !=
      c.mlp_only_layers.end())
    return false;
  return (layer + 1) % c.decoder_sparse_step == 0;
}

std::vector<parameter_spec> qwen3_parameter_specs(const model_config& config, dtype type) {
  std::vector<layout_entry> layout;
  make_layout(config, layout);
  std::vector<parameter_spec> out;
  for (auto& e : layout)
    out.push_back({std::move(e.name), type, std::move(e.shape)});
  std::sort(out.begin(), out.end(),
            [](const parameter_spec& a, const parameter_spec& b) { return a.name < b.name; });
  return out;
}

template <class Lookup>
expected<qwen3_model> qwen3_model::load_from(const model_config& config,
                                             const std::vector<std::string>& available,
                                             Lookup&& get, const std::string& where,
                                             const qwen3_load_options& options) {
  if (auto s = check_supported(config); !s)
    return std::move(s).take_failure();

  if (options.quantize) {
    // Quantize at load: the very function `rlserve quantize` runs, then load the result as an
    // INT4 checkpoint with the config that command would have written.
    const auto& qo = *options.quantize;
    if (config.quantization)
      return fail(fmt::format("{}: cannot quantize at load ({}): the checkpoint is already quantized "
                              "(config.json has a quantization_config); load it as it is, or start "
                              "from a BF16 checkpoint", where, k4::to_string(qo.recipe)));
    std::vector<NamedTensor> all;
    for (const auto& name : available) {
      std::optional<HostTensor> t = get(name);
      if (!t)
        return fail(fmt::format("{}: cannot read tensor '{}'", where, name));
      all.push_back({name, std::move(*t)});
    }
    auto q = quant::quantize_tensors(std::move(all), qo);
    if (!q)
      return fail(fmt::format("{}: quantizing at load ({}, group size {}): {}", where,
                              k4::to_string(qo.recipe), qo.group_size, q.error()));
    model_config qc = config;
    qc.raw["quantization_config"] = quant::compressed_tensors_config(qo.recipe, qo.group_size, q->ignored);
    auto parsed = parse_quantization_config(qc.raw["quantization_config"], where);
    if (!parsed)
      return std::move(parsed).take_failure();
    qc.quantization = std::move(*parsed);
    qwen3_load_options inner = options;
    inner.quantize.reset();
    inner.update_recipe = qo.recipe;
    inner.zp_layout_hint = qo.zp_layout == k4::zero_point_layout::miles ? k4::zero_point_layout_hint::miles
                                                                        : k4::zero_point_layout_hint::standard;
    return load_named(qc, std::move(q->tensors), inner, where);
  }

  std::vector<layout_entry> layout;
  const std::size_t floats = make_layout(config, layout);
  const quantization_config* qc = config.quantization ? &*config.quantization : nullptr;
  auto has = [&](const std::string& n) { return std::binary_search(available.begin(), available.end(), n); };

  // Which Linear modules are INT4: those whose weight_packed the checkpoint holds. Everything a
  // module can get wrong against the quantization_config is said here, by module.
  std::vector<bool> quantized(layout.size(), false);
  std::set<std::string> expected_names;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& e = layout[i];
    const bool linear_like = e.shape.size() == 2 && e.name.ends_with(".weight");
    const std::string prefix = linear_like ? module_of(e.name) : std::string();
    if (linear_like && has(prefix + ".weight_packed")) {
      if (!qc)
        return fail(fmt::format("{}: '{}.weight_packed' is an INT4 tensor, but config.json has no "
                                "quantization_config saying how the checkpoint is quantized",
                                where, prefix));
      if (e.name == "model.embed_tokens.weight")
        return fail(fmt::format("{}: the embeddings cannot be INT4 ('{}.weight_packed'): only Linear "
                                "modules are quantized", where, prefix));
      if (qc->ignores(prefix))
        return fail(fmt::format("{}: module '{}' has INT4 tensors (weight_packed), but the "
                                "quantization_config's ignore list names it (it should be {})",
                                where, prefix, config.torch_dtype));
      if (has(e.name))
        return fail(fmt::format("{}: module '{}' has both '{}' and INT4 tensors (weight_packed); a "
                                "module is either float or quantized", where, prefix, e.name));
      const bool has_zp = has(prefix + ".weight_zero_point");
      if (qc->symmetric && has_zp)
        return fail(fmt::format("{}: module '{}' has a weight_zero_point, but the quantization_config "
                                "is symmetric", where, prefix));
      if (!qc->symmetric && !has_zp)
        return fail(fmt::format("{}: module '{}' has no weight_zero_point, but the quantization_config "
                                "is asymmetric", where, prefix));
      quantized[i] = true;
      for (const char* suffix : {".weight_packed", ".weight_scale", ".weight_shape"})
        expected_names.insert(prefix + suffix);
      if (has_zp)
        expected_names.insert(prefix + ".weight_zero_point");
      continue;
    }
    if (qc && linear_like && e.name != "model.embed_tokens.weight") {
      if (!has(e.name))
        return fail(fmt::format("{}: module '{}' has neither '{}' nor INT4 tensors ('{}.weight_packed', "
                                "'.weight_scale', ...)", where, prefix, e.name, prefix));
      if (!qc->ignores(prefix))
        return fail(fmt::format("{}: module '{}' is stored as a float '{}', but the quantization_config "
                                "neither ignores it nor finds its INT4 tensors ('{}.weight_packed', ...)",
                                where, prefix, e.name, prefix));
    }
    expected_names.insert(e.name);
  }
  std::vector<std::string> missing, extra;
  for (const auto& n : expected_names)
    if (!has(n))
      missing.push_back(n);
  for (const auto& n : available)
    if (expected_names.count(n) == 0 && !ignorable(config, n))
      extra.push_back(n);
  if (!missing.empty())
    return fail(fmt::format("{}: missing {} tensor(s) the config needs: {}", where, missing.size(),
                            name_list(missing)));
  if (!extra.empty())
    return fail(fmt::format("{}: {} tensor(s) that a {} with this config does not have: {}",
                            where, extra.size(), config.architecture, name_list(extra)));

  qwen3_model m;
  m.config_ = config;
  m.compute_copies_ = options.compute_copies;
  struct pending_int4 {
    std::string prefix;
    k4::int4_shape shape;
    std::vector<int64_t> zp_shape; // empty: symmetric
    std::size_t offset;
  };
  std::vector<pending_int4> pending;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& e = layout[i];
    if (!quantized[i]) {
      std::optional<HostTensor> t = get(e.name);
      if (!t)
        return fail(fmt::format("{}: cannot read tensor '{}'", where, e.name));
      if (!is_float_type(t->type))
        return fail(fmt::format("{}: tensor '{}' has dtype {}; expected bfloat16, float16 or float32",
                                where, e.name, torch_name(t->type)));
      if (t->shape != e.shape)
        return fail(fmt::format("{}: tensor '{}' has shape {}; the config implies {}", where, e.name,
                                shape_string(t->shape), shape_string(e.shape)));
      if (t->nbytes != static_cast<std::size_t>(numel(e.shape)) * element_size(t->type))
        return fail(fmt::format("{}: tensor '{}' has {} bytes, not what shape {} of {} needs", where,
                                e.name, t->nbytes, shape_string(e.shape), torch_name(t->type)));
      m.params_.push_back({{e.name, t->type, e.shape}, std::move(*t), e.offset});
      continue;
    }
    // An INT4 module: read its tensors, check them against (n, k) of the config and the group
    // size of the quantization_config.
    const std::string prefix = module_of(e.name);
    const int64_t n = e.shape[0], k = e.shape[1];
    auto read = [&](const char* suffix, std::initializer_list<dtype> types,
                    const char* wanted) -> expected<HostTensor> {
      const std::string name = prefix + suffix;
      std::optional<HostTensor> t = get(name);
      if (!t)
        return fail(fmt::format("{}: cannot read tensor '{}'", where, name));
      if (std::find(types.begin(), types.end(), t->type) == types.end())
        return fail(fmt::format("{}: tensor '{}' has dtype {}; an INT4 module's {} is {}", where, name,
                                torch_name(t->type), suffix + 1, wanted));
      if (t->checked_numel() < 0 ||
          t->nbytes != static_cast<std::size_t>(t->numel()) * element_size(t->type))
        return fail(fmt::format("{}: tensor '{}' has {} bytes, not what shape {} of {} needs", where,
                                name, t->nbytes, shape_string(t->shape), torch_name(t->type)));
      return aligned(std::move(*t), 8);
    };
    auto packed = read(".weight_packed", {dtype::i32}, "int32");
    if (!packed)
      return std::move(packed).take_failure();
    auto scale = read(".weight_scale", {dtype::bf16, dtype::f16}, "bfloat16");
    if (!scale)
      return std::move(scale).take_failure();
    if (scale->type != dtype::bf16)
      return fail(fmt::format("{}: tensor '{}.weight_scale' is float16; rlserve needs bfloat16 scales "
                              "(the W4A16 kernels apply them in bf16): convert the scales, or "
                              "re-quantize with `rlserve quantize`", where, prefix));
    auto wshape = read(".weight_shape", {dtype::i64, dtype::i32}, "int64");
    if (!wshape)
      return std::move(wshape).take_failure();
    if (wshape->shape != std::vector<int64_t>{2} || shape_values(*wshape) != e.shape)
      return fail(fmt::format("{}: tensor '{}.weight_shape' holds {} {}; the config implies the "
                              "module is [{}, {}]", where, prefix, shape_string(wshape->shape),
                              wshape->shape == std::vector<int64_t>{2} ? shape_string(shape_values(*wshape))
                                                                      : std::string("(not 2 values)"),
                              n, k));
    auto s = k4::ct_infer_shape(packed->shape, scale->shape, n, k, qc->group_size, prefix);
    if (!s)
      return fail(fmt::format("{}: {}", where, s.error()));
    if (s->batch != 1 || packed->shape.size() != 2)
      return fail(fmt::format("{}: module '{}': weight_packed {} is not the 2-D [n, k/8] = [{}, {}] of "
                              "one Linear", where, prefix, shape_string(packed->shape), n, k / 8));
    pending_int4 p{prefix, *s, {}, e.offset};
    m.params_.push_back({{prefix + ".weight_packed", dtype::i32, packed->shape}, std::move(*packed), k_no_offset});
    m.params_.push_back({{prefix + ".weight_scale", dtype::bf16, scale->shape}, std::move(*scale), k_no_offset});
    m.params_.push_back({{prefix + ".weight_shape", wshape->type, wshape->shape}, std::move(*wshape), k_no_offset});
    if (!qc->symmetric) {
      auto zp = read(".weight_zero_point", {dtype::i32}, "int32");
      if (!zp)
        return std::move(zp).take_failure();
      p.zp_shape = zp->shape;
      m.params_.push_back({{prefix + ".weight_zero_point", dtype::i32, zp->shape}, std::move(*zp), k_no_offset});
    }
    pending.push_back(std::move(p));
  }

  // One zero-point layout for the whole model: the hint, else the first module whose shape tells
  // (n/8 != k/G); then every module must fit it.
  std::optional<k4::zero_point_layout> zp_layout;
  if (options.zp_layout_hint != k4::zero_point_layout_hint::auto_detect)
    zp_layout = options.zp_layout_hint == k4::zero_point_layout_hint::miles ? k4::zero_point_layout::miles
                                                                            : k4::zero_point_layout::standard;
  if (qc && !qc->symmetric && !zp_layout) {
    std::string first_error;
    for (const auto& p : pending) {
      auto l = k4::detect_zero_point_layout(p.zp_shape, p.shape, k4::zero_point_layout_hint::auto_detect,
                                            p.prefix + ".weight_zero_point");
      if (l) {
        zp_layout = *l;
        break;
      }
      if (first_error.empty())
        first_error = l.error();
    }
    if (!zp_layout && !pending.empty())
      return fail(fmt::format("{}: {} (every module has n/8 == k/G; say the layout with the load "
                              "option zp_layout_hint)", where, first_error));
  }
  const auto layout_used = zp_layout.value_or(k4::zero_point_layout::standard);
  std::set<std::tuple<int64_t, int64_t, int32_t>> runnable; // kernel shapes already checked
  for (const auto& p : pending) {
    if (!p.zp_shape.empty()) {
      auto l = k4::detect_zero_point_layout(p.zp_shape, p.shape,
                                            layout_used == k4::zero_point_layout::miles
                                              ? k4::zero_point_layout_hint::miles
                                              : k4::zero_point_layout_hint::standard,
                                            p.prefix + ".weight_zero_point");
      if (!l)
        return fail(fmt::format("{}: {} (the model's other modules use the {} layout)", where, l.error(),
                                k4::to_string(layout_used)));
    }
    auto spec = kernel_module_of(p.prefix, p.shape, qc->symmetric, layout_used);
    if (runnable.insert({spec.shape.n, spec.shape.k, spec.shape.group_size}).second)
      if (auto mod = quant::int4_module::create(spec); !mod)
        return fail(fmt::format("{}: the INT4 kernels cannot run this checkpoint: {}", where, mod.error()));
  }

  std::sort(m.params_.begin(), m.params_.end(),
            [](const param_entry& a, const param_entry& b) { return a.spec.name < b.spec.name; });
  for (std::size_t i = 0; i < m.params_.size(); ++i)
    m.by_name_.emplace(m.params_[i].spec.name, i);
  m.int4_of_param_.assign(m.params_.size(), std::nullopt);
  for (auto& p : pending) {
    int4_entry e;
    e.prefix = p.prefix;
    e.shape = p.shape;
    e.packed = m.by_name_.at(p.prefix + ".weight_packed");
    e.scale = m.by_name_.at(p.prefix + ".weight_scale");
    e.shape_param = m.by_name_.at(p.prefix + ".weight_shape");
    if (!p.zp_shape.empty())
      e.zero_point = m.by_name_.at(p.prefix + ".weight_zero_point");
    e.offset = p.offset;
    m.int4_.push_back(std::move(e));
  }
  std::sort(m.int4_.begin(), m.int4_.end(), [](const int4_entry& a, const int4_entry& b) { return a.prefix < b.prefix; });
  bool experts_only = true;
  for (std::size_t i = 0; i < m.int4_.size(); ++i) {
    const auto& e = m.int4_[i];
    m.int4_by_prefix_.emplace(e.prefix, i);
    for (auto idx : {e.packed, e.scale, e.shape_param})
      m.int4_of_param_[idx] = i;
    if (e.zero_point)
      m.int4_of_param_[*e.zero_point] = i;
    experts_only = experts_only && quant::is_routed_expert_weight(e.prefix + ".weight");
  }
  if (qc) {
    model_quantization q;
    q.symmetric = qc->symmetric;
    q.group_size = qc->group_size;
    q.recipe = options.update_recipe.value_or(qc->symmetric ? k4::int4_recipe::sym_qat : k4::int4_recipe::asym);
    if (k4::int4_symmetric(q.recipe) != qc->symmetric)
      return fail(fmt::format("{}: update recipe {} does not fit a {} checkpoint", where, k4::to_string(q.recipe),
                              qc->symmetric ? "symmetric" : "asymmetric"));
    q.zp_layout = layout_used;
    q.targets = experts_only ? quant::quant_targets::experts : quant::quant_targets::linear;
    m.quantization_ = q;
  }

  if (m.compute_copies_) {
    m.weights_.resize(floats);
    for (const auto& p : m.params_)
      if (p.offset != k_no_offset)
        to_float(p.canonical, m.weights_.data() + p.offset);
    for (const auto& e : m.int4_)
      if (auto st = m.dequantize_into_arena(e); !st)
        return fail(fmt::format("{}: {}", where, st.error()));
  }

  std::map<std::string, std::size_t> offset_by_name;
  for (const auto& e : layout)
    offset_by_name.emplace(e.name, e.offset);
  auto offset_of = [&](const std::string& name) { return offset_by_name.at(name); };
  m.embed_ = offset_of("model.embed_tokens.weight");
  m.norm_ = offset_of("model.norm.weight");
  m.lm_head_ = config.tie_word_embeddings ? m.embed_ : offset_of("lm_head.weight");
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    layer_weights L;
    L.input_norm = offset_of(p + "input_layernorm.weight");
    L.qkv = offset_of(p + "self_attn.q_proj.weight");
    L.q_norm = offset_of(p + "self_attn.q_norm.weight");
    L.k_norm = offset_of(p + "self_attn.k_norm.weight");
    L.o = offset_of(p + "self_attn.o_proj.weight");
    L.post_norm = offset_of(p + "post_attention_layernorm.weight");
    L.sparse = qwen3_layer_is_sparse(config, l);
    if (L.sparse) {
      L.router = offset_of(p + "mlp.gate.weight");
      for (int64_t e = 0; e < config.num_experts; ++e) {
        const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
        L.expert_gate_up.push_back(offset_of(x + "gate_proj.weight"));
        L.expert_down.push_back(offset_of(x + "down_proj.weight"));
      }
    } else {
      L.gate_up = offset_of(p + "mlp.gate_proj.weight");
      L.down = offset_of(p + "mlp.down_proj.weight");
    }
    m.layers_.push_back(std::move(L));
  }
  return m;
}

status qwen3_model::dequantize_into_arena(const int4_entry& e) {
  // The kernels' reference dequantization (bf16_rn((q - z) * scale)), widened to fp32.
  std::vector<uint16_t> bits(static_cast<std::size_t>(e.shape.n * e.shape.k));
  k4::ct_dequant_args a;
  a.shape = e.shape;
  a.has_zero_point = e.zero_point.has_value();
  a.zp_layout = quantization_ ? quantization_->zp_layout : k4::zero_point_layout::standard;
  a.scale_type = k4::int4_scale_type::bf16;
  a.weight_packed = params_[e.packed].canonical.as<int32_t>().data();
  a.weight_scale = params_[e.scale].canonical.as<uint16_t>().data();
  a.weight_zero_point = e.zero_point ? params_[*e.zero_point].canonical.as<int32_t>().data() : nullptr;
  a.out = bits.data();
  if (auto st = k4::ct_dequant_ref(a); st != k4::kernel_status::ok)
    return fail(fmt::format("module '{}': dequantization failed: {}", e.prefix, k4::to_string(st)));
  float* dst = weights_.data() + e.offset;
  for (std::size_t i = 0; i < bits.size(); ++i)
    dst[i] = kernels::bf16_to_float(bits[i]);
  return {};
}

expected<qwen3_model> qwen3_model::load(const model_config& config, const checkpoint& ckpt,
                                        const qwen3_load_options& options) {
  auto get = [&](const std::string& name) -> std::optional<HostTensor> {
    auto t = ckpt.tensor(name);
    if (!t)
      return std::nullopt;
    return std::move(*t);
  };
  return load_from(config, ckpt.names(), get, ckpt.dir().string(), options);
}

expected<qwen3_model> qwen3_model::load_named(const model_config& config, std::vector<NamedTensor> tensors,
                                              const qwen3_load_options& options, const std::string& where) {
  std::map<std::string, const HostTensor*> by_name;
  for (const auto& t : tensors)
    if (!by_name.emplace(t.name, &t.tensor).second)
      return fail(fmt::format("{}: '{}' given twice", where, t.name));
  std::vector<std::string> names;
  for (const auto& [n, _] : by_name)
    names.push_back(n);
  auto get = [&](const std::string& name) -> std::optional<HostTensor> {
    auto it = by_name.find(name);
    if (it == by_name.end())
      return std::nullopt;
    return *it->second;
  };
  return load_from(config, names, get, where, options);
}

expected<qwen3_model> qwen3_model::load(const model_config& config, std::span<const NamedTensor> tensors,
                                        const qwen3_load_options& options) {
  return load_named(config, std::vector<NamedTensor>(tensors.begin(), tensors.end()), options, "tensors");
}

std::vector<parameter_spec> qwen3_model::parameters() const {
  std::vector<parameter_spec> out;
  out.reserve(params_.size());
  for (const auto& p : params_)
    out.push_back(p.spec);
  return out;
}

expected<HostTensor> qwen3_model::parameter(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) {
    if (name == "lm_head.weight" && config_.tie_word_embeddings)
      return fail("lm_head.weight is not a parameter: this model ties it to "
                  "model.embed_tokens.weight");
    if (name.ends_with(".weight") && int4_by_prefix_.count(module_of(name)))
      return fail(fmt::format("'{}' is not a parameter: module '{}' is INT4 (its parameters are "
                              "{}.weight_packed, .weight_scale, ...)", name, module_of(name), module_of(name)));
    return fail(fmt::format("unknown parameter '{}'", name));
  }
  return params_[it->second].canonical;
}

std::optional<int4_linear_view> qwen3_model::int4_linear(std::string_view prefix) const {
  auto it = int4_by_prefix_.find(std::string(prefix));
  if (it == int4_by_prefix_.end())
    return std::nullopt;
  const int4_entry& e = int4_[it->second];
  int4_linear_view v;
  v.shape = e.shape;
  v.symmetric = !e.zero_point.has_value();
  v.zp_layout = quantization_->zp_layout;
  v.weight_packed = params_[e.packed].canonical.as<int32_t>();
  v.weight_scale = params_[e.scale].canonical.as<uint16_t>();
  if (e.zero_point)
    v.weight_zero_point = params_[*e.zero_point].canonical.as<int32_t>();
  return v;
}

status qwen3_model::stage(const NamedTensor& t, staged_update& out,
                          std::unordered_map<std::size_t, bool>* module_form) const {
  // Records the form a module's update comes in; false when it already came in the other one.
  auto note_form = [&](std::size_t module, bool bf16_form) -> status {
    if (module_form == nullptr)
      return {};
    auto [it, inserted] = module_form->emplace(module, bf16_form);
    if (!inserted && it->second != bf16_form)
      return fail(fmt::format("parameter '{}': module '{}' is INT4 and this update sends both its "
                              "float '{}.weight' and its load-format tensors; send one form",
                              t.name, int4_[module].prefix, int4_[module].prefix));
    return {};
  };

  auto it = by_name_.find(t.name);
  if (it == by_name_.end()) {
    // The float form of a quantized module: quantized here with the model's update recipe.
    if (t.name.ends_with(".weight")) {
      if (auto q = int4_by_prefix_.find(module_of(t.name)); q != int4_by_prefix_.end()) {
        const int4_entry& e = int4_[q->second];
        const std::vector<int64_t> nk = {e.shape.n, e.shape.k};
        if (!is_float_type(t.tensor.type) || t.tensor.shape != nk)
          return fail(fmt::format("parameter '{}': module '{}' is INT4; its float form must be bfloat16, "
                                  "float16 or float32 {}, got {} {}", t.name, e.prefix, shape_string(nk),
                                  torch_name(t.tensor.type), shape_string(t.tensor.shape)));
        const auto nbytes = static_cast<std::size_t>(numel(nk)) * element_size(t.tensor.type);
        if (t.tensor.nbytes != nbytes || t.tensor.data == nullptr)
          return fail(fmt::format("parameter '{}': {} {} needs {} bytes, got {}", t.name,
                                  torch_name(t.tensor.type), shape_string(nk), nbytes,
                                  t.tensor.data == nullptr ? 0 : t.tensor.nbytes));
        if (auto s = note_form(q->second, true); !s)
          return s;
        quant::quantize_options qo;
        qo.recipe = quantization_->recipe;
        qo.group_size = quantization_->group_size;
        qo.zp_layout = quantization_->zp_layout;
        auto packed = quant::quantize_weight(t.name, aligned(t.tensor, 4), qo);
        if (!packed)
          return fail(fmt::format("parameter {}", packed.error()));
        for (auto& p : *packed) {
          // weight_shape is (n, k) by construction; the stored one (perhaps int32) stays.
          if (p.name.ends_with(".weight_shape"))
            continue;
          out.tensors.push_back({by_name_.at(p.name), std::move(p.tensor)});
        }
        out.int4_modules.push_back(q->second);
        return {};
      }
    }
    if (t.name == "lm_head.weight" && config_.tie_word_embeddings)
      return fail("parameter 'lm_head.weight': not a parameter of this model (tie_word_embeddings: "
                  "update model.embed_tokens.weight instead)");
    if (params_.empty())
      return fail(fmt::format("parameter '{}': the model holds no parameters (not loaded)", t.name));
    return fail(fmt::format("parameter '{}': unknown name (the model has {} parameters, "
                            "e.g. '{}')", t.name, params_.size(), params_.front().spec.name));
  }
  const std::size_t idx = it->second;
  const parameter_spec& spec = params_[idx].spec;
  if (t.tensor.type != spec.type || t.tensor.shape != spec.shape)
    return fail(fmt::format("parameter '{}': expected {} {}, got {} {}", t.name,
                            torch_name(spec.type), shape_string(spec.shape),
                            torch_name(t.tensor.type), shape_string(t.tensor.shape)));
  const auto nbytes = static_cast<std::size_t>(numel(spec.shape)) * element_size(spec.type);
  if (t.tensor.nbytes != nbytes || t.tensor.data == nullptr)
    return fail(fmt::format("parameter '{}': {} {} needs {} bytes, got {}", t.name,
                            torch_name(spec.type), shape_string(spec.shape), nbytes,
                            t.tensor.data == nullptr ? 0 : t.tensor.nbytes));
  if (auto m = int4_of_param_.empty() ? std::nullopt : int4_of_param_[idx]) {
    const int4_entry& e = int4_[*m];
    if (idx == e.shape_param) {
      auto v = shape_values(t.tensor);
      if (v != std::vector<int64_t>{e.shape.n, e.shape.k})
        return fail(fmt::format("parameter '{}': holds {}, but module '{}' is [{}, {}] (a module's "
                                "shape cannot change)", t.name, shape_string(v), e.prefix, e.shape.n,
                                e.shape.k));
    }
    if (idx == e.scale) {
      auto bits = t.tensor.as<uint16_t>();
      for (std::size_t i = 0; i < bits.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, reinterpret_cast<const char*>(t.tensor.data.get()) + 2 * i, 2);
        if (!k4::int4_bf16_is_finite(b))
          return fail(fmt::format("parameter '{}': element {} is {}; INT4 scales must be finite", t.name,
                                  i, (b & 0x7fu) ? "NaN" : "Inf"));
      }
    }
    if (auto s = note_form(*m, false); !s)
      return s;
    out.int4_modules.push_back(*m);
    out.tensors.push_back({idx, aligned(t.tensor, 8)});
    return {};
  }
  out.float_params.push_back(idx);
  out.tensors.push_back({idx, t.tensor});
  return {};
}

status qwen3_model::validate(const NamedTensor& t) const {
  staged_update scratch;
  return stage(t, scratch, nullptr);
}

status qwen3_model::assign(std::span<const NamedTensor> tensors) {
  std::set<std::string_view> seen;
  std::unordered_map<std::size_t, bool> module_form;
  staged_update up;
  for (const auto& t : tensors) {
    if (auto s = stage(t, up, &module_form); !s)
      return s;
    if (!seen.insert(t.name).second)
      return fail(fmt::format("parameter '{}': given twice in one update", t.name));
  }
  // Everything is checked (and quantized): from here on nothing fails.
  for (auto& st : up.tensors)
    params_[st.param].canonical = std::move(st.tensor);
  if (!compute_copies_)
    return {};
  for (auto idx : up.float_params)
    to_float(params_[idx].canonical, weights_.data() + params_[idx].offset);
  std::sort(up.int4_modules.begin(), up.int4_modules.end());
  up.int4_modules.erase(std::unique(up.int4_modules.begin(), up.int4_modules.end()), up.int4_modules.end());
  for (auto m : up.int4_modules)
    if (auto s = dequantize_into_arena(int4_[m]); !s)
      return fail("internal error after writing the update: " + s.error());
  return {};
}

expected<std::vector<float>> qwen3_model::forward_all(std::span<const int32_t> tokens) const {
  kv_cache cache(config_);
  auto& seq = cache.sequence(static_cast<int64_t>(tokens.size()));
  forward_item item{&seq, tokens, static_cast<int64_t>(tokens.size())};
  std::vector<float> logits;
  if (auto s = forward(cache.pool(), std::span(&item, 1), logits); !s)
    return std::move(s).take_failure();
  return logits;
}

status qwen3_model::forward(kv_cache& cache, std::span<const int32_t> tokens,
                            std::vector<float>& logits) const {
  auto& seq = cache.sequence(static_cast<int64_t>(tokens.size()));
  forward_item item{&seq, tokens, 1};
  if (auto s = forward(cache.pool(), std::span(&item, 1), logits); !s)
    return s;
  cache.append_tokens(tokens);
  return {};
}

// One sparse MoE block over T rows of h (post_attention_layernorm output), as HF's
// Qwen3MoeSparseMoeBlock: router logits, softmax + top-k (+ renormalization) per row, then every
// expert's SwiGLU over the rows routed to it, combined per row in slot order. Rows are grouped by
// expert only to share the weight reads: matmul_cpu computes every output element by the same
// dot whatever the row count, and the combine of row t reads only row t's slots, so a row's result
// does not depend on the other rows of the batch.
status qwen3_model::moe_block(const layer_weights& L, int64_t layer, const float* h, int64_t T,
                              float* out, moe_scratch& s) const {
  const model_config& c = config_;
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t Im = c.moe_intermediate_size;
  using kernels::kernel_status;
  auto kernel_failed = [&](const char* op, kernel_status st) {
    return fail(fmt::format("forward: layer {} {} failed: {}", layer, op, kernels::to_string(st)));
  };
  s.router_logits.resize(T * E);
  s.ids.resize(T * K);
  s.weights.resize(T * K);
  s.y.resize(T * K * H);
  if (auto st = kernels::matmul_cpu({h, w(L.router), s.router_logits.data(), T, E, H});
      st != kernel_status::ok)
    return kernel_failed("router (mlp.gate)", st);
  for (float v : s.router_logits)
    if (!std::isfinite(v))
      return fail(fmt::format("forward: layer {} router logits are not finite (a weight holds "
                              "inf or nan?)", layer));
  kernels::moe_topk_args topk;
  topk.tokens = T;
  topk.experts = E;
  topk.top_k = static_cast<int32_t>(K);
  topk.norm_topk_prob = c.norm_topk_prob;
  topk.router_logits = s.router_logits.data();
  topk.topk_ids = s.ids.data();
  topk.topk_weights = s.weights.data();
  if (auto st = kernels::moe_topk_ref(topk); st != kernel_status::ok)
    return kernel_failed("router top-k", st);

  for (int64_t e = 0; e < E; ++e) {
    s.rows.clear(); // slots t * K + k routed to expert e, ascending
    for (int64_t i = 0; i < T * K; ++i)
      if (s.ids[i] == e)
        s.rows.push_back(i);
    if (s.rows.empty())
      continue;
    const auto ne = static_cast<int64_t>(s.rows.size());
    s.xe.resize(ne * H);
    s.gate_up.resize(ne * 2 * Im);
    s.act.resize(ne * Im);
    s.ye.resize(ne * H);
    for (int64_t r = 0; r < ne; ++r)
      std::memcpy(&s.xe[r * H], h + (s.rows[r] / K) * H, H * sizeof(float));
    if (auto st = kernels::matmul_cpu({s.xe.data(), w(L.expert_gate_up[e]), s.gate_up.data(), ne,
                                       2 * Im, H});
        st != kernel_status::ok)
      return kernel_failed("expert gate_up_proj", st);
    if (auto st = kernels::silu_mul_cpu({s.gate_up.data(), s.act.data(), ne, Im});
        st != kernel_status::ok)
      return kernel_failed("expert silu_mul", st);
    if (auto st = kernels::matmul_cpu({s.act.data(), w(L.expert_down[e]), s.ye.data(), ne, H, Im});
        st != kernel_status::ok)
      return kernel_failed("expert down_proj", st);
    for (int64_t r = 0; r < ne; ++r)
      std::memcpy(&s.y[s.rows[r] * H], &s.ye[r * H], H * sizeof(float));
  }
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * H;
    std::fill(o, o + H, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float wk = s.weights[t * K + k];
      const float* y = &s.y[(t * K + k) * H];
      for (int64_t j = 0; j < H; ++j)
        o[j] += wk * y[j];
    }
  }
  return {};
}

status qwen3_model::forward(kv_pool& pool, std::span<forward_item> items,
                            std::vector<float>& logits, std::vector<int32_t>* routed_experts) const {
  const model_config& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, V = c.vocab_size;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t qkv_cols = (nq + 2 * nkv) * D;
  const int64_t bs = pool.block_size();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // Everything that can be wrong is checked before any sequence changes.
  if (!compute_copies_)
    return fail("forward: this model was loaded without fp32 compute copies "
                "(qwen3_load_options::compute_copies = false); it holds only the load-format bytes");
  if (pool.layers() != c.num_hidden_layers || pool.kv_heads() != nkv || pool.head_dim() != D)
    return fail(fmt::format("forward: the KV cache is shaped for {} layers x {} kv heads x {} "
                            "head_dim; this model has {} x {} x {}", pool.layers(),
                            pool.kv_heads(), pool.head_dim(), c.num_hidden_layers, nkv, D));
  if (items.empty())
    return fail("forward: no sequences to run");
  std::vector<int64_t> first_row(items.size()); // item i's tokens are rows first_row[i] ..
  int64_t T = 0, logit_rows = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    const auto n = static_cast<int64_t>(it.tokens.size());
    if (n == 0)
      return fail("forward: no tokens to run");
    for (int64_t t = 0; t < n; ++t)
      if (it.tokens[t] < 0 || it.tokens[t] >= V)
        return fail(fmt::format("forward: token id {} at index {} is outside the vocabulary [0, {})",
                                it.tokens[t], t, V));
    const int64_t past = it.kv->length;
    if (past + n > c.max_position_embeddings)
      return fail(fmt::format("forward: {} cached + {} new tokens exceed max_position_embeddings {}",
                              past, n, c.max_position_embeddings));
    if (static_cast<int64_t>(it.kv->blocks.size()) * bs < past + n)
      return fail(fmt::format("forward: {} KV blocks of {} tokens cannot hold {} positions",
                              it.kv->blocks.size(), bs, past + n));
    for (auto b : it.kv->blocks)
      if (b < 0 || b >= pool.num_blocks())
        return fail(fmt::format("forward: KV block {} is outside the pool (0 .. {})", b,
                                pool.num_blocks() - 1));
    if (it.logit_rows < 0 || it.logit_rows > n)
      return fail(fmt::format("forward: {} logit rows asked of {} tokens", it.logit_rows, n));
    first_row[i] = T;
    T += n;
    logit_rows += it.logit_rows;
  }

  // Scratch, one allocation set per call (a decode step's are a few KB per sequence).
  std::vector<float> x(T * H);           // [T, hidden] residual stream, all sequences' rows
  std::vector<float> h(T * H);           // [T, hidden] normed input of a block
  std::vector<float> qkv(T * qkv_cols);  // [T, (nq + 2 nkv) * head_dim]
  std::vector<float> q(T * nq * D);      // [T, nq, head_dim]
  std::vector<float> k_new(T * nkv * D); // [T, nkv, head_dim] this step's keys
  std::vector<float> attn(T * nq * D);   // [T, nq, head_dim]
  std::vector<float> proj(T * H);        // [T, hidden] o_proj / down_proj output
  std::vector<float> gate_up(T * 2 * I); // [T, 2 * intermediate]
  std::vector<float> act(T * I);         // [T, intermediate]
  std::vector<float> k_seq, v_seq;       // [past + n, nkv, head_dim] one sequence's keys/values
  moe_scratch moe;                       // sparse layers' buffers, sized on first use
  const int64_t K = c.num_experts > 0 ? c.num_experts_per_tok : 0;
  if (routed_experts) {
    routed_experts->assign(static_cast<std::size_t>(T * c.num_hidden_layers * K), -1);
  }

  for (std::size_t i = 0; i < items.size(); ++i)
    for (std::size_t t = 0; t < items[i].tokens.size(); ++t)
      std::memcpy(&x[(first_row[i] + t) * H], w(embed_) + int64_t{items[i].tokens[t]} * H,
                  H * sizeof(float));

  auto kernel_failed = [&](const char* op, kernels::kernel_status s) {
    return fail(fmt::format("forward: {} failed: {}", op, kernels::to_string(s)));
  };
  using kernels::kernel_status;
  const float scale = static_cast<float>(1.0 / std::sqrt(double(D)));

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const layer_weights& L = layers_[l];
    if (auto s = kernels::rms_norm_ref({x.data(), w(L.input_norm), h.data(), T, H, eps});
        s != kernel_status::ok)
      return kernel_failed("input_layernorm", s);
    if (auto s = kernels::matmul_cpu({h.data(), w(L.qkv), qkv.data(), T, qkv_cols, H});
        s != kernel_status::ok)
      return kernel_failed("qkv_proj", s);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = &qkv[t * qkv_cols];
      std::memcpy(&q[t * nq * D], row, nq * D * sizeof(float));
      std::memcpy(&k_new[t * nkv * D], row + nq * D, nkv * D * sizeof(float));
    }
    // q_norm / k_norm: RMSNorm of each head's head_dim vector.
    if (auto s = kernels::rms_norm_ref({q.data(), w(L.q_norm), q.data(), T * nq, D, eps});
        s != kernel_status::ok)
      return kernel_failed("q_norm", s);
    if (auto s = kernels::rms_norm_ref({k_new.data(), w(L.k_norm), k_new.data(), T * nkv, D, eps});
        s != kernel_status::ok)
      return kernel_failed("k_norm", s);

    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto& it = items[i];
      const int64_t n = static_cast<int64_t>(it.tokens.size()), past = it.kv->length;
      const int64_t r0 = first_row[i];
      if (auto s = kernels::rope_cpu({&q[r0 * nq * D], n, nq, D, past, c.rope_theta});
          s != kernel_status::ok)
        return kernel_failed("rope(q)", s);
      if (auto s = kernels::rope_cpu({&k_new[r0 * nkv * D], n, nkv, D, past, c.rope_theta});
          s != kernel_status::ok)
        return kernel_failed("rope(k)", s);
      // This step's keys and values into the sequence's slots (past .. past + n - 1), then the
      // whole history gathered contiguously for the attention op.
      for (int64_t t = 0; t < n; ++t) {
        auto pos = past + t;
        auto block = it.kv->blocks[pos / bs];
        std::memcpy(pool.key_slot(l, block, pos % bs), &k_new[(r0 + t) * nkv * D],
                    nkv * D * sizeof(float));
        std::memcpy(pool.value_slot(l, block, pos % bs), &qkv[(r0 + t) * qkv_cols + (nq + nkv) * D],
                    nkv * D * sizeof(float));
      }
      const int64_t tk = past + n;
      k_seq.resize(tk * nkv * D);
      v_seq.resize(tk * nkv * D);
      for (int64_t pos = 0; pos < tk; ++pos) {
        auto block = it.kv->blocks[pos / bs];
        std::memcpy(&k_seq[pos * nkv * D], pool.key_slot(l, block, pos % bs), nkv * D * sizeof(float));
        std::memcpy(&v_seq[pos * nkv * D], pool.value_slot(l, block, pos % bs), nkv * D * sizeof(float));
      }
      // Pointer arithmetic, not &v[i]: an item of the batch may have no rows here, and
      // indexing at the end (or into an empty vector) is undefined.
      kernels::attention_args aa{q.data() + r0 * nq * D, k_seq.data(), v_seq.data(),
                                 attn.data() + r0 * nq * D, n, tk, nq, nkv, D, scale};
      if (auto s = kernels::attention_cpu(aa); s != kernel_status::ok)
        return kernel_failed("attention", s);
    }
    if (auto s = kernels::matmul_cpu({attn.data(), w(L.o), proj.data(), T, H, nq * D});
        s != kernel_status::ok)
      return kernel_failed("o_proj", s);
    for (int64_t i = 0; i < T * H; ++i)
      x[i] += proj[i];

    if (auto s = kernels::rms_norm_ref({x.data(), w(L.post_norm), h.data(), T, H, eps});
        s != kernel_status::ok)
      return kernel_failed("post_attention_layernorm", s);
    if (L.sparse) {
      if (auto s = moe_block(L, l, h.data(), T, proj.data(), moe); !s)
        return s;
      if (routed_experts)
        for (int64_t t = 0; t < T; ++t)
          std::copy_n(moe.ids.data() + t * K, K,
                      routed_experts->data() + (t * c.num_hidden_layers + l) * K);
    } else {
      if (auto s = kernels::matmul_cpu({h.data(), w(L.gate_up), gate_up.data(), T, 2 * I, H});
          s != kernel_status::ok)
        return kernel_failed("gate_up_proj", s);
      if (auto s = kernels::silu_mul_cpu({gate_up.data(), act.data(), T, I});
          s != kernel_status::ok)
        return kernel_failed("silu_mul", s);
      if (auto s = kernels::matmul_cpu({act.data(), w(L.down), proj.data(), T, H, I});
          s != kernel_status::ok)
        return kernel_failed("down_proj", s);
    }
    for (int64_t i = 0; i < T * H; ++i)
      x[i] += proj[i];
  }

  // Only the rows whose logits are wanted go through the final norm and lm_head (the lm_head
  // matmul is the largest of a decode step for real vocabularies).
  std::vector<float> wanted(logit_rows * H); // [logit_rows, hidden]
  int64_t row = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const int64_t n = static_cast<int64_t>(items[i].tokens.size());
    const int64_t r = items[i].logit_rows;
    if (r == 0)
      continue; // with no logit rows at all `wanted` is empty: no memcpy on its null data
    std::memcpy(&wanted[row * H], &x[(first_row[i] + n - r) * H], r * H * sizeof(float));
    row += r;
  }
  logits.resize(static_cast<std::size_t>(logit_rows * V));
  if (logit_rows > 0) {
    if (auto s = kernels::rms_norm_ref({wanted.data(), w(norm_), wanted.data(), logit_rows, H, eps});
        s != kernel_status::ok)
      return kernel_failed("norm", s);
    if (auto s = kernels::matmul_cpu({wanted.data(), w(lm_head_), logits.data(), logit_rows, V, H});
        s != kernel_status::ok)
      return kernel_failed("lm_head", s);
  }
  for (auto& it : items)
    it.kv->length += static_cast<int64_t>(it.tokens.size());
  return {};
}

} // namespace rlserve::model
