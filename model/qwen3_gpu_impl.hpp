// The device model's shared parts, for the two files of qwen3_gpu_model: qwen3_gpu_weights.cpp
// (device weights, the INT4 state machine, staged updates, weight reads) and qwen3_gpu.cpp (the
// device, the KV pool and scratch, the forward step and its CUDA graphs). Internal: include it
// from those files only, in a CUDA build.
#pragma once

#include "model/qwen3_gpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
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
#include "kernels/gemm_bf16_invariant.hpp"
#include "kernels/gemm_w4a16.hpp"
#include "kernels/gemv_bf16.hpp"
#include "kernels/int4_quant.hpp"
#include "kernels/moe_bf16.hpp"
#include "kernels/paged_attention.hpp"
#include "kernels/sampler.hpp"
#include "kernels/serving_layout.hpp"
#include "kernels/spec_verify.hpp"
#include "kernels/weight_copy.hpp"
#include "kernels/xxh3.hpp"
#include "model/quant/int4_method.hpp"
#include "model/vmm_arena.hpp"

namespace rlserve::model {

namespace gpu_detail {

using kernels::kernel_status;

inline std::string cuda_text(cudaError_t e) { return cudaGetErrorString(e); }

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
inline std::size_t lf_bytes(const gpu_int4_module& m) {
  const int64_t B = m.shape.batch;
  const int64_t scale_words = B * m.scale_words();
  return static_cast<std::size_t>(B * m.weight_words() * 4 + (scale_words + scale_words % 2) * 2 +
                                  B * m.zp_words() * 4);
}
inline lf_view carve_lf(void* base, const gpu_int4_module& m) {
  const int64_t B = m.shape.batch;
  lf_view v;
  v.w = static_cast<int32_t*>(base);
  v.s = reinterpret_cast<uint16_t*>(v.w + B * m.weight_words());
  v.z = reinterpret_cast<int32_t*>(v.s + B * m.scale_words() + (B * m.scale_words()) % 2);
  return v;
}

// The exact inverse repack of module `m` (serving buffers) into load-format buffers `lf`, and the
// repack of `lf` into the serving buffers: the arguments every caller builds alike.
inline kernels::serving_restore_args restore_args(const gpu_int4_module& m, const lf_view& lf) {
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

inline kernels::serving_repack_args repack_args(const gpu_int4_module& m, const lf_view& lf) {
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
inline lf_view buffers_of(const gpu_int4_module& m) { return {m.weight, m.scale, m.zero_point}; }

// Copies all of a module's words (weight, scale, zero point) from `src` to `dst` on `stream`.
inline cudaError_t copy_module_words(const lf_view& dst, const lf_view& src, const gpu_int4_module& m,
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

inline constexpr int64_t k_buckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};

} // namespace gpu_detail

struct qwen3_gpu_model::impl {
  model_config config;
  gpu_options options;
  int device = 0;
  std::string device_name;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  // Every long-lived allocation, by what release_memory_occupation calls it: weights, the KV
  // pool, and the rest (scratch of the forward and its graphs, cuBLAS' workspace, the RoPE table:
  // "cuda_graph"). Addresses outlive a release, so the graphs stay valid.
  // What weight updates use besides the weights (the NaN flag, the INT4 repack scratch) is in a
  // fourth arena that is never released: a colocated trainer updates weights before it resumes
  // the KV pool and the graphs' memory.
  std::unique_ptr<vmm_arena> weight_arena, kv_arena, runtime_arena, update_arena;
  std::vector<std::pair<void*, std::size_t>> zeroed_workspaces; // zero again after a resume
  std::size_t weight_bytes = 0, kv_bytes = 0, update_bytes = 0;

  // weights
  uint16_t *embed = nullptr, *lm_head = nullptr, *final_norm = nullptr;
  std::vector<gpu_detail::gpu_layer> layers;
  std::vector<gpu_detail::gpu_int4_module> int4_modules;
  std::unordered_map<std::string, std::pair<uint16_t*, int64_t>> bf16_slots; // name -> (dst, elements)
  std::unordered_map<std::string, std::pair<int, int64_t>> int4_slots;       // prefix -> (module, expert)
  float *rope_cos = nullptr, *rope_sin = nullptr;
  // Routing replay (return_routed_experts): while `record_routing`, each sparse layer's top-k ids
  // [T, top_k] are copied to routed_record + layer * T * top_k (MoE models only).
  int32_t* routed_record = nullptr;
  bool record_routing = false;
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
  gpu_detail::step_meta dev{}, host{};
  // graphs per bucket of tokens and whether the step records the routing
  std::map<std::pair<int64_t, bool>, cudaGraphExec_t> graphs;
  // Speculative decoding on the device (forward's spec items), allocated on first use: the
  // target's filtered rows (grown to the rows a call needs) and one block of small per-call
  // arrays (kernel arguments and results) with a pinned host mirror, for max_rows rows.
  float* spec_probs = nullptr;
  int64_t spec_probs_rows = 0;
  void* spec_dev = nullptr;
  void* spec_host = nullptr;
  status speculate(std::span<forward_item> items, std::span<const gpu_spec_item> spec,
                   gpu_spec_result& out);
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

  // ---- the determinism probe (docs/testing.md, 'Where two runs part') ----
  // RLSERVE_GPU_TRACE=FILE: every step runs eagerly and unpadded, and after each phase the rows it
  // wrote are copied to the host and one line is appended to FILE: the model, the step, the
  // layer, the phase and, per row, its XXH3 and the sum of its magnitudes.
  // scripts/gpu/trace_diff.py compares two such files and names the first phase where they part.
  // RLSERVE_GPU_POISON=SEED: the activation scratch and the KV pool start as seeded random words
  // instead of what the driver maps (zeros), so that a read of memory no kernel wrote differs
  // between two seeds.
  std::FILE* trace_file = nullptr;
  int trace_model = 0;
  int64_t trace_step = 0, trace_layer = -1;
  uint64_t poison_seed = 0;
  enum class trace_type { bf16, f32, i32 };
  struct traced_rows {
    const void* data = nullptr;
    int64_t rows = 0, row_elems = 0;
    trace_type type = trace_type::bf16;
  };
  // The profile's event (RLSERVE_GPU_PROFILE) and the trace's line for `out` (RLSERVE_GPU_TRACE).
  status mark(const char* phase, const traced_rows& out) {
    mark(phase);
    return trace(phase, out);
  }
  status trace(const char* phase, const traced_rows& out);
  status poison(void* ptr, std::size_t bytes, uint64_t salt);

  ~impl() {
    if (spec_probs)
      cudaFree(spec_probs);
    if (spec_dev)
      cudaFree(spec_dev);
    if (spec_host)
      cudaFreeHost(spec_host);
    if (trace_file)
      std::fclose(trace_file);
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

  // `count` T's in the arena `account` names: &weight_bytes (weights), &kv_bytes (the KV pool), or
  // none (runtime); counted there.
  template <class T>
  expected<T*> alloc(int64_t count, std::size_t* account = nullptr) {
    auto& arena = account == &weight_bytes  ? *weight_arena
                  : account == &kv_bytes    ? *kv_arena
                  : account == &update_bytes ? *update_arena
                                             : *runtime_arena;
    const auto bytes = static_cast<std::size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    auto p = arena.allocate(bytes);
    if (!p)
      return fail(fmt::format("CUDA: cannot allocate {} MiB on {}: {}", bytes >> 20, device_name, p.error()));
    if (account)
      *account += bytes;
    return static_cast<T*>(*p);
  }

  // ---- memory release (release_memory_occupation) ----
  status fill_rope_table();
  // Fails naming what to resume when `what` needs released memory.
  status require(bool weights, bool kv_and_runtime, const char* what) const {
    std::string missing;
    if (weights && weight_arena->released())
      missing = "weights";
    if (kv_and_runtime && kv_arena->released())
      missing += (missing.empty() ? "" : ", ") + std::string("kv_cache");
    if (kv_and_runtime && runtime_arena->released())
      missing += (missing.empty() ? "" : ", ") + std::string("cuda_graph");
    if (missing.empty())
      return {};
    return fail(fmt::format("{}: the GPU memory of {} is released; resume_memory_occupation first", what, missing));
  }

  // ---- setup ----
  status init_device();
  status allocate_weights(std::optional<random_int4> int4_experts, const qwen3_model* host);
  status allocate_runtime();
  status build_rope_table();
  int add_int4(std::string name, kernels::int4_shape shape, bool symmetric,
               kernels::zero_point_layout layout);

  // ---- INT4 state machine ----
  status restore_module(gpu_detail::gpu_int4_module& m);
  status post_process_module(gpu_detail::gpu_int4_module& m);
  status write_expert(const qwen3_model& host, gpu_detail::gpu_int4_module& m, int64_t expert);

  // ---- forward ----
  status gemm(const gpu_detail::gpu_linear& w, const uint16_t* x, int64_t m, void* y, int64_t ldy, bool f32_out);
  status gemm_bf16(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int64_t m, void* y,
                   int64_t ldy, bool f32_out);
  status run_step(int64_t T, int64_t S, int64_t R);
  kernels::paged_attention_args attention_args(int64_t layer, int64_t tokens, int64_t sequences) const;
  kernels::fused_moe_args int4_moe_args(const gpu_detail::gpu_layer& L, int64_t tokens) const;
  kernels::moe_bf16_args bf16_moe_args(const gpu_detail::gpu_layer& L, int64_t tokens) const;
  status prepare(std::span<forward_item> items, int64_t& T, int64_t& S, int64_t& R, bool padded);
  status launch(int64_t T, int64_t S, int64_t R, bool graph_ok);
  // After a launch that recorded the routing (or not: then all -1): [real tokens, layers, top_k]
  // from the device's [layers, T, top_k].
  status routing_of(std::span<const forward_item> items, int64_t T, bool recorded, std::vector<int32_t>& out);
  bool any_load_format() const {
    return std::any_of(int4_modules.begin(), int4_modules.end(),
                       [](const gpu_detail::gpu_int4_module& m) { return !m.serving; });
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

} // namespace rlserve::model
