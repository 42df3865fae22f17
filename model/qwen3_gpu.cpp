#include "model/qwen3_gpu.hpp"

#if RLSERVE_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/bf16.hpp"
#include "kernels/decoder_ops.hpp"
#include "kernels/fill_random.hpp"
#include "kernels/fused_moe.hpp"
#include "kernels/gemm_w4a16.hpp"
#include "kernels/int4_quant.hpp"
#include "kernels/serving_layout.hpp"
#include "kernels/weight_copy.hpp"
#include "kernels/xxh3.hpp"
#include "model/quant/int4_method.hpp"

namespace rlserve::model {

namespace {

using kernels::kernel_status;

std::string cuda_text(cudaError_t e) { return cudaGetErrorString(e); }

#define GPU_TRY(call)                                                                              \
  do {                                                                                             \
    cudaError_t gpu_err_ = (call);                                                                 \
    if (gpu_err_ != cudaSuccess)                                                                   \
      return fail(fmt::format("CUDA: {} failed: {}", #call, cuda_text(gpu_err_)));                 \
  } while (0)

#define KERNEL_TRY(what, call)                                                                     \
  do {                                                                                             \
    kernel_status k_st_ = (call);                                                                  \
    if (k_st_ != kernel_status::ok)                                                                \
      return fail(fmt::format("{} failed: {}", what, kernels::to_string(k_st_)));                  \
  } while (0)

// One device allocation, freed with its owner.
struct device_block {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  device_block() = default;
  device_block(const device_block&) = delete;
  device_block& operator=(const device_block&) = delete;
  ~device_block() {
    if (ptr)
      cudaFree(ptr);
  }
};

// A Linear layer on the device: BF16 [n, k] (cuBLAS) or an INT4 module (W4A16 GEMM).
struct gpu_linear {
  int64_t n = 0, k = 0;
  uint16_t* bf16 = nullptr;
  int int4 = -1; // index into impl::int4_modules
};

// One INT4 module: E experts (1 for a Linear) of [n, k], pointer-stable device buffers holding
// the serving layout (SERVING) or the load format (LOAD_FORMAT).
struct gpu_int4_module {
  std::string name;
  kernels::int4_shape shape;
  bool symmetric = false;
  kernels::zero_point_layout zp_layout = kernels::zero_point_layout::standard;
  bool serving = false;
  int32_t* weight = nullptr;   // [E, n*k/8] words
  uint16_t* scale = nullptr;   // [E, n*k/G]
  int32_t* zero_point = nullptr; // asym: [E, n/8*k/G]
  // Where each expert's tensors come from in the checkpoint: gate+up (w13) or one Linear.
  std::vector<std::string> gate_prefix, up_prefix, prefix; // per expert; gate/up or prefix
  int64_t weight_words() const { return shape.n * shape.k / 8; }
  int64_t scale_words() const { return shape.n * kernels::int4_groups(shape); }
  int64_t zp_words() const { return symmetric ? 0 : shape.n / 8 * kernels::int4_groups(shape); }
};

// Load-format buffers of one INT4 module (B experts): weight words | scale words (padded to 4
// bytes) | zero-point words; the same carving as the repack scratch.
struct lf_view {
  int32_t* w = nullptr;
  uint16_t* s = nullptr;
  int32_t* z = nullptr;
};
std::size_t lf_bytes(const gpu_int4_module& m) {
  const int64_t B = m.shape.batch;
  const int64_t scale_words = B * m.scale_words();
  return static_cast<std::size_t>(B * m.weight_words() * 4 + (scale_words + scale_words % 2) * 2 +
                                  B * m.zp_words() * 4);
}
lf_view carve_lf(void* base, const gpu_int4_module& m) {
  const int64_t B = m.shape.batch;
  lf_view v;
  v.w = static_cast<int32_t*>(base);
  v.s = reinterpret_cast<uint16_t*>(v.w + B * m.weight_words());
  v.z = reinterpret_cast<int32_t*>(v.s + B * m.scale_words() + (B * m.scale_words()) % 2);
  return v;
}

// The exact inverse repack of module `m` (serving buffers) into load-format buffers `lf`, and the
// repack of `lf` into the serving buffers: the arguments every caller builds alike.
kernels::serving_restore_args restore_args(const gpu_int4_module& m, const lf_view& lf) {
  kernels::serving_restore_args a;
  a.shape = m.shape;
  a.has_zero_point = !m.symmetric;
  a.zp_layout = m.zp_layout;
  a.serving_weight = m.weight;
  a.serving_scale = m.scale;
  a.serving_zero_point = m.zero_point;
  a.weight_packed = lf.w;
  a.weight_scale = lf.s;
  a.weight_zero_point = m.symmetric ? nullptr : lf.z;
  return a;
}

kernels::serving_repack_args repack_args(const gpu_int4_module& m, const lf_view& lf) {
  kernels::serving_repack_args a;
  a.shape = m.shape;
  a.has_zero_point = !m.symmetric;
  a.zp_layout = m.zp_layout;
  a.weight_packed = lf.w;
  a.weight_scale = lf.s;
  a.weight_zero_point = m.symmetric ? nullptr : lf.z;
  a.serving_weight = m.weight;
  a.serving_scale = m.scale;
  a.serving_zero_point = m.zero_point;
  return a;
}

// The module's own buffers, whatever layout they hold.
lf_view buffers_of(const gpu_int4_module& m) { return {m.weight, m.scale, m.zero_point}; }

// Copies all of a module's words (weight, scale, zero point) from `src` to `dst` on `stream`.
cudaError_t copy_module_words(const lf_view& dst, const lf_view& src, const gpu_int4_module& m,
                              cudaStream_t stream) {
  const int64_t B = m.shape.batch;
  if (auto e = cudaMemcpyAsync(dst.w, src.w, B * m.weight_words() * 4, cudaMemcpyDeviceToDevice, stream); e != cudaSuccess)
    return e;
  if (auto e = cudaMemcpyAsync(dst.s, src.s, B * m.scale_words() * 2, cudaMemcpyDeviceToDevice, stream); e != cudaSuccess)
    return e;
  if (!m.symmetric)
    return cudaMemcpyAsync(dst.z, src.z, B * m.zp_words() * 4, cudaMemcpyDeviceToDevice, stream);
  return cudaSuccess;
}

struct gpu_layer {
  uint16_t *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  gpu_linear q, k, v, o;
  uint16_t* qkv_fused = nullptr; // BF16 [qkv_cols, H] when q, k, v are all BF16
  bool sparse = false;
  gpu_linear gate, up, down;      // dense MLP
  uint16_t* gate_up_fused = nullptr; // BF16 [2I, H]
  int gate_up_int4 = -1;          // dense MLP gate/up as one INT4 w13 module
  uint16_t* router = nullptr;     // sparse: BF16 [E, H]
  int w13 = -1, w2 = -1;          // sparse INT4 experts
  uint16_t *w13_bf16 = nullptr, *w2_bf16 = nullptr; // sparse BF16 experts
};

// The per-step data the host fills and copies to the device before a step.
struct step_meta {
  int32_t *ids, *positions, *slots, *row_seq, *row_pos, *logit_rows, *top_k, *block_table;
  float *temperature, *top_p, *min_p, *uniform;
};

const int64_t k_buckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};

} // namespace

struct qwen3_gpu_model::impl {
  model_config config;
  gpu_options options;
  int device = 0;
  std::string device_name;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::vector<std::unique_ptr<device_block>> blocks; // every allocation
  std::size_t weight_bytes = 0, kv_bytes = 0;

  // weights
  uint16_t *embed = nullptr, *lm_head = nullptr, *final_norm = nullptr;
  std::vector<gpu_layer> layers;
  std::vector<gpu_int4_module> int4_modules;
  std::unordered_map<std::string, std::pair<uint16_t*, int64_t>> bf16_slots; // name -> (dst, elements)
  std::unordered_map<std::string, std::pair<int, int64_t>> int4_slots;       // prefix -> (module, expert)
  float *rope_cos = nullptr, *rope_sin = nullptr;
  int64_t rope_positions = 0;

  // KV pool: per layer [slots, kv_heads, head_dim] bf16
  std::vector<uint16_t*> k_cache, v_cache;
  int64_t num_slots = 0, max_blocks = 0;

  // scratch
  int64_t max_tokens = 0, max_rows = 0, max_seqs = 0;
  float* residual = nullptr;
  uint16_t *h = nullptr, *qkv = nullptr, *q = nullptr, *attn = nullptr, *delta = nullptr,
           *gate_up = nullptr, *act = nullptr, *h_rows = nullptr;
  float *router_logits = nullptr, *logits = nullptr, *out_logprob = nullptr;
  int32_t* out_token = nullptr;
  void *attn_ws = nullptr, *moe_ws = nullptr, *gemm_ws = nullptr, *sample_ws = nullptr,
       *cublas_ws = nullptr, *int4_scratch = nullptr;
  std::size_t int4_scratch_bytes = 0;
  // per-step metadata: device and pinned host mirrors of one contiguous region
  void* meta_dev = nullptr;
  void* meta_host = nullptr;
  std::size_t meta_bytes = 0;
  step_meta dev{}, host{};
  // graphs per bucket
  std::map<int64_t, cudaGraphExec_t> graphs;
  // weight updates: the recipe BF16 updates of INT4 modules are quantized with, the per-tensor
  // table of batched copies, a non-finite flag word, a pinned bounce buffer for host uploads
  std::optional<kernels::int4_recipe> int4_recipe;
  void* batch_table = nullptr;
  std::size_t batch_table_bytes = 0;
  uint64_t* quant_flag = nullptr;
  void* pinned = nullptr;
  std::size_t pinned_bytes = 0;
  cudaStream_t upload_stream = nullptr; // host uploads of updates (stage_host's helper thread)
  cudaEvent_t pinned_done[2] = {nullptr, nullptr};
  // RLSERVE_GPU_PROFILE=1: steps run eagerly with an event after every phase; the time between
  // consecutive events is summed per phase name (what the decode benchmark prints).
  bool profile = std::getenv("RLSERVE_GPU_PROFILE") != nullptr;
  std::vector<std::pair<const char*, cudaEvent_t>> marks;
  std::map<std::string, double> phase_ms;
  void mark(const char* phase) {
    if (!profile)
      return;
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaEventRecord(e, stream);
    marks.emplace_back(phase, e);
  }
  void collect() {
    if (!profile || marks.empty())
      return;
    cudaEventSynchronize(marks.back().second);
    for (std::size_t i = 1; i < marks.size(); ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second);
      phase_ms[marks[i].first] += ms;
    }
    for (auto& m : marks)
      cudaEventDestroy(m.second);
    marks.clear();
  }

  ~impl() {
    for (auto& [b, g] : graphs)
      cudaGraphExecDestroy(g);
    if (batch_table)
      cudaFree(batch_table);
    if (upload_stream)
      cudaStreamDestroy(upload_stream);
    if (pinned)
      cudaFreeHost(pinned);
    for (auto e : pinned_done)
      if (e)
        cudaEventDestroy(e);
    if (meta_host)
      cudaFreeHost(meta_host);
    if (cublas)
      cublasDestroy(cublas);
    if (stream)
      cudaStreamDestroy(stream);
  }

  template <class T>
  expected<T*> alloc(int64_t count, std::size_t* account = nullptr) {
    auto b = std::make_unique<device_block>();
    b->bytes = static_cast<std::size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    if (auto e = cudaMalloc(&b->ptr, b->bytes); e != cudaSuccess)
      return fail(fmt::format("CUDA: cannot allocate {} MiB on {}: {}", b->bytes >> 20,
                              device_name, cuda_text(e)));
    if (account)
      *account += b->bytes;
    T* p = static_cast<T*>(b->ptr);
    blocks.push_back(std::move(b));
    return p;
  }

  // ---- setup ----
  status init_device();
  status allocate_weights(std::optional<random_int4> int4_experts, const qwen3_model* host);
  status allocate_runtime();
  status build_rope_table();
  int add_int4(std::string name, kernels::int4_shape shape, bool symmetric,
               kernels::zero_point_layout layout);

  // ---- INT4 state machine ----
  status restore_module(gpu_int4_module& m);
  status post_process_module(gpu_int4_module& m);
  status write_expert(const qwen3_model& host, gpu_int4_module& m, int64_t expert);

  // ---- forward ----
  status gemm(const gpu_linear& w, const uint16_t* x, int64_t m, void* y, int64_t ldy, bool f32_out);
  status gemm_bf16(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int64_t m, void* y,
                   int64_t ldy, bool f32_out);
  status run_step(int64_t T, int64_t S, int64_t R);
  kernels::paged_attention_args attention_args(int64_t layer, int64_t tokens, int64_t sequences) const;
  kernels::fused_moe_args int4_moe_args(const gpu_layer& L, int64_t tokens) const;
  kernels::moe_bf16_args bf16_moe_args(const gpu_layer& L, int64_t tokens) const;
  status prepare(std::span<forward_item> items, int64_t& T, int64_t& S, int64_t& R, bool padded);
  status launch(int64_t T, int64_t S, int64_t R, bool graph_ok);
  bool any_load_format() const {
    return std::any_of(int4_modules.begin(), int4_modules.end(),
                       [](const gpu_int4_module& m) { return !m.serving; });
  }
};

// What a weight update has staged on the device (qwen3_gpu_model::stage).
struct qwen3_gpu_model::staging {
  struct bf16_entry {
    uint16_t* dst = nullptr;     // the serving slot
    int64_t elements = 0;
    uint16_t* copy = nullptr;    // staged bytes
  };
  std::map<std::string, bf16_entry> bf16;
  std::map<int, void*> modules; // INT4 module -> staged load-format copy of the whole module
  std::size_t bytes = 0, peak = 0;
};

// ---------------------------------------------------------------------------------------------------
// setup

status qwen3_gpu_model::impl::init_device() {
  int count = 0;
  if (auto e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0)
    return fail("no CUDA device is visible" + (e != cudaSuccess ? ": " + cuda_text(e) : ""));
  if (options.device < 0 || options.device >= count)
    return fail(fmt::format("CUDA device {} does not exist ({} visible)", options.device, count));
  device = options.device;
  GPU_TRY(cudaSetDevice(device));
  cudaDeviceProp prop{};
  GPU_TRY(cudaGetDeviceProperties(&prop, device));
  device_name = fmt::format("cuda:{} ({})", device, prop.name);
  if (prop.major < 8)
    return fail(fmt::format("{}: compute capability {}.{}; the kernels need 8.0 or newer",
                            device_name, prop.major, prop.minor));
  GPU_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS)
    return fail(device_name + ": cublasCreate failed");
  cublasSetStream(cublas, stream);
  // A fixed workspace: cuBLAS must not allocate while a graph is being captured.
  const std::size_t ws = 32u << 20;
  auto w = alloc<std::byte>(static_cast<int64_t>(ws));
  if (!w)
    return std::move(w).take_failure();
  cublas_ws = *w;
  if (cublasSetWorkspace(cublas, cublas_ws, ws) != CUBLAS_STATUS_SUCCESS)
    return fail(device_name + ": cublasSetWorkspace failed");
  auto flag = alloc<uint64_t>(1);
  if (!flag)
    return std::move(flag).take_failure();
  quant_flag = *flag;
  return {};
}

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

status qwen3_gpu_model::impl::build_rope_table() {
  const auto& c = config;
  const int64_t half = c.head_dim / 2;
  rope_positions = std::min<int64_t>(c.max_position_embeddings, max_blocks * options.kv_block_size);
  std::vector<float> cs(static_cast<std::size_t>(rope_positions * half));
  std::vector<float> sn(cs.size());
  for (int64_t p = 0; p < rope_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      // As kernels::rope_cpu: the angle and its sin/cos in double, rounded to float once.
      const double inv_freq = std::pow(c.rope_theta, -2.0 * double(i) / double(c.head_dim));
      const double angle = double(p) * inv_freq;
      cs[p * half + i] = static_cast<float>(std::cos(angle));
      sn[p * half + i] = static_cast<float>(std::sin(angle));
    }
  auto a = alloc<float>(static_cast<int64_t>(cs.size()), &weight_bytes);
  auto b = alloc<float>(static_cast<int64_t>(cs.size()), &weight_bytes);
  if (!a || !b)
    return fail(device_name + ": cannot allocate the RoPE table");
  rope_cos = *a;
  rope_sin = *b;
  GPU_TRY(cudaMemcpy(rope_cos, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  GPU_TRY(cudaMemcpy(rope_sin, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  return {};
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
    auto s = alloc<std::byte>(static_cast<int64_t>(int4_scratch_bytes));
    if (!s)
      return std::move(s).take_failure();
    int4_scratch = *s;
  }
  return {};
}

status qwen3_gpu_model::impl::allocate_runtime() {
  const auto& c = config;
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  max_tokens = options.max_batch_tokens;
  max_rows = options.max_logit_rows > 0 ? options.max_logit_rows : max_tokens;
  max_seqs = std::min(options.max_sequences, max_tokens);
  if (max_tokens < 1 || max_seqs < 1 || options.kv_block_size < 1 || options.kv_num_blocks < 1)
    return fail("GPU model options: max_batch_tokens, max_sequences, kv_block_size and "
                "kv_num_blocks must be positive");
  num_slots = options.kv_num_blocks * options.kv_block_size;
  max_blocks = std::min<int64_t>(options.kv_num_blocks,
                                 (c.max_position_embeddings + options.kv_block_size - 1) /
                                   options.kv_block_size);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto k = alloc<uint16_t>(num_slots * nkv * D, &kv_bytes);
    auto v = alloc<uint16_t>(num_slots * nkv * D, &kv_bytes);
    if (!k || !v)
      return fail(fmt::format("{}: cannot allocate the KV pool ({} blocks of {} tokens)",
                              device_name, options.kv_num_blocks, options.kv_block_size));
    GPU_TRY(cudaMemset(*k, 0, num_slots * nkv * D * 2));
    GPU_TRY(cudaMemset(*v, 0, num_slots * nkv * D * 2));
    k_cache.push_back(*k);
    v_cache.push_back(*v);
  }
  int64_t I_max = std::max(c.intermediate_size, c.moe_intermediate_size);
  const int64_t T = max_tokens;
  bool ok = true;
  auto grab = [&](auto*& p, int64_t n) {
    using T_ = std::remove_pointer_t<std::remove_reference_t<decltype(p)>>;
    using E_ = std::conditional_t<std::is_void_v<T_>, std::byte, T_>; // workspaces: bytes
    auto a = alloc<E_>(n);
    if (!a)
      ok = false;
    else
      p = *a;
  };
  grab(residual, T * H);
  grab(h, T * H);
  grab(qkv, T * (nq + 2 * nkv) * D);
  grab(q, T * nq * D);
  grab(attn, T * nq * D);
  grab(delta, T * H);
  grab(gate_up, T * 2 * I_max);
  grab(act, T * I_max);
  grab(h_rows, max_rows * H);
  grab(router_logits, T * std::max<int64_t>(c.num_experts, 1));
  grab(logits, max_rows * V);
  grab(out_token, max_rows);
  grab(out_logprob, max_rows);
  if (!ok)
    return fail(fmt::format("{}: cannot allocate activation scratch for {} tokens", device_name, T));

  // Workspaces, sized for the largest launch (the graphs and eager steps share them: one stream).
  kernels::paged_attention_args pa = attention_args(0, T, max_seqs);
  // Sizing checks the whole argument set: real buffers, and stand-ins for the per-step tables
  // (allocated below, never dereferenced here).
  const auto* stand_in = reinterpret_cast<const int32_t*>(residual);
  pa.block_table = pa.row_seq = pa.row_pos = stand_in;
  if (kernels::paged_attention_can_implement(pa) != kernel_status::ok)
    return fail(fmt::format("the paged attention kernel cannot run this model: head_dim {} (64 or "
                            "128), {} query heads per kv head (at most 16), KV block size {} (16 "
                            "or 32)", D, nq / nkv, options.kv_block_size));
  if (auto b = kernels::paged_attention_workspace_bytes(pa); b > 0) {
    grab(attn_ws, static_cast<int64_t>(b));
  }
  kernels::sample_args sa;
  sa.rows = max_rows;
  sa.vocab = V;
  if (auto b = kernels::sample_workspace_bytes(sa); b > 0)
    grab(sample_ws, static_cast<int64_t>(b));
  std::size_t moe_bytes = 0;
  bool any_int4_moe = false, any_bf16_moe = false;
  for (auto& L : layers) {
    if (!L.sparse)
      continue;
    if (L.w13 >= 0)
      any_int4_moe = true;
    else
      any_bf16_moe = true;
  }
  if (any_int4_moe) {
    const auto first = std::find_if(layers.begin(), layers.end(),
                                    [](const gpu_layer& L) { return L.sparse && L.w13 >= 0; });
    const auto& m = int4_modules[first->w13];
    const kernels::fused_moe_args f = int4_moe_args(*first, T);
    if (kernels::fused_moe_can_implement(f) != kernel_status::ok)
      return fail(fmt::format("the INT4 fused-MoE kernel cannot run this model (hidden {}, "
                              "moe_intermediate {}, {} experts, top-{}, group size {}): hidden and "
                              "moe_intermediate must be multiples of 64 and of the group size",
                              H, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok,
                              m.shape.group_size));
    moe_bytes = std::max(moe_bytes, kernels::fused_moe_workspace_bytes(f));
  }
  if (any_bf16_moe) {
    const auto first = std::find_if(layers.begin(), layers.end(),
                                    [](const gpu_layer& L) { return L.sparse && L.w13 < 0; });
    const kernels::moe_bf16_args f = bf16_moe_args(*first, T);
    if (kernels::moe_bf16_can_implement(f) != kernel_status::ok)
      return fail(fmt::format("the BF16 fused-MoE kernel cannot run this model (hidden {}, "
                              "moe_intermediate {}, {} experts, top-{})", H,
                              c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok));
    moe_bytes = std::max(moe_bytes, kernels::moe_bf16_workspace_bytes(f));
  }
  if (moe_bytes > 0)
    grab(moe_ws, static_cast<int64_t>(moe_bytes));
  std::size_t gemm_bytes = 0;
  for (auto& m : int4_modules) {
    if (m.shape.batch != 1)
      continue;
    kernels::gemm_w4a16_args g;
    g.m = T;
    g.n = m.shape.n;
    g.k = m.shape.k;
    g.group_size = m.shape.group_size;
    g.has_zero_point = !m.symmetric;
    g.a = act; // the widest activation buffer; sizing only checks shapes and pointers
    g.b = m.weight;
    g.scale = m.scale;
    g.zero_point = m.zero_point;
    g.c = gate_up;
    if (kernels::gemm_w4a16_can_implement(g) != kernel_status::ok)
      return fail(fmt::format("the W4A16 GEMM cannot run INT4 module '{}' ([{}, {}], group size {})",
                              m.name, m.shape.n, m.shape.k, m.shape.group_size));
    gemm_bytes = std::max(gemm_bytes, kernels::gemm_w4a16_workspace_bytes(g));
  }
  if (gemm_bytes > 0)
    grab(gemm_ws, static_cast<int64_t>(gemm_bytes));
  if (!ok)
    return fail(fmt::format("{}: cannot allocate kernel workspaces", device_name));
  // Zero the workspaces once (their counters must start at zero; launches leave them so).
  for (auto& b : blocks)
    if (b->ptr == moe_ws || b->ptr == gemm_ws || b->ptr == attn_ws || b->ptr == sample_ws)
      GPU_TRY(cudaMemset(b->ptr, 0, b->bytes));

  // Per-step metadata: int32 x (5 T + 2 R + S * max_blocks) then float x 4 R.
  const int64_t ints = 5 * T + 2 * max_rows + max_seqs * max_blocks;
  const int64_t floats = 4 * max_rows;
  meta_bytes = static_cast<std::size_t>(ints + floats) * 4;
  auto md = alloc<std::byte>(static_cast<int64_t>(meta_bytes));
  if (!md)
    return std::move(md).take_failure();
  meta_dev = *md;
  GPU_TRY(cudaMallocHost(&meta_host, meta_bytes));
  auto carve = [&](void* base, step_meta& m) {
    auto* i = static_cast<int32_t*>(base);
    m.ids = i;
    m.positions = i + T;
    m.slots = i + 2 * T;
    m.row_seq = i + 3 * T;
    m.row_pos = i + 4 * T;
    m.logit_rows = i + 5 * T;
    m.top_k = m.logit_rows + max_rows;
    m.block_table = m.top_k + max_rows;
    auto* f = reinterpret_cast<float*>(m.block_table + max_seqs * max_blocks);
    m.temperature = f;
    m.top_p = f + max_rows;
    m.min_p = f + 2 * max_rows;
    m.uniform = f + 3 * max_rows;
  };
  carve(meta_dev, dev);
  carve(meta_host, host);
  return build_rope_table();
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

// ---------------------------------------------------------------------------------------------------
// forward

status qwen3_gpu_model::impl::gemm_bf16(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x,
                                        int64_t m, void* y, int64_t ldy, bool f32_out) {
  // Row-major y[m, n] = x[m, k] w[n, k]^T is column-major y^T[n, m] = w^T... : cuBLAS sees w as a
  // column-major [k, n] matrix (op T gives [n, k]) and x as column-major [k, m].
  if (options.bf16_gemv && kernels::gemv_bf16_preferred(m, n)) {
    const kernels::gemv_bf16_args g{x, w, y, m, n, k, ldy, f32_out};
    const auto st = kernels::gemv_bf16_launch(g, stream);
    if (st == kernel_status::ok)
      return {};
    if (st != kernel_status::misaligned_operand) // misaligned: cuBLAS takes it
      return fail(fmt::format("BF16 GEMV [{} x {}] x [{} x {}]^T failed ({})", m, k, n, k, kernels::to_string(st)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  auto st = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                         static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), x,
                         CUDA_R_16BF, static_cast<int>(k), &beta, y,
                         f32_out ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(ldy),
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    return fail(fmt::format("cuBLAS GEMM [{} x {}] x [{} x {}]^T failed (status {})", m, k, n, k,
                            static_cast<int>(st)));
  return {};
}

status qwen3_gpu_model::impl::gemm(const gpu_linear& w, const uint16_t* x, int64_t m, void* y,
                                   int64_t ldy, bool f32_out) {
  if (w.int4 < 0)
    return gemm_bf16(w.bf16, w.n, w.k, x, m, y, ldy, f32_out);
  const auto& mod = int4_modules[w.int4];
  kernels::gemm_w4a16_args g;
  g.m = m;
  g.n = w.n;
  g.k = w.k;
  g.group_size = mod.shape.group_size;
  g.has_zero_point = !mod.symmetric;
  g.a = x;
  g.b = mod.weight;
  g.scale = mod.scale;
  g.zero_point = mod.zero_point;
  g.c = static_cast<uint16_t*>(y);
  g.ldc = ldy;
  KERNEL_TRY(fmt::format("W4A16 GEMM of '{}'", mod.name), kernels::gemm_w4a16_launch(g, gemm_ws, stream));
  return {};
}

// The paged-attention launch of `layer` for `tokens` rows of `sequences` sequences, over the
// per-step tables in `dev`. Allocation sizes the workspace with tokens = max_tokens; every launch
// passes the same max_tokens (the workspace's layout: its merge counters persist between launches).
kernels::paged_attention_args qwen3_gpu_model::impl::attention_args(int64_t layer, int64_t tokens,
                                                                   int64_t sequences) const {
  const auto& c = config;
  kernels::paged_attention_args a;
  a.q = q;
  a.k_cache = k_cache[layer];
  a.v_cache = v_cache[layer];
  a.block_table = dev.block_table;
  a.row_seq = dev.row_seq;
  a.row_pos = dev.row_pos;
  a.out = attn;
  a.tokens = tokens;
  a.sequences = sequences;
  a.max_blocks = max_blocks;
  a.block_size = options.kv_block_size;
  a.q_heads = c.num_attention_heads;
  a.kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.max_context = max_blocks * options.kv_block_size;
  a.max_tokens = max_tokens;
  a.scale = static_cast<float>(1.0 / std::sqrt(double(c.head_dim)));
  return a;
}

// The INT4 fused-MoE launch of sparse layer L for `tokens` rows (workspace laid out for
// max_tokens: allocation sizes it with tokens = max_tokens, every step launches with its own).
kernels::fused_moe_args qwen3_gpu_model::impl::int4_moe_args(const gpu_layer& L, int64_t tokens) const {
  const auto& c = config;
  const auto& w13 = int4_modules[L.w13];
  const auto& w2 = int4_modules[L.w2];
  kernels::fused_moe_args f;
  f.tokens = tokens;
  f.max_tokens = max_tokens;
  f.hidden = c.hidden_size;
  f.intermediate = c.moe_intermediate_size;
  f.experts = c.num_experts;
  f.top_k = static_cast<int32_t>(c.num_experts_per_tok);
  f.norm_topk_prob = c.norm_topk_prob;
  f.group_size = w13.shape.group_size;
  f.has_zero_point = !w13.symmetric;
  f.router_logits = router_logits;
  f.x = h;
  f.w13 = w13.weight;
  f.w13_scale = w13.scale;
  f.w13_zero_point = w13.zero_point;
  f.w2 = w2.weight;
  f.w2_scale = w2.scale;
  f.w2_zero_point = w2.zero_point;
  f.out = delta;
  return f;
}

// The BF16 fused-MoE launch of sparse layer L (its twin for BF16 experts).
kernels::moe_bf16_args qwen3_gpu_model::impl::bf16_moe_args(const gpu_layer& L, int64_t tokens) const {
  const auto& c = config;
  kernels::moe_bf16_args f;
  f.tokens = tokens;
  f.max_tokens = max_tokens;
  f.hidden = c.hidden_size;
  f.intermediate = c.moe_intermediate_size;
  f.experts = c.num_experts;
  f.top_k = static_cast<int32_t>(c.num_experts_per_tok);
  f.norm_topk_prob = c.norm_topk_prob;
  f.router_logits = router_logits;
  f.x = h;
  f.w13 = L.w13_bf16;
  f.w2 = L.w2_bf16;
  f.out = delta;
  return f;
}

// Enqueues one step over the metadata already in `dev`: T token rows, S sequences (the
// attention's block-table rows), R logits rows. Captured into graphs as is.
status qwen3_gpu_model::impl::run_step(int64_t T, int64_t S, int64_t R) {
  const auto& c = config;
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t qkv_cols = (nq + 2 * nkv) * D;
  const auto eps = static_cast<float>(c.rms_norm_eps);

  mark("start");
  KERNEL_TRY("embedding", kernels::embed_launch({dev.ids, embed, residual, T, V, H}, stream));
  mark("embedding");
  const uint16_t* pending = nullptr; // the last sublayer's output, added at the next norm
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const auto& L = layers[l];
    kernels::add_rms_norm_args n1{residual, pending, L.input_norm, nullptr, h, T, H, eps};
    KERNEL_TRY("input_layernorm", kernels::add_rms_norm_launch(n1, stream));
    mark("norms");
    if (L.qkv_fused) {
      if (auto s = gemm_bf16(L.qkv_fused, qkv_cols, H, h, T, qkv, qkv_cols, false); !s)
        return s;
    } else {
      if (auto s = gemm(L.q, h, T, qkv, qkv_cols, false); !s)
        return s;
      if (auto s = gemm(L.k, h, T, qkv + nq * D, qkv_cols, false); !s)
        return s;
      if (auto s = gemm(L.v, h, T, qkv + (nq + nkv) * D, qkv_cols, false); !s)
        return s;
    }
    mark("qkv GEMM");
    kernels::qk_norm_rope_kv_args r;
    r.qkv = qkv;
    r.q_norm = L.q_norm;
    r.k_norm = L.k_norm;
    r.rope_cos = rope_cos;
    r.rope_sin = rope_sin;
    r.positions = dev.positions;
    r.slots = dev.slots;
    r.q_out = q;
    r.k_cache = k_cache[l];
    r.v_cache = v_cache[l];
    r.tokens = T;
    r.q_heads = nq;
    r.kv_heads = nkv;
    r.head_dim = D;
    r.max_positions = rope_positions;
    r.num_slots = num_slots;
    r.eps = eps;
    KERNEL_TRY("q/k norm + RoPE + KV write", kernels::qk_norm_rope_kv_launch(r, stream));
    mark("q/k norm + RoPE + KV write");
    KERNEL_TRY("paged attention", kernels::paged_attention_launch(attention_args(l, T, S), attn_ws, stream));
    mark("paged attention");
    if (auto s = gemm(L.o, attn, T, delta, H, false); !s)
      return s;
    mark("o_proj GEMM");
    kernels::add_rms_norm_args n2{residual, delta, L.post_norm, nullptr, h, T, H, eps};
    KERNEL_TRY("post_attention_layernorm", kernels::add_rms_norm_launch(n2, stream));
    mark("norms");
    if (!L.sparse) {
      const int64_t I = c.intermediate_size;
      if (L.gate_up_fused) {
        if (auto s = gemm_bf16(L.gate_up_fused, 2 * I, H, h, T, gate_up, 2 * I, false); !s)
          return s;
      } else {
        gpu_linear gu{2 * I, H, nullptr, L.gate_up_int4};
        if (auto s = gemm(gu, h, T, gate_up, 2 * I, false); !s)
          return s;
      }
      KERNEL_TRY("SiLU-mul", kernels::silu_mul_bf16_launch({gate_up, act, T, I}, stream));
      if (auto s = gemm(L.down, act, T, delta, H, false); !s)
        return s;
    } else {
      const int64_t E = c.num_experts;
      if (auto s = gemm_bf16(L.router, E, H, h, T, router_logits, E, true); !s)
        return s;
      mark("router GEMM");
      if (L.w13 >= 0) {
        const kernels::fused_moe_args f = int4_moe_args(L, T);
        KERNEL_TRY("fused MoE (INT4)", kernels::fused_moe_launch(f, moe_ws, stream));
      } else {
        const kernels::moe_bf16_args f = bf16_moe_args(L, T);
        KERNEL_TRY("fused MoE (BF16)", kernels::moe_bf16_launch(f, moe_ws, stream));
      }
    }
    mark(L.sparse ? "MoE" : "dense MLP");
    pending = delta;
  }
  // The last delta joins the residual, then only the rows that want logits are normed.
  kernels::add_rms_norm_args last{residual, pending, final_norm, nullptr, h, T, H, eps};
  KERNEL_TRY("final residual add", kernels::add_rms_norm_launch(last, stream));
  kernels::add_rms_norm_args fin{residual, nullptr, final_norm, dev.logit_rows, h_rows, R, H, eps};
  KERNEL_TRY("final norm", kernels::add_rms_norm_launch(fin, stream));
  mark("norms");
  auto lm = gemm_bf16(lm_head, V, H, h_rows, R, logits, V, true);
  mark("lm_head GEMM");
  return lm;
}

// Checks the items and fills the host metadata. With `padded`, T / S / R are rounded up to the
// graph bucket (rows past the batch are padding).
status qwen3_gpu_model::impl::prepare(std::span<forward_item> items, int64_t& T, int64_t& S,
                                      int64_t& R, bool padded) {
  const auto& c = config;
  const int64_t bs = options.kv_block_size, V = c.vocab_size;
  if (items.empty())
    return fail("forward: no sequences to run");
  if (any_load_format())
    return fail("forward: INT4 weights are in load format (a weight update is open on this "
                "runner); post-process them before running batches");
  T = 0;
  R = 0;
  S = static_cast<int64_t>(items.size());
  for (const auto& it : items) {
    const auto n = static_cast<int64_t>(it.tokens.size());
    if (n == 0)
      return fail("forward: no tokens to run");
    for (int64_t t = 0; t < n; ++t)
      if (it.tokens[t] < 0 || it.tokens[t] >= V)
        return fail(fmt::format("forward: token id {} at index {} is outside the vocabulary [0, {})",
                                it.tokens[t], t, V));
    const int64_t past = it.kv->length;
    if (past + n > std::min<int64_t>(c.max_position_embeddings, rope_positions))
      return fail(fmt::format("forward: {} cached + {} new tokens exceed the context limit {}",
                              past, n, std::min<int64_t>(c.max_position_embeddings, rope_positions)));
    if (static_cast<int64_t>(it.kv->blocks.size()) * bs < past + n)
      return fail(fmt::format("forward: {} KV blocks of {} tokens cannot hold {} positions",
                              it.kv->blocks.size(), bs, past + n));
    for (auto b : it.kv->blocks)
      if (b < 0 || b >= options.kv_num_blocks)
        return fail(fmt::format("forward: KV block {} is outside the pool (0 .. {})", b,
                                options.kv_num_blocks - 1));
    if (it.logit_rows < 0 || it.logit_rows > n)
      return fail(fmt::format("forward: {} logit rows asked of {} tokens", it.logit_rows, n));
    T += n;
    R += it.logit_rows;
  }
  if (T > max_tokens || S > max_seqs || R > max_rows)
    return fail(fmt::format("forward: a batch of {} tokens / {} sequences / {} logits rows exceeds "
                            "the GPU runner's limits ({} / {} / {})",
                            T, S, R, max_tokens, max_seqs, max_rows));
  const int64_t T_real = T, S_real = S, R_real = R;
  if (padded) { // the smallest bucket that holds the batch and fits every buffer
    for (auto b : k_buckets)
      if (b >= T && b <= max_seqs && b <= max_rows && b <= max_tokens) {
        T = S = R = b;
        break;
      }
  }
  std::fill(host.block_table, host.block_table + S * max_blocks, 0);
  int64_t row = 0, lrow = 0;
  for (int64_t s = 0; s < S_real; ++s) {
    const auto& it = items[s];
    const auto n = static_cast<int64_t>(it.tokens.size());
    const int64_t past = it.kv->length;
    const auto nb = std::min<int64_t>(static_cast<int64_t>(it.kv->blocks.size()), max_blocks);
    std::copy(it.kv->blocks.begin(), it.kv->blocks.begin() + nb, host.block_table + s * max_blocks);
    for (int64_t t = 0; t < n; ++t, ++row) {
      const int64_t pos = past + t;
      host.ids[row] = it.tokens[t];
      host.positions[row] = static_cast<int32_t>(pos);
      host.slots[row] = static_cast<int32_t>(it.kv->blocks[pos / bs] * bs + pos % bs);
      host.row_seq[row] = static_cast<int32_t>(s);
      host.row_pos[row] = static_cast<int32_t>(pos);
      if (t >= n - it.logit_rows)
        host.logit_rows[lrow++] = static_cast<int32_t>(row);
    }
  }
  for (; row < T; ++row) { // padding rows
    host.ids[row] = -1;
    host.positions[row] = 0;
    host.slots[row] = -1;
    host.row_seq[row] = -1;
    host.row_pos[row] = 0;
  }
  for (; lrow < R; ++lrow)
    host.logit_rows[lrow] = -1;
  (void) T_real;
  (void) R_real;
  return {};
}

status qwen3_gpu_model::impl::launch(int64_t T, int64_t S, int64_t R, bool graph_ok) {
  // The metadata in three copies: per-row ints, the S block-table rows in use (rows past S are
  // never read), the per-row floats.
  const auto head = reinterpret_cast<std::byte*>(host.block_table) - static_cast<std::byte*>(meta_host);
  GPU_TRY(cudaMemcpyAsync(meta_dev, meta_host, static_cast<std::size_t>(head), cudaMemcpyHostToDevice, stream));
  GPU_TRY(cudaMemcpyAsync(dev.block_table, host.block_table, static_cast<std::size_t>(S * max_blocks) * 4,
                          cudaMemcpyHostToDevice, stream));
  GPU_TRY(cudaMemcpyAsync(dev.temperature, host.temperature, static_cast<std::size_t>(4 * max_rows) * 4,
                          cudaMemcpyHostToDevice, stream));
  if (!graph_ok || !options.cuda_graphs || profile)
    return run_step(T, S, R);
  auto it = graphs.find(T);
  if (it == graphs.end()) {
    // Warm up eagerly once (cuBLAS picks its kernels, lazy module loading happens), then capture.
    if (auto s = run_step(T, S, R); !s)
      return s;
    GPU_TRY(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    GPU_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    auto s = run_step(T, S, R);
    auto e = cudaStreamEndCapture(stream, &graph);
    if (!s)
      return s;
    if (e != cudaSuccess)
      return fail("CUDA graph capture failed: " + cuda_text(e));
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess)
      return fail("CUDA graph instantiation failed: " + cuda_text(e));
    it = graphs.emplace(T, exec).first;
    // The warm-up already ran this step's work; running the graph again would write the same
    // KV slots with the same values, so it is harmless, and keeps one code path.
  }
  GPU_TRY(cudaGraphLaunch(it->second, stream));
  return {};
}

// ---------------------------------------------------------------------------------------------------
// the class

qwen3_gpu_model::qwen3_gpu_model(std::unique_ptr<impl> p)
  : impl_(std::move(p)), staging_(std::make_unique<staging>()) {}
qwen3_gpu_model::~qwen3_gpu_model() {
  if (staging_ && (!staging_->bf16.empty() || !staging_->modules.empty()))
    discard_staged();
}

expected<std::unique_ptr<qwen3_gpu_model>> qwen3_gpu_model::create(const qwen3_model& host,
                                                                   const gpu_options& options) {
  auto p = std::make_unique<impl>();
  p->config = host.config();
  p->options = options;
  if (auto s = p->init_device(); !s)
    return std::move(s).take_failure();
  if (auto s = p->allocate_weights(std::nullopt, &host); !s)
    return std::move(s).take_failure();
  if (host.quantization())
    p->int4_recipe = host.quantization()->recipe;
  if (auto s = p->allocate_runtime(); !s)
    return std::move(s).take_failure();
  std::unique_ptr<qwen3_gpu_model> m(new qwen3_gpu_model(std::move(p)));
  std::vector<std::string> names;
  for (const auto& spec : host.parameters())
    names.push_back(spec.name);
  if (auto s = m->upload(host, names); !s)
    return std::move(s).take_failure();
  auto pp = m->post_process();
  if (!pp)
    return std::move(pp).take_failure();
  return m;
}

expected<std::unique_ptr<qwen3_gpu_model>>
qwen3_gpu_model::create_random(const model_config& config, std::optional<random_int4> int4,
                               uint64_t seed, const gpu_options& options) {
  auto p = std::make_unique<impl>();
  p->config = config;
  p->options = options;
  if (auto s = p->init_device(); !s)
    return std::move(s).take_failure();
  if (auto s = p->allocate_weights(int4, nullptr); !s)
    return std::move(s).take_failure();
  if (int4)
    p->int4_recipe = int4->symmetric ? kernels::int4_recipe::sym : kernels::int4_recipe::asym;
  if (auto s = p->allocate_runtime(); !s)
    return std::move(s).take_failure();
  // Values of the scale a trained model has: weights ~ U(-a, a) with a = 1/sqrt(in features),
  // norms 1; INT4 codes random, scales so dequantized weights have the same range.
  uint64_t n = 0;
  auto fill = [&](void* ptr, int64_t count, float lo, float hi, bool words) -> status {
    kernels::fill_random_args f;
    f.out = ptr;
    f.count = count;
    f.seed = seed * 1000003ull + n++;
    f.kind = words ? kernels::fill_random_args::word32 : kernels::fill_random_args::bf16_uniform;
    f.lo = lo;
    f.hi = hi;
    KERNEL_TRY("random fill", kernels::fill_random_launch(f, p->stream));
    return {};
  };
  const auto H = config.hidden_size;
  for (auto& [name, slot] : p->bf16_slots) {
    const bool norm = name.find("norm") != std::string::npos;
    float a = norm ? 1.0f : 1.0f / std::sqrt(float(H));
    if (auto s = fill(slot.first, slot.second, norm ? 1.0f : -a, a, false); !s)
      return std::move(s).take_failure();
  }
  for (auto& L : p->layers) { // fused buffers have no slot name of their own
    const int64_t D = config.head_dim;
    const float a = 1.0f / std::sqrt(float(H));
    if (L.qkv_fused)
      if (auto s = fill(L.qkv_fused, (config.num_attention_heads + 2 * config.num_key_value_heads) * D * H, -a, a, false); !s)
        return std::move(s).take_failure();
  }
  for (auto& m : p->int4_modules) {
    const float step = 1.0f / std::sqrt(float(m.shape.k)) / 8.0f;
    if (auto s = fill(m.weight, m.shape.batch * m.weight_words(), 0, 0, true); !s)
      return std::move(s).take_failure();
    if (auto s = fill(m.scale, m.shape.batch * m.scale_words(), 0.5f * step, 1.5f * step, false); !s)
      return std::move(s).take_failure();
    if (!m.symmetric)
      if (auto s = fill(m.zero_point, m.shape.batch * m.zp_words(), 0, 0, true); !s)
        return std::move(s).take_failure();
    m.serving = true; // random bits are valid in any layout
  }
  if (auto e = cudaStreamSynchronize(p->stream); e != cudaSuccess)
    return fail("CUDA: random init failed: " + cuda_text(e));
  return std::unique_ptr<qwen3_gpu_model>(new qwen3_gpu_model(std::move(p)));
}

const model_config& qwen3_gpu_model::config() const { return impl_->config; }
const gpu_options& qwen3_gpu_model::options() const { return impl_->options; }
std::string qwen3_gpu_model::device_name() const { return impl_->device_name; }
std::size_t qwen3_gpu_model::weight_bytes() const { return impl_->weight_bytes; }
std::size_t qwen3_gpu_model::kv_bytes() const { return impl_->kv_bytes; }
int64_t qwen3_gpu_model::graphs_captured() const { return static_cast<int64_t>(impl_->graphs.size()); }

std::vector<std::pair<std::string, double>> qwen3_gpu_model::take_profile() {
  std::vector<std::pair<std::string, double>> out(impl_->phase_ms.begin(), impl_->phase_ms.end());
  impl_->phase_ms.clear();
  return out;
}

status qwen3_gpu_model::forward(std::span<forward_item> items, std::vector<float>& logits) {
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device)); // the runner's thread may not be the creating one
  int64_t T = 0, S = 0, R = 0;
  bool decode = std::all_of(items.begin(), items.end(), [](const forward_item& it) {
    return it.tokens.size() == 1 && it.logit_rows == 1;
  });
  const bool graph = decode && static_cast<int64_t>(items.size()) <= std::min<int64_t>(p.max_seqs, 256);
  if (auto s = p.prepare(items, T, S, R, graph); !s)
    return s;
  if (auto s = p.launch(T, S, R, graph); !s)
    return s;
  int64_t R_real = 0;
  for (const auto& it : items)
    R_real += it.logit_rows;
  logits.resize(static_cast<std::size_t>(R_real * p.config.vocab_size));
  if (R_real > 0)
    GPU_TRY(cudaMemcpyAsync(logits.data(), p.logits, logits.size() * 4, cudaMemcpyDeviceToHost, p.stream));
  GPU_TRY(cudaStreamSynchronize(p.stream));
  p.collect();
  for (auto& it : items)
    it.kv->length += static_cast<int64_t>(it.tokens.size());
  return {};
}

status qwen3_gpu_model::forward_sample(std::span<forward_item> items,
                                       std::span<const gpu_sample_row> rows,
                                       std::vector<int32_t>& tokens, std::vector<float>& logprobs) {
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device)); // the runner's thread may not be the creating one
  if (rows.size() != items.size())
    return fail(fmt::format("forward_sample: {} sampling rows for {} sequences", rows.size(), items.size()));
  for (const auto& it : items)
    if (it.tokens.size() != 1 || it.logit_rows != 1)
      return fail("forward_sample: every sequence must run one token and ask for one logits row");
  int64_t T = 0, S = 0, R = 0;
  const bool graph = static_cast<int64_t>(items.size()) <= std::min<int64_t>(p.max_seqs, 256);
  if (auto s = p.prepare(items, T, S, R, graph); !s)
    return s;
  for (int64_t r = 0; r < R; ++r) {
    const bool real = r < static_cast<int64_t>(rows.size());
    p.host.temperature[r] = real ? rows[r].temperature : -1.0f;
    p.host.top_k[r] = real ? rows[r].top_k : -1;
    p.host.top_p[r] = real ? rows[r].top_p : 1.0f;
    p.host.min_p[r] = real ? rows[r].min_p : 0.0f;
    p.host.uniform[r] = real ? rows[r].uniform : 0.0f;
  }
  if (auto s = p.launch(T, S, R, graph); !s)
    return s;
  kernels::sample_args sa;
  sa.logits = p.logits;
  sa.temperature = p.dev.temperature;
  sa.top_k = p.dev.top_k;
  sa.top_p = p.dev.top_p;
  sa.min_p = p.dev.min_p;
  sa.uniform = p.dev.uniform;
  sa.token = p.out_token;
  sa.logprob = p.out_logprob;
  sa.rows = R;
  sa.vocab = p.config.vocab_size;
  KERNEL_TRY("sampler", kernels::sample_launch(sa, p.sample_ws, p.stream));
  tokens.resize(items.size());
  logprobs.resize(items.size());
  GPU_TRY(cudaMemcpyAsync(tokens.data(), p.out_token, items.size() * 4, cudaMemcpyDeviceToHost, p.stream));
  GPU_TRY(cudaMemcpyAsync(logprobs.data(), p.out_logprob, items.size() * 4, cudaMemcpyDeviceToHost, p.stream));
  p.mark("sampler");
  GPU_TRY(cudaStreamSynchronize(p.stream));
  p.collect();
  for (auto& it : items)
    it.kv->length += 1;
  return {};
}

expected<std::string> qwen3_gpu_model::restore() {
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

bool gpu_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

expected<double> gpu_copy_bandwidth(int device, std::size_t bytes, int repeats) {
  GPU_TRY(cudaSetDevice(device));
  void *a = nullptr, *b = nullptr;
  GPU_TRY(cudaMalloc(&a, bytes));
  if (auto e = cudaMalloc(&b, bytes); e != cudaSuccess) {
    cudaFree(a);
    return fail("CUDA: cudaMalloc failed: " + cuda_text(e));
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); // warm-up
  cudaEventRecord(start);
  for (int i = 0; i < repeats; ++i)
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  // A copy reads and writes every byte.
  return 2.0 * double(bytes) * repeats / (double(ms) * 1e-3);
}

} // namespace rlserve::model

#else // no CUDA in this build

namespace rlserve::model {

struct qwen3_gpu_model::impl {};
struct qwen3_gpu_model::staging {};

namespace {
const char* k_no_cuda = "this build of rlserve has no CUDA support (configure with -DRLSERVE_CUDA=ON "
                        "on a machine with nvcc)";
}

qwen3_gpu_model::qwen3_gpu_model(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
qwen3_gpu_model::~qwen3_gpu_model() = default;
expected<std::unique_ptr<qwen3_gpu_model>> qwen3_gpu_model::create(const qwen3_model&, const gpu_options&) {
  return fail(k_no_cuda);
}
expected<std::unique_ptr<qwen3_gpu_model>>
qwen3_gpu_model::create_random(const model_config&, std::optional<random_int4>, uint64_t, const gpu_options&) {
  return fail(k_no_cuda);
}
const model_config& qwen3_gpu_model::config() const { std::abort(); }
const gpu_options& qwen3_gpu_model::options() const { std::abort(); }
std::string qwen3_gpu_model::device_name() const { return "none"; }
std::size_t qwen3_gpu_model::weight_bytes() const { return 0; }
std::size_t qwen3_gpu_model::kv_bytes() const { return 0; }
status qwen3_gpu_model::forward(std::span<forward_item>, std::vector<float>&) { return fail(k_no_cuda); }
status qwen3_gpu_model::forward_sample(std::span<forward_item>, std::span<const gpu_sample_row>,
                                       std::vector<int32_t>&, std::vector<float>&) {
  return fail(k_no_cuda);
}
expected<std::string> qwen3_gpu_model::restore() { return fail(k_no_cuda); }
status qwen3_gpu_model::upload(const qwen3_model&, std::span<const std::string>) { return fail(k_no_cuda); }
expected<std::string> qwen3_gpu_model::post_process() { return fail(k_no_cuda); }
status qwen3_gpu_model::stage(std::span<const update_source>, bool) { return fail(k_no_cuda); }
status qwen3_gpu_model::stage_host(std::span<const NamedTensor>, bool) { return fail(k_no_cuda); }
status qwen3_gpu_model::upload_chunk(std::span<const NamedTensor>, host_upload&) { return fail(k_no_cuda); }
expected<std::string> qwen3_gpu_model::commit_staged() { return fail(k_no_cuda); }
void qwen3_gpu_model::discard_staged() {}
std::size_t qwen3_gpu_model::staged_bytes() const { return 0; }
std::size_t qwen3_gpu_model::staging_peak_bytes() const { return 0; }
std::optional<kernels::int4_recipe> qwen3_gpu_model::int4_update_recipe() const { return std::nullopt; }
status qwen3_gpu_model::read_parameters(std::span<const std::string>, const parameter_visitor&) {
  return fail(k_no_cuda);
}
expected<std::vector<uint64_t>> qwen3_gpu_model::digests(std::span<const std::string>) { return fail(k_no_cuda); }
expected<HostTensor> qwen3_gpu_model::download(const std::string&) { return fail(k_no_cuda); }
std::vector<std::string> qwen3_gpu_model::int4_module_names() const { return {}; }
expected<gpu_int4_snapshot> qwen3_gpu_model::int4_module(const std::string&) const { return fail(k_no_cuda); }
int64_t qwen3_gpu_model::graphs_captured() const { return 0; }
std::vector<std::pair<std::string, double>> qwen3_gpu_model::take_profile() { return {}; }
bool gpu_available() { return false; }
expected<double> gpu_copy_bandwidth(int, std::size_t, int) { return fail(k_no_cuda); }

} // namespace rlserve::model

#endif
