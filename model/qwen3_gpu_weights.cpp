// qwen3_gpu_model's weights on the device: allocating and filling them, the INT4 state machine,
// updates staged beside the serving weights and committed in place, and reads of the served bytes
// (checksums, snapshots, get_weights_by_name). The forward step is in qwen3_gpu.cpp.
#include "model/qwen3_gpu.hpp"

#if RLSERVE_HAVE_CUDA

#include "model/qwen3_gpu_impl.hpp"

namespace rlserve::model {

using namespace gpu_detail;

// ---------------------------------------------------------------------------------------------------
// device weights

int qwen3_gpu_model::impl::add_int4(std::string name, kernels::int4_shape shape, bool symmetric,
                                    kernels::zero_point_layout layout) {
  gpu_int4_module m;
  m.name = std::move(name);
  m.shape = shape;
  m.symmetric = symmetric;
  m.zp_layout = layout;
  int4_modules.push_back(std::move(m));
  return static_cast<int>(int4_modules.size() - 1);
}

status qwen3_gpu_model::impl::allocate_weights(std::optional<random_int4> int4_experts,
                                               const qwen3_model* host) {
  const auto& c = config;
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t I = c.intermediate_size, E = c.num_experts, MI = c.moe_intermediate_size;
  auto bf16 = [&](const std::string& name, int64_t elements) -> expected<uint16_t*> {
    auto p = alloc<uint16_t>(elements, &weight_bytes);
    if (p && !name.empty())
      bf16_slots[name] = {*p, elements};
    return p;
  };
  // Whether `prefix` is an INT4 module in the host model (and its view).
  auto int4_of = [&](const std::string& prefix) -> std::optional<int4_linear_view> {
    if (!host)
      return std::nullopt;
    return host->int4_linear(prefix);
  };
  auto make_linear = [&](const std::string& prefix, int64_t n, int64_t k, uint16_t* fused_rows,
                         gpu_linear& out) -> status {
    out.n = n;
    out.k = k;
    if (auto v = int4_of(prefix)) {
      int idx = add_int4(prefix, {1, n, k, v->shape.group_size}, v->symmetric, v->zp_layout);
      int4_modules[idx].prefix = {prefix};
      int4_slots[prefix] = {idx, 0};
      out.int4 = idx;
      return {};
    }
    if (fused_rows) {
      out.bf16 = fused_rows;
      bf16_slots[prefix + ".weight"] = {fused_rows, n * k};
      return {};
    }
    auto p = bf16(prefix + ".weight", n * k);
    if (!p)
      return std::move(p).take_failure();
    out.bf16 = *p;
    return {};
  };

  auto e = bf16("model.embed_tokens.weight", V * H);
  if (!e)
    return std::move(e).take_failure();
  embed = *e;
  if (c.tie_word_embeddings) {
    lm_head = embed;
  } else {
    auto l = bf16("lm_head.weight", V * H);
    if (!l)
      return std::move(l).take_failure();
    lm_head = *l;
  }
  auto fn = bf16("model.norm.weight", H);
  if (!fn)
    return std::move(fn).take_failure();
  final_norm = *fn;

  layers.resize(static_cast<std::size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto& L = layers[l];
    const std::string p = fmt::format("model.layers.{}.", l);
    for (auto [dst, name, n] : {std::tuple{&L.input_norm, "input_layernorm.weight", H},
                                std::tuple{&L.post_norm, "post_attention_layernorm.weight", H},
                                std::tuple{&L.q_norm, "self_attn.q_norm.weight", D},
                                std::tuple{&L.k_norm, "self_attn.k_norm.weight", D}}) {
      auto b = bf16(p + name, n);
      if (!b)
        return std::move(b).take_failure();
      *dst = *b;
    }
    const bool qkv_bf16 = !int4_of(p + "self_attn.q_proj") && !int4_of(p + "self_attn.k_proj") &&
                          !int4_of(p + "self_attn.v_proj");
    if (qkv_bf16) {
      auto f = bf16("", (nq + 2 * nkv) * D * H);
      if (!f)
        return std::move(f).take_failure();
      L.qkv_fused = *f;
    }
    auto rows = [&](int64_t r) { return L.qkv_fused ? L.qkv_fused + r * H : nullptr; };
    if (auto s = make_linear(p + "self_attn.q_proj", nq * D, H, rows(0), L.q); !s)
      return s;
    if (auto s = make_linear(p + "self_attn.k_proj", nkv * D, H, rows(nq * D), L.k); !s)
      return s;
    if (auto s = make_linear(p + "self_attn.v_proj", nkv * D, H, rows((nq + nkv) * D), L.v); !s)
      return s;
    if (auto s = make_linear(p + "self_attn.o_proj", H, nq * D, nullptr, L.o); !s)
      return s;
    L.sparse = qwen3_layer_is_sparse(c, l);
    if (!L.sparse) {
      auto g = int4_of(p + "mlp.gate_proj"), u = int4_of(p + "mlp.up_proj");
      if (bool(g) != bool(u))
        return fail(fmt::format("{}mlp: gate_proj and up_proj must both be INT4 or both BF16 on "
                                "the GPU (they run as one GEMM)", p));
      if (g) {
        int idx = add_int4(p + "mlp.gate_up_proj", {1, 2 * I, H, g->shape.group_size},
                           g->symmetric, g->zp_layout);
        int4_modules[idx].gate_prefix = {p + "mlp.gate_proj"};
        int4_modules[idx].up_prefix = {p + "mlp.up_proj"};
        int4_slots[p + "mlp.gate_proj"] = {idx, 0};
        int4_slots[p + "mlp.up_proj"] = {idx, 0};
        L.gate_up_int4 = idx;
      } else {
        auto f = bf16("", 2 * I * H);
        if (!f)
          return std::move(f).take_failure();
        L.gate_up_fused = *f;
        bf16_slots[p + "mlp.gate_proj.weight"] = {*f, I * H};
        bf16_slots[p + "mlp.up_proj.weight"] = {*f + I * H, I * H};
      }
      if (auto s = make_linear(p + "mlp.down_proj", H, I, nullptr, L.down); !s)
        return s;
      continue;
    }
    auto r = bf16(p + "mlp.gate.weight", E * H);
    if (!r)
      return std::move(r).take_failure();
    L.router = *r;
    const std::string x0 = p + "mlp.experts.0.";
    auto g0 = int4_of(x0 + "gate_proj");
    auto d0 = int4_of(x0 + "down_proj");
    const bool int4 = int4_experts.has_value() || g0.has_value();
    if (int4) {
      int32_t gs = int4_experts ? int4_experts->group_size : g0->shape.group_size;
      bool sym = int4_experts ? int4_experts->symmetric : g0->symmetric;
      auto layout = g0 ? g0->zp_layout : kernels::zero_point_layout::standard;
      if (!int4_experts && (!d0 || d0->shape.group_size != gs || d0->symmetric != sym))
        return fail(fmt::format("{}: the fused MoE kernel needs gate/up and down quantized alike "
                                "(same group size and symmetry)", x0));
      L.w13 = add_int4(p + "mlp.experts.w13", {E, 2 * MI, H, gs}, sym, layout);
      L.w2 = add_int4(p + "mlp.experts.w2", {E, H, MI, gs}, sym, layout);
      for (int64_t x = 0; x < E; ++x) {
        const std::string xp = fmt::format("{}mlp.experts.{}.", p, x);
        int4_modules[L.w13].gate_prefix.push_back(xp + "gate_proj");
        int4_modules[L.w13].up_prefix.push_back(xp + "up_proj");
        int4_modules[L.w2].prefix.push_back(xp + "down_proj");
        int4_slots[xp + "gate_proj"] = {L.w13, x};
        int4_slots[xp + "up_proj"] = {L.w13, x};
        int4_slots[xp + "down_proj"] = {L.w2, x};
      }
    } else {
      auto a = bf16("", E * 2 * MI * H);
      auto b = bf16("", E * H * MI);
      if (!a || !b)
        return fail(device_name + ": cannot allocate BF16 experts");
      L.w13_bf16 = *a;
      L.w2_bf16 = *b;
      for (int64_t x = 0; x < E; ++x) {
        const std::string xp = fmt::format("{}mlp.experts.{}.", p, x);
        bf16_slots[xp + "gate_proj.weight"] = {*a + x * 2 * MI * H, MI * H};
        bf16_slots[xp + "up_proj.weight"] = {*a + x * 2 * MI * H + MI * H, MI * H};
        bf16_slots[xp + "down_proj.weight"] = {*b + x * H * MI, H * MI};
      }
    }
  }
  // INT4 buffers, and one scratch as large as the largest module (repack is out of place).
  for (auto& m : int4_modules) {
    auto why = kernels::int4_check_serving_shape(m.shape);
    if (!why.empty())
      return fail(fmt::format("INT4 module '{}' cannot run on the GPU: {}", m.name, why));
    const int64_t B = m.shape.batch;
    auto w = alloc<int32_t>(B * m.weight_words(), &weight_bytes);
    auto s = alloc<uint16_t>(B * m.scale_words(), &weight_bytes);
    if (!w || !s)
      return fail(fmt::format("{}: cannot allocate INT4 module '{}'", device_name, m.name));
    m.weight = *w;
    m.scale = *s;
    if (!m.symmetric) {
      auto z = alloc<int32_t>(B * m.zp_words(), &weight_bytes);
      if (!z)
        return std::move(z).take_failure();
      m.zero_point = *z;
    }
    int4_scratch_bytes = std::max<std::size_t>(
      int4_scratch_bytes, static_cast<std::size_t>(B * (m.weight_words() * 4 + m.scale_words() * 2 +
                                                        m.zp_words() * 4)) + 64);
  }
  if (int4_scratch_bytes > 0) {
    auto s = alloc<std::byte>(static_cast<int64_t>(int4_scratch_bytes), &update_bytes);
    if (!s)
      return std::move(s).take_failure();
    int4_scratch = *s;
  }
  return {};
}

// ---------------------------------------------------------------------------------------------------
// INT4 state machine on the device

status qwen3_gpu_model::impl::restore_module(gpu_int4_module& m) {
  if (!m.serving)
    return {};
  auto scratch = carve_lf(int4_scratch, m);
  if (auto s = kernels::serving_restore_device(restore_args(m, scratch), m.name, stream); !s)
    return s;
  GPU_TRY(copy_module_words(buffers_of(m), scratch, m, stream));
  m.serving = false;
  return {};
}

status qwen3_gpu_model::impl::post_process_module(gpu_int4_module& m) {
  if (m.serving)
    return {};
  auto scratch = carve_lf(int4_scratch, m);
  auto a = repack_args(m, buffers_of(m));
  a.serving_weight = scratch.w; // out of place through the scratch, then copied back
  a.serving_scale = scratch.s;
  a.serving_zero_point = m.symmetric ? nullptr : scratch.z;
  if (auto s = kernels::serving_repack_device(a, m.name, stream); !s)
    return s;
  GPU_TRY(copy_module_words(buffers_of(m), scratch, m, stream));
  m.serving = true;
  return {};
}

// Writes expert `expert` of `m` (in LOAD_FORMAT) from the host model's load-format tensors,
// through the host int4_module, which concatenates gate and up along n exactly as the loader
// rules say (zero points never transposed).
status qwen3_gpu_model::impl::write_expert(const qwen3_model& host, gpu_int4_module& m,
                                           int64_t expert) {
  quant::int4_module_spec spec{m.name, {1, m.shape.n, m.shape.k, m.shape.group_size}, m.symmetric,
                               m.zp_layout};
  auto one = quant::int4_module::create(spec);
  if (!one)
    return std::move(one).take_failure();
  auto tensors = [&](const std::string& prefix) -> expected<quant::int4_load_tensors> {
    auto v = host.int4_linear(prefix);
    if (!v)
      return fail(fmt::format("'{}' is not an INT4 module in the host model", prefix));
    return quant::int4_load_tensors{v->weight_packed, v->weight_scale, v->weight_zero_point};
  };
  if (!m.gate_prefix.empty()) {
    auto g = tensors(m.gate_prefix[expert]);
    auto u = tensors(m.up_prefix[expert]);
    if (!g)
      return std::move(g).take_failure();
    if (!u)
      return std::move(u).take_failure();
    if (auto s = one->load_gate_up(0, *g, *u); !s)
      return s;
  } else {
    auto t = tensors(m.prefix[expert]);
    if (!t)
      return std::move(t).take_failure();
    if (auto s = one->load_expert(0, *t); !s)
      return s;
  }
  GPU_TRY(cudaMemcpyAsync(m.weight + expert * m.weight_words(), one->weight_words().data(),
                          m.weight_words() * 4, cudaMemcpyHostToDevice, stream));
  GPU_TRY(cudaMemcpyAsync(m.scale + expert * m.scale_words(), one->scale_words().data(),
                          m.scale_words() * 2, cudaMemcpyHostToDevice, stream));
  if (!m.symmetric)
    GPU_TRY(cudaMemcpyAsync(m.zero_point + expert * m.zp_words(), one->zero_point_words().data(),
                            m.zp_words() * 4, cudaMemcpyHostToDevice, stream));
  // The host buffers die with `one`: wait before returning.
  GPU_TRY(cudaStreamSynchronize(stream));
  return {};
}

expected<std::string> qwen3_gpu_model::restore() {
  if (auto s_ = impl_->require(true, false, "restore"); !s_)
    return std::move(s_).take_failure();
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device)); // the runner's thread may not be the creating one
  int64_t done = 0, already = 0;
  for (auto& m : p.int4_modules) {
    if (!m.serving) {
      ++already;
      continue;
    }
    if (auto s = p.restore_module(m); !s)
      return std::move(s).take_failure();
    ++done;
  }
  GPU_TRY(cudaStreamSynchronize(p.stream));
  return fmt::format("restored {} INT4 module(s) to load format on {}{}", done, p.device_name,
                     already ? fmt::format(" ({} already in load format)", already) : "");
}

expected<std::string> qwen3_gpu_model::post_process() {
  if (auto s_ = impl_->require(true, false, "post_process"); !s_)
    return std::move(s_).take_failure();
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device)); // the runner's thread may not be the creating one
  int64_t done = 0, already = 0;
  for (auto& m : p.int4_modules) {
    if (m.serving) {
      ++already;
      continue;
    }
    if (auto s = p.post_process_module(m); !s)
      return std::move(s).take_failure();
    ++done;
  }
  GPU_TRY(cudaStreamSynchronize(p.stream));
  return fmt::format("repacked {} INT4 module(s) to the serving layout on {}{}", done,
                     p.device_name, already ? fmt::format(" ({} already serving)", already) : "");
}

status qwen3_gpu_model::upload(const qwen3_model& host, std::span<const std::string> names) {
  if (auto s_ = impl_->require(true, false, "upload"); !s_)
    return std::move(s_).take_failure();
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device)); // the runner's thread may not be the creating one
  static constexpr std::string_view k_int4_suffixes[] = {".weight_packed", ".weight_scale",
                                                         ".weight_zero_point", ".weight_shape",
                                                         ".weight"};
  std::set<std::pair<int, int64_t>> experts; // INT4 (module, expert) to rewrite
  std::vector<uint16_t> staging;
  for (const auto& name : names) {
    if (auto it = p.bf16_slots.find(name); it != p.bf16_slots.end()) {
      auto t = host.parameter(name);
      if (!t)
        return std::move(t).take_failure();
      auto [dst, n] = it->second;
      if (t->numel() != n)
        return fail(fmt::format("upload: '{}' has {} elements; the device slot holds {}", name, t->numel(), n));
      staging.resize(static_cast<std::size_t>(n));
      const auto* src = reinterpret_cast<const unsigned char*>(t->data.get());
      switch (t->type) {
        case dtype::bf16: std::memcpy(staging.data(), src, static_cast<std::size_t>(n) * 2); break;
        case dtype::f16:
        case dtype::f32:
          for (int64_t i = 0; i < n; ++i) {
            float v;
            if (t->type == dtype::f32) {
              std::memcpy(&v, src + 4 * i, 4);
            } else {
              uint16_t b;
              std::memcpy(&b, src + 2 * i, 2);
              v = kernels::f16_to_float(b);
            }
            staging[i] = kernels::float_to_bf16(v);
          }
          break;
        default:
          return fail(fmt::format("upload: '{}' has dtype {}; the GPU runner keeps BF16", name,
                                  torch_name(t->type)));
      }
      GPU_TRY(cudaMemcpy(dst, staging.data(), static_cast<std::size_t>(n) * 2, cudaMemcpyHostToDevice));
      continue;
    }
    bool matched = false;
    for (auto suffix : k_int4_suffixes) {
      if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      auto prefix = name.substr(0, name.size() - suffix.size());
      if (auto it = p.int4_slots.find(prefix); it != p.int4_slots.end()) {
        experts.insert(it->second);
        matched = true;
        break;
      }
    }
    if (!matched)
      return fail(fmt::format("upload: '{}' is not a parameter of the GPU model", name));
  }
  for (auto [module, expert] : experts) {
    auto& m = p.int4_modules[module];
    if (auto s = p.restore_module(m); !s) // a serving module must be in load format to be written
      return s;
    if (auto s = p.write_expert(host, m, expert); !s)
      return s;
  }
  GPU_TRY(cudaStreamSynchronize(p.stream));
  return {};
}

// ---------------------------------------------------------------------------------------------------
// weight updates staged on the device

namespace {

// The rows of one expert's [n, k] that one checkpoint Linear owns: gate_proj the first half of a
// w13 module, up_proj the second, any other Linear all of them.
struct int4_part {
  int module = -1;
  int64_t expert = 0;
  int64_t row_offset = 0;
  int64_t rows = 0;
};

// The part checkpoint Linear `prefix` is of expert `slot.second` of module `slot.first`.
int4_part part_of(const std::vector<gpu_int4_module>& modules, std::pair<int, int64_t> slot,
                  const std::string& prefix) {
  const auto& m = modules[slot.first];
  int4_part part{slot.first, slot.second, 0, m.shape.n};
  if (!m.gate_prefix.empty()) {
    part.rows = m.shape.n / 2;
    if (m.up_prefix[part.expert] == prefix)
      part.row_offset = part.rows;
  }
  return part;
}

// A possibly strided byte range on the device: `rows` rows of `row_bytes`, `pitch` apart.
struct dev_range {
  std::byte* data = nullptr;
  int64_t rows = 1;
  std::size_t row_bytes = 0;
  std::size_t pitch = 0;
  std::size_t bytes() const { return static_cast<std::size_t>(rows) * row_bytes; }
};

// Tensor `which` (packed / scale / zero point) of `p` inside load-format buffers `lf`.
dev_range part_range(const gpu_int4_module& m, const lf_view& lf, const int4_part& p, char which) {
  const int64_t k = m.shape.k, groups = kernels::int4_groups(m.shape);
  dev_range r;
  if (which == 'w') {
    r.data = reinterpret_cast<std::byte*>(lf.w + p.expert * m.weight_words() + p.row_offset * (k / 8));
    r.row_bytes = static_cast<std::size_t>(p.rows * (k / 8) * 4);
  } else if (which == 's') {
    r.data = reinterpret_cast<std::byte*>(lf.s + p.expert * m.scale_words() + p.row_offset * groups);
    r.row_bytes = static_cast<std::size_t>(p.rows * groups * 2);
  } else if (m.zp_layout == kernels::zero_point_layout::standard) { // [n/8, groups]
    r.data = reinterpret_cast<std::byte*>(lf.z + p.expert * m.zp_words() + p.row_offset / 8 * groups);
    r.row_bytes = static_cast<std::size_t>(p.rows / 8 * groups * 4);
  } else { // [groups, n/8]: the part is a column block of every row
    r.data = reinterpret_cast<std::byte*>(lf.z + p.expert * m.zp_words() + p.row_offset / 8);
    r.rows = groups;
    r.row_bytes = static_cast<std::size_t>(p.rows / 8 * 4);
    r.pitch = static_cast<std::size_t>(m.shape.n / 8 * 4);
  }
  if (r.pitch == 0)
    r.pitch = r.row_bytes;
  return r;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

} // namespace


namespace {

// What one update source is to the device model.
struct resolved_source {
  enum kind_t { bf16_slot, int4_weight, int4_packed, int4_scale, int4_zero_point, int4_shape } kind;
  int4_part part;
  uint16_t* slot = nullptr;
  int64_t elements = 0;
};

} // namespace

status qwen3_gpu_model::stage(std::span<const update_source> tensors, bool allow_nonfinite) {
  if (auto s_ = impl_->require(true, false, "a weight update"); !s_)
    return std::move(s_).take_failure();
  auto& p = *impl_;
  auto& st = *staging_;
  GPU_TRY(cudaSetDevice(p.device));
  // 1. names, dtypes, shapes.
  std::vector<resolved_source> resolved;
  std::set<std::string> seen;
  auto refuse = [](const std::string& name, const std::string& why) {
    return fail(fmt::format("tensor '{}': {}; nothing from this message was staged", name, why));
  };
  for (const auto& t : tensors) {
    if (!seen.insert(t.name).second)
      return refuse(t.name, "appears twice in one update message");
    if (!t.data)
      return refuse(t.name, "no device memory given");
    int64_t numel = 1;
    for (auto d : t.shape)
      numel *= d;
    resolved_source r{};
    if (auto it = p.bf16_slots.find(t.name); it != p.bf16_slots.end()) {
      if (kernels::weight_type_of(t.type) == kernels::weight_type::other)
        return refuse(t.name, fmt::format("dtype {} cannot be served as bfloat16", torch_name(t.type)));
      if (numel != it->second.second)
        return refuse(t.name, fmt::format("shape {} holds {} elements; the parameter has {}",
                                          shape_text(t.shape), numel, it->second.second));
      r.kind = resolved_source::bf16_slot;
      r.slot = it->second.first;
      r.elements = numel;
      resolved.push_back(r);
      continue;
    }
    static constexpr std::pair<std::string_view, resolved_source::kind_t> suffixes[] = {
      {".weight_packed", resolved_source::int4_packed}, {".weight_scale", resolved_source::int4_scale},
      {".weight_zero_point", resolved_source::int4_zero_point}, {".weight_shape", resolved_source::int4_shape},
      {".weight", resolved_source::int4_weight}};
    bool matched = false;
    for (auto [suffix, kind] : suffixes) {
      if (!ends_with(t.name, suffix))
        continue;
      auto prefix = t.name.substr(0, t.name.size() - suffix.size());
      auto it = p.int4_slots.find(prefix);
      if (it == p.int4_slots.end())
        break;
      const auto& m = p.int4_modules[it->second.first];
      const auto part = part_of(p.int4_modules, it->second, prefix);
      const int64_t k = m.shape.k, groups = kernels::int4_groups(m.shape);
      std::vector<int64_t> want;
      std::vector<dtype> types;
      switch (kind) {
        case resolved_source::int4_weight: want = {part.rows, k}; types = {dtype::bf16}; break;
        case resolved_source::int4_packed: want = {part.rows, k / 8}; types = {dtype::i32}; break;
        case resolved_source::int4_scale: want = {part.rows, groups}; types = {dtype::bf16}; break;
        case resolved_source::int4_zero_point:
          if (m.symmetric)
            return refuse(t.name, "the module is symmetric and has no zero point");
          want = m.zp_layout == kernels::zero_point_layout::standard
                   ? std::vector<int64_t>{part.rows / 8, groups}
                   : std::vector<int64_t>{groups, part.rows / 8};
          types = {dtype::i32};
          break;
        case resolved_source::int4_shape: want = {2}; types = {dtype::i64, dtype::i32}; break;
        default: break;
      }
      if (std::find(types.begin(), types.end(), t.type) == types.end() || t.shape != want)
        return refuse(t.name, fmt::format("the INT4 module expects {} {}, the update sent {} {}{}",
                                          torch_name(types[0]), shape_text(want), torch_name(t.type),
                                          shape_text(t.shape),
                                          kind == resolved_source::int4_weight
                                            ? " (BF16 weights are quantized on the device)" : ""));
      r.kind = kind;
      r.part = part;
      resolved.push_back(r);
      matched = true;
      break;
    }
    if (!matched)
      return refuse(t.name, "not a parameter of the model on " + p.device_name);
  }
  // 2. the staging budget.
  std::size_t need = 0;
  std::set<int> new_modules;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    const auto& r = resolved[i];
    if (r.kind == resolved_source::bf16_slot) {
      if (!st.bf16.count(tensors[i].name))
        need += static_cast<std::size_t>(r.elements) * 2;
    } else if (r.kind != resolved_source::int4_shape && !st.modules.count(r.part.module) &&
               new_modules.insert(r.part.module).second) {
      need += lf_bytes(p.int4_modules[r.part.module]);
    }
  }
  const std::size_t budget = p.options.staging_budget_bytes ? p.options.staging_budget_bytes : p.weight_bytes;
  if (st.bytes + need > budget)
    return fail(fmt::format("this update message needs {} MiB more device staging; with the {} MiB "
                            "already staged that exceeds the staging budget of {} MiB on {} (gpu "
                            "staging budget): nothing from this message was staged",
                            need >> 20, st.bytes >> 20, budget >> 20, p.device_name));
  // 3. non-finite values, one launch for the message; weight_shape values.
  if (p.batch_table_bytes < kernels::weight_batch_table_bytes(tensors.size())) {
    if (p.batch_table)
      cudaFree(p.batch_table);
    p.batch_table = nullptr;
    p.batch_table_bytes = kernels::weight_batch_table_bytes(std::max<std::size_t>(tensors.size(), 1024));
    GPU_TRY(cudaMalloc(&p.batch_table, p.batch_table_bytes));
  }
  if (!allow_nonfinite) {
    std::vector<kernels::weight_batch_item> scan;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < resolved.size(); ++i) {
      auto k = resolved[i].kind;
      if (k != resolved_source::bf16_slot && k != resolved_source::int4_weight && k != resolved_source::int4_scale)
        continue;
      int64_t numel = 1;
      for (auto d : tensors[i].shape)
        numel *= d;
      scan.push_back({tensors[i].data, nullptr, numel, tensors[i].type});
      which.push_back(i);
    }
    auto flags = kernels::weight_scan_device(scan, p.batch_table, p.stream);
    if (!flags)
      return std::move(flags).take_failure();
    for (std::size_t j = 0; j < which.size(); ++j)
      if ((*flags)[j] != kernels::k_weight_all_finite)
        return refuse(tensors[which[j]].name,
                      fmt::format("element {} (flat index) is NaN or infinite; weights must be finite "
                                  "(the engine's allow_non_finite_weights option lifts this check)",
                                  (*flags)[j]));
  }
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i].kind != resolved_source::int4_shape)
      continue;
    const auto& m = p.int4_modules[resolved[i].part.module];
    int64_t v[2] = {0, 0};
    if (tensors[i].type == dtype::i64) {
      GPU_TRY(cudaMemcpy(v, tensors[i].data, 16, cudaMemcpyDeviceToHost));
    } else {
      int32_t w[2];
      GPU_TRY(cudaMemcpy(w, tensors[i].data, 8, cudaMemcpyDeviceToHost));
      v[0] = w[0];
      v[1] = w[1];
    }
    if (v[0] != resolved[i].part.rows || v[1] != m.shape.k)
      return refuse(tensors[i].name, fmt::format("holds [{}, {}]; the module's shape is [{}, {}]", v[0],
                                                 v[1], resolved[i].part.rows, m.shape.k));
  }
  // 4. Staging buffers. A module's copy starts as its current weights in load format, so parts
  //    that do not arrive keep their values.
  auto drop_all = [&](const std::string& why) {
    discard_staged();
    return fail(why + "; the session's staged weights were dropped (the old weights keep serving)");
  };
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    const auto& r = resolved[i];
    if (r.kind != resolved_source::bf16_slot || st.bf16.count(tensors[i].name))
      continue;
    void* buf = nullptr;
    if (auto e = cudaMallocAsync(&buf, static_cast<std::size_t>(r.elements) * 2, p.stream); e != cudaSuccess)
      return drop_all(fmt::format("CUDA: cannot allocate {} MiB of staging: {}", (r.elements * 2) >> 20, cuda_text(e)));
    st.bf16[tensors[i].name] = {r.slot, r.elements, static_cast<uint16_t*>(buf)};
    st.bytes += static_cast<std::size_t>(r.elements) * 2;
  }
  for (int idx : new_modules) {
    auto& m = p.int4_modules[idx];
    void* buf = nullptr;
    if (auto e = cudaMallocAsync(&buf, lf_bytes(m), p.stream); e != cudaSuccess)
      return drop_all(fmt::format("CUDA: cannot allocate {} MiB of staging for '{}': {}", lf_bytes(m) >> 20,
                                  m.name, cuda_text(e)));
    st.modules[idx] = buf;
    st.bytes += lf_bytes(m);
    auto lf = carve_lf(buf, m);
    if (m.serving) {
      if (auto s = kernels::serving_restore_launch(restore_args(m, lf), p.stream); s != kernel_status::ok)
        return drop_all(fmt::format("restoring '{}' into staging failed: {}", m.name, kernels::to_string(s)));
    } else {
      GPU_TRY(copy_module_words(lf, buffers_of(m), m, p.stream));
    }
  }
  st.peak = std::max(st.peak, st.bytes);
  // 5. Writes into staging.
  std::vector<kernels::weight_batch_item> copies;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    const auto& r = resolved[i];
    const auto& t = tensors[i];
    if (r.kind == resolved_source::bf16_slot) {
      copies.push_back({t.data, st.bf16[t.name].copy, r.elements, t.type});
      continue;
    }
    if (r.kind == resolved_source::int4_shape)
      continue;
    const auto& m = p.int4_modules[r.part.module];
    auto lf = carve_lf(st.modules[r.part.module], m);
    auto put = [&](const dev_range& dst, const void* src) -> status {
      GPU_TRY(cudaMemcpy2DAsync(dst.data, dst.pitch, src, dst.row_bytes, dst.row_bytes,
                                static_cast<std::size_t>(dst.rows), cudaMemcpyDeviceToDevice, p.stream));
      return {};
    };
    status s;
    switch (r.kind) {
      case resolved_source::int4_packed: s = put(part_range(m, lf, r.part, 'w'), t.data); break;
      case resolved_source::int4_scale: s = put(part_range(m, lf, r.part, 's'), t.data); break;
      case resolved_source::int4_zero_point: s = put(part_range(m, lf, r.part, 'z'), t.data); break;
      case resolved_source::int4_weight: {
        kernels::int4_quant_args q;
        q.shape = {1, r.part.rows, m.shape.k, m.shape.group_size};
        q.recipe = *p.int4_recipe;
        q.zp_layout = m.zp_layout;
        q.w = static_cast<const uint16_t*>(t.data);
        q.nonfinite = p.quant_flag;
        auto zr = part_range(m, lf, r.part, 'z');
        const bool direct_zp = m.symmetric || zr.rows == 1;
        q.weight_packed = reinterpret_cast<int32_t*>(part_range(m, lf, r.part, 'w').data);
        q.weight_scale = reinterpret_cast<uint16_t*>(part_range(m, lf, r.part, 's').data);
        void* zp_temp = nullptr;
        if (!m.symmetric) {
          if (direct_zp) {
            q.weight_zero_point = reinterpret_cast<int32_t*>(zr.data);
          } else {
            GPU_TRY(cudaMallocAsync(&zp_temp, zr.bytes(), p.stream));
            q.weight_zero_point = static_cast<int32_t*>(zp_temp);
          }
        }
        if (auto ks = kernels::int4_quantize_launch(q, p.stream); ks != kernel_status::ok) {
          s = fail(fmt::format("quantizing '{}' on the device failed: {}", t.name, kernels::to_string(ks)));
        } else if (zp_temp) {
          s = put(zr, zp_temp);
        }
        if (zp_temp)
          cudaFreeAsync(zp_temp, p.stream);
        break;
      }
      default: break;
    }
    if (!s)
      return drop_all(s.error());
  }
  if (auto s = kernels::weight_to_bf16_device(copies, p.batch_table, p.stream); !s)
    return drop_all(s.error());
  // The sources may be a trainer's memory that is released after this returns.
  if (auto e = cudaStreamSynchronize(p.stream); e != cudaSuccess)
    return drop_all(fmt::format("CUDA: staging failed: {}", cuda_text(e)));
  return {};
}

// Host bytes of some tensors copied into one device buffer (each tensor at a 256-byte aligned
// offset) through the pinned double buffer, on the upload stream; finished when it returns. Runs
// on a helper thread while the runner's thread stages the chunk before (it touches only the
// pinned buffer, its events and the upload stream, which nothing else uses).
status qwen3_gpu_model::upload_chunk(std::span<const NamedTensor> tensors, host_upload& out) {
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device));
  if (!p.upload_stream)
    GPU_TRY(cudaStreamCreateWithFlags(&p.upload_stream, cudaStreamNonBlocking));
  if (!p.pinned) {
    p.pinned_bytes = 64u << 20;
    GPU_TRY(cudaMallocHost(&p.pinned, p.pinned_bytes));
    for (auto& e : p.pinned_done) {
      GPU_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      GPU_TRY(cudaEventRecord(e, p.upload_stream));
    }
  }
  std::size_t total = 0;
  out.at.clear();
  for (const auto& t : tensors) {
    out.at.push_back(total);
    total += (t.tensor.nbytes + 255) / 256 * 256;
  }
  if (total)
    if (auto e = cudaMallocAsync(&out.device, total, p.upload_stream); e != cudaSuccess)
      return fail(fmt::format("CUDA: cannot allocate {} MiB to upload an update: {}", total >> 20, cuda_text(e)));
  const std::size_t half_bytes = p.pinned_bytes / 2;
  std::size_t half = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto* src = reinterpret_cast<const std::byte*>(tensors[i].tensor.data.get());
    for (std::size_t off = 0; off < tensors[i].tensor.nbytes; off += half_bytes) {
      const std::size_t n = std::min(half_bytes, tensors[i].tensor.nbytes - off);
      auto* bounce = static_cast<std::byte*>(p.pinned) + half * half_bytes;
      GPU_TRY(cudaEventSynchronize(p.pinned_done[half])); // the copy out of this half has finished
      std::memcpy(bounce, src + off, n);
      GPU_TRY(cudaMemcpyAsync(static_cast<std::byte*>(out.device) + out.at[i] + off, bounce, n,
                              cudaMemcpyHostToDevice, p.upload_stream));
      GPU_TRY(cudaEventRecord(p.pinned_done[half], p.upload_stream));
      half ^= 1;
    }
  }
  GPU_TRY(cudaStreamSynchronize(p.upload_stream));
  return {};
}

status qwen3_gpu_model::stage_host(std::span<const NamedTensor> tensors, bool allow_nonfinite) {
  if (auto s_ = impl_->require(true, false, "a weight update"); !s_)
    return std::move(s_).take_failure();
  // Uploaded and staged in chunks of at most gpu_options::upload_chunk_bytes (a disk update hands over a
  // whole checkpoint in one message; a device buffer of its size would double the memory an
  // update needs), the upload of chunk i + 1 on a helper thread while chunk i is scanned and
  // quantized on the device. One chunk is all or nothing; when a later chunk is refused, what
  // earlier chunks staged is dropped with it and the reply says so.
  auto& p = *impl_;
  if (tensors.empty())
    return {};
  GPU_TRY(cudaSetDevice(p.device));
  const std::size_t k_upload_chunk = std::max<std::size_t>(p.options.upload_chunk_bytes, 1);
  std::vector<std::pair<std::size_t, std::size_t>> chunks; // [first, last)
  for (std::size_t first = 0; first < tensors.size();) {
    std::size_t last = first, bytes = 0;
    while (last < tensors.size() && (last == first || bytes + tensors[last].tensor.nbytes <= k_upload_chunk))
      bytes += tensors[last++].tensor.nbytes;
    chunks.emplace_back(first, last);
    first = last;
  }
  auto part = [&](std::size_t c) { return tensors.subspan(chunks[c].first, chunks[c].second - chunks[c].first); };
  auto release = [&](host_upload& u) {
    if (u.device)
      cudaFreeAsync(u.device, p.stream);
    u.device = nullptr;
  };
  host_upload current;
  status s = upload_chunk(part(0), current);
  for (std::size_t c = 0; c < chunks.size() && s; ++c) {
    host_upload next;
    status next_status;
    std::thread uploader;
    if (c + 1 < chunks.size())
      uploader = std::thread([&, c] { next_status = upload_chunk(part(c + 1), next); });
    std::vector<update_source> sources;
    auto ts = part(c);
    for (std::size_t i = 0; i < ts.size(); ++i)
      sources.push_back({ts[i].name, static_cast<std::byte*>(current.device) + current.at[i], ts[i].tensor.type,
                         ts[i].tensor.shape});
    s = stage(sources, allow_nonfinite);
    release(current);
    if (uploader.joinable())
      uploader.join();
    if (s && !next_status)
      s = std::move(next_status);
    current = std::move(next);
    if (!s && c > 0) {
      release(current);
      discard_staged();
      return fail(s.error() + " — but earlier parts of this message had been staged, so the "
                  "session's staged weights were dropped (the old weights keep serving)");
    }
  }
  release(current);
  cudaStreamSynchronize(p.stream);
  return s;
}

expected<std::string> qwen3_gpu_model::commit_staged() {
  if (auto s_ = impl_->require(true, false, "commit"); !s_)
    return std::move(s_).take_failure();
  auto& p = *impl_;
  auto& st = *staging_;
  GPU_TRY(cudaSetDevice(p.device));
  for (auto& [name, e] : st.bf16)
    GPU_TRY(cudaMemcpyAsync(e.dst, e.copy, static_cast<std::size_t>(e.elements) * 2, cudaMemcpyDeviceToDevice, p.stream));
  for (auto& [idx, buf] : st.modules) {
    auto& m = p.int4_modules[idx];
    auto lf = carve_lf(buf, m);
    if (m.serving) {
      if (auto s = kernels::serving_repack_launch(repack_args(m, lf), p.stream); s != kernel_status::ok)
        return fail(fmt::format("repacking '{}' into its serving buffers failed: {}; the module is "
                                "partly written (resend the whole update)", m.name, kernels::to_string(s)));
    } else {
      GPU_TRY(copy_module_words(buffers_of(m), lf, m, p.stream));
    }
  }
  GPU_TRY(cudaStreamSynchronize(p.stream));
  auto msg = fmt::format("committed {} BF16 tensor(s) and {} INT4 module(s) on {}", st.bf16.size(),
                         st.modules.size(), p.device_name);
  discard_staged();
  return msg;
}

void qwen3_gpu_model::discard_staged() {
  auto& p = *impl_;
  auto& st = *staging_;
  cudaSetDevice(p.device);
  for (auto& [name, e] : st.bf16)
    cudaFreeAsync(e.copy, p.stream);
  for (auto& [idx, buf] : st.modules)
    cudaFreeAsync(buf, p.stream);
  st.bf16.clear();
  st.modules.clear();
  st.bytes = 0;
  cudaStreamSynchronize(p.stream);
}

std::size_t qwen3_gpu_model::staged_bytes() const { return staging_->bytes; }
std::size_t qwen3_gpu_model::staging_peak_bytes() const { return staging_->peak; }
std::optional<kernels::int4_recipe> qwen3_gpu_model::int4_update_recipe() const { return impl_->int4_recipe; }

status qwen3_gpu_model::read_parameters(std::span<const std::string> names, const parameter_visitor& visit) {
  if (auto s_ = impl_->require(true, false, "reading weights"); !s_)
    return std::move(s_).take_failure();
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device));
  // BF16 slots in one group; INT4 parts grouped by module, each module restored into the scratch
  // once (its strided zero points gathered after it).
  std::vector<std::size_t> slot_index;
  std::vector<const void*> slot_ptr;
  std::vector<std::size_t> slot_bytes;
  std::map<int, std::vector<std::size_t>> by_module;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& name = names[i];
    if (auto it = p.bf16_slots.find(name); it != p.bf16_slots.end()) {
      slot_index.push_back(i);
      slot_ptr.push_back(it->second.first);
      slot_bytes.push_back(static_cast<std::size_t>(it->second.second) * 2);
      continue;
    }
    bool found = false;
    for (std::string_view suffix : {".weight_packed", ".weight_scale", ".weight_zero_point"}) {
      if (!ends_with(name, suffix))
        continue;
      if (auto it = p.int4_slots.find(name.substr(0, name.size() - suffix.size())); it != p.int4_slots.end()) {
        by_module[it->second.first].push_back(i);
        found = true;
      }
      break;
    }
    if (!found)
      return fail(fmt::format("'{}' is not a parameter the device serves", name));
  }
  GPU_TRY(cudaStreamSynchronize(p.stream));
  if (!slot_index.empty())
    if (auto s = visit(slot_index, slot_ptr, slot_bytes); !s)
      return s;
  void* gather = nullptr; // strided parts of one module, packed one after another
  std::size_t gather_bytes = 0;
  struct freer {
    void** ptr;
    ~freer() {
      if (*ptr)
        cudaFree(*ptr);
    }
  } guard{&gather};
  for (auto& [idx, list] : by_module) {
    auto& m = p.int4_modules[idx];
    lf_view lf = buffers_of(m);
    if (m.serving) {
      lf = carve_lf(p.int4_scratch, m);
      KERNEL_TRY("restoring '" + m.name + "' to read it", kernels::serving_restore_launch(restore_args(m, lf), p.stream));
    }
    std::vector<dev_range> ranges;
    std::size_t strided = 0;
    for (auto i : list) {
      const auto& name = names[i];
      const char which = ends_with(name, ".weight_packed") ? 'w' : ends_with(name, ".weight_scale") ? 's' : 'z';
      const std::size_t suffix = which == 'w' ? 14 : which == 's' ? 13 : 18;
      auto prefix = name.substr(0, name.size() - suffix);
      const auto part = part_of(p.int4_modules, p.int4_slots.at(prefix), prefix);
      ranges.push_back(part_range(m, lf, part, which));
      if (ranges.back().pitch != ranges.back().row_bytes)
        strided += ranges.back().bytes();
    }
    if (strided > gather_bytes) {
      if (gather)
        cudaFree(gather);
      gather = nullptr;
      GPU_TRY(cudaMalloc(&gather, strided));
      gather_bytes = strided;
    }
    std::vector<const void*> ptrs;
    std::vector<std::size_t> sizes;
    std::size_t at = 0;
    for (auto& r : ranges) {
      if (r.pitch != r.row_bytes) {
        auto* dst = static_cast<std::byte*>(gather) + at;
        GPU_TRY(cudaMemcpy2DAsync(dst, r.row_bytes, r.data, r.pitch, r.row_bytes,
                                  static_cast<std::size_t>(r.rows), cudaMemcpyDeviceToDevice, p.stream));
        ptrs.push_back(dst);
        at += r.bytes();
      } else {
        ptrs.push_back(r.data);
      }
      sizes.push_back(r.bytes());
    }
    GPU_TRY(cudaStreamSynchronize(p.stream));
    if (auto s = visit(list, ptrs, sizes); !s)
      return s;
  }
  return {};
}

expected<std::vector<uint64_t>> qwen3_gpu_model::digests(std::span<const std::string> names) {
  if (auto s_ = impl_->require(true, false, "checksums"); !s_)
    return std::move(s_).take_failure();
  auto& p = *impl_;
  std::vector<uint64_t> out(names.size());
  auto s = read_parameters(names, [&](std::span<const std::size_t> index, std::span<const void* const> ptrs,
                                      std::span<const std::size_t> bytes) -> status {
    std::vector<kernels::xxh3_device_span> spans;
    for (std::size_t j = 0; j < ptrs.size(); ++j)
      spans.push_back({static_cast<const std::byte*>(ptrs[j]), bytes[j]});
    auto d = kernels::xxh3_device_digests(spans, p.stream);
    if (!d)
      return std::move(d).take_failure();
    for (std::size_t j = 0; j < index.size(); ++j)
      out[index[j]] = (*d)[j];
    return {};
  });
  if (!s)
    return std::move(s).take_failure();
  return out;
}

expected<HostTensor> qwen3_gpu_model::download(const std::string& name) {
  if (auto s_ = impl_->require(true, false, "reading a weight"); !s_)
    return std::move(s_).take_failure();
  auto& p = *impl_;
  std::vector<std::byte> bytes;
  std::string n = name;
  auto s = read_parameters(std::span<const std::string>(&n, 1),
                           [&](std::span<const std::size_t>, std::span<const void* const> ptrs,
                               std::span<const std::size_t> count) -> status {
                             bytes.resize(count[0]);
                             GPU_TRY(cudaMemcpy(bytes.data(), ptrs[0], count[0], cudaMemcpyDeviceToHost));
                             return {};
                           });
  if (!s)
    return std::move(s).take_failure();
  if (auto it = p.bf16_slots.find(name); it != p.bf16_slots.end())
    return HostTensor::adopt(dtype::bf16, {it->second.second}, std::move(bytes));
  const bool scale = ends_with(name, ".weight_scale");
  const int64_t elements = static_cast<int64_t>(bytes.size() / (scale ? 2 : 4));
  return HostTensor::adopt(scale ? dtype::bf16 : dtype::i32, {elements}, std::move(bytes));
}

std::vector<std::string> qwen3_gpu_model::int4_module_names() const {
  std::vector<std::string> out;
  for (const auto& m : impl_->int4_modules)
    out.push_back(m.name);
  return out;
}

expected<gpu_int4_snapshot> qwen3_gpu_model::int4_module(const std::string& name) const {
  auto& p = *impl_;
  for (const auto& m : p.int4_modules) {
    if (m.name != name)
      continue;
    gpu_int4_snapshot s;
    s.name = m.name;
    s.shape = m.shape;
    s.serving = m.serving;
    s.weight.resize(static_cast<std::size_t>(m.shape.batch * m.weight_words()));
    s.scale.resize(static_cast<std::size_t>(m.shape.batch * m.scale_words()));
    s.zero_point.resize(static_cast<std::size_t>(m.shape.batch * m.zp_words()));
    GPU_TRY(cudaStreamSynchronize(p.stream));
    GPU_TRY(cudaMemcpy(s.weight.data(), m.weight, s.weight.size() * 4, cudaMemcpyDeviceToHost));
    GPU_TRY(cudaMemcpy(s.scale.data(), m.scale, s.scale.size() * 2, cudaMemcpyDeviceToHost));
    if (!m.symmetric)
      GPU_TRY(cudaMemcpy(s.zero_point.data(), m.zero_point, s.zero_point.size() * 4, cudaMemcpyDeviceToHost));
    return s;
  }
  return fail(fmt::format("no INT4 module named '{}'", name));
}

} // namespace rlserve::model

#endif // RLSERVE_HAVE_CUDA
