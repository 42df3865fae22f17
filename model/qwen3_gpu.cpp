// qwen3_gpu_model on the device: the device and its stream, the KV pool and scratch, the forward
// step and its CUDA graphs, and the class's lifetime. Its weights (allocation, the INT4 state
// machine, staged updates, reads) are in qwen3_gpu_weights.cpp; what both share is in
// qwen3_gpu_impl.hpp. A build without CUDA gets the stubs at the end of this file.
#include "model/qwen3_gpu.hpp"

#if RLSERVE_HAVE_CUDA

#include "model/qwen3_gpu_impl.hpp"

#include <atomic>
#include <cerrno>

#include <cuda_profiler_api.h>

namespace rlserve::model {

using namespace gpu_detail;

// ---------------------------------------------------------------------------------------------------
// setup: the device, the KV pool and scratch, the RoPE table (the weights: qwen3_gpu_weights.cpp)

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
  if (const char* path = std::getenv("RLSERVE_GPU_TRACE"); path && *path) {
    static std::atomic<int> models{0};
    trace_model = models++;
    trace_file = std::fopen(path, "a");
    if (!trace_file)
      return fail(fmt::format("RLSERVE_GPU_TRACE: cannot open '{}' for appending: {}", path, std::strerror(errno)));
  }
  if (const char* seed = std::getenv("RLSERVE_GPU_POISON"); seed && *seed) {
    char* end = nullptr;
    poison_seed = std::strtoull(seed, &end, 10);
    if (*end != '\0' || poison_seed == 0)
      return fail(fmt::format("RLSERVE_GPU_POISON: '{}' is not a positive decimal seed", seed));
  }
  weight_arena = std::make_unique<vmm_arena>(device, "weights");
  kv_arena = std::make_unique<vmm_arena>(device, "kv_cache");
  runtime_arena = std::make_unique<vmm_arena>(device, "cuda_graph");
  update_arena = std::make_unique<vmm_arena>(device, "update scratch");
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
  auto flag = alloc<uint64_t>(1, &update_bytes);
  if (!flag)
    return std::move(flag).take_failure();
  quant_flag = *flag;
  GPU_TRY(cudaMemset(quant_flag, 0, sizeof(uint64_t)));
  return {};
}

// ---------------------------------------------------------------------------------------------------
// the determinism probe (RLSERVE_GPU_TRACE, RLSERVE_GPU_POISON: qwen3_gpu_impl.hpp)

status qwen3_gpu_model::impl::trace(const char* phase, const traced_rows& out) {
  if (!trace_file || out.rows <= 0)
    return {};
  const std::size_t elem = out.type == trace_type::bf16 ? 2 : 4;
  const auto row_bytes = static_cast<std::size_t>(out.row_elems) * elem;
  std::vector<std::byte> rows(static_cast<std::size_t>(out.rows) * row_bytes);
  GPU_TRY(cudaMemcpyAsync(rows.data(), out.data, rows.size(), cudaMemcpyDeviceToHost, stream));
  GPU_TRY(cudaStreamSynchronize(stream));
  std::string name(phase);
  std::replace(name.begin(), name.end(), ' ', '_');
  static constexpr const char* type_names[] = {"bf16", "f32", "i32"};
  std::string line = fmt::format("m{} s{} l{} {} {} {}x{}", trace_model, trace_step, trace_layer, name,
                                 type_names[static_cast<int>(out.type)], out.rows, out.row_elems);
  for (int64_t r = 0; r < out.rows; ++r) {
    const std::byte* row = rows.data() + static_cast<std::size_t>(r) * row_bytes;
    // The magnitude tells a last-bit difference (a summation order) from garbage (a read of
    // memory nobody wrote) when two files part.
    double magnitude = 0;
    for (int64_t i = 0; i < out.row_elems; ++i) {
      float f32 = 0;
      int32_t i32 = 0;
      uint16_t b16 = 0;
      switch (out.type) {
      case trace_type::bf16:
        std::memcpy(&b16, row + 2 * i, 2);
        magnitude += std::fabs(kernels::bf16_to_float(b16));
        break;
      case trace_type::f32:
        std::memcpy(&f32, row + 4 * i, 4);
        magnitude += std::fabs(f32);
        break;
      case trace_type::i32:
        std::memcpy(&i32, row + 4 * i, 4);
        magnitude += std::abs(static_cast<double>(i32));
        break;
      }
    }
    line += fmt::format(" {:016x}:{:.9g}", kernels::xxh3_64(row, row_bytes), magnitude);
  }
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), trace_file) != line.size() || std::fflush(trace_file) != 0)
    return fail(fmt::format("RLSERVE_GPU_TRACE: cannot write the trace: {}", std::strerror(errno)));
  return {};
}

status qwen3_gpu_model::impl::poison(void* ptr, std::size_t bytes, uint64_t salt) {
  kernels::fill_random_args f;
  f.out = ptr;
  f.count = static_cast<int64_t>(bytes / 4);
  f.seed = poison_seed * 0x9E3779B97F4A7C15ull + salt;
  f.kind = kernels::fill_random_args::word32;
  if (f.count == 0)
    return {};
  KERNEL_TRY("RLSERVE_GPU_POISON fill", kernels::fill_random_launch(f, stream));
  GPU_TRY(cudaStreamSynchronize(stream));
  return {};
}

status qwen3_gpu_model::impl::build_rope_table() {
  const auto& c = config;
  const int64_t half = c.head_dim / 2;
  rope_positions = std::min<int64_t>(c.max_position_embeddings, max_blocks * options.kv_block_size);
  auto a = alloc<float>(rope_positions * half);
  auto b = alloc<float>(rope_positions * half);
  if (!a || !b)
    return fail(device_name + ": cannot allocate the RoPE table");
  rope_cos = *a;
  rope_sin = *b;
  return fill_rope_table();
}

// The RoPE table's values (again after the runtime memory was released and resumed).
status qwen3_gpu_model::impl::fill_rope_table() {
  const auto& c = config;
  const int64_t half = c.head_dim / 2;
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
  GPU_TRY(cudaMemcpy(rope_cos, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  GPU_TRY(cudaMemcpy(rope_sin, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
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
    if (poison_seed) {
      if (auto s = poison(*k, num_slots * nkv * D * 2, 2 * l); !s)
        return s;
      if (auto s = poison(*v, num_slots * nkv * D * 2, 2 * l + 1); !s)
        return s;
    } else {
      GPU_TRY(cudaMemset(*k, 0, num_slots * nkv * D * 2));
      GPU_TRY(cudaMemset(*v, 0, num_slots * nkv * D * 2));
    }
    k_cache.push_back(*k);
    v_cache.push_back(*v);
  }
  int64_t I_max = std::max(c.intermediate_size, c.moe_intermediate_size);
  const int64_t T = max_tokens;
  bool ok = true;
  std::vector<std::pair<void*, std::size_t>> grabbed;
  auto grab = [&](auto*& p, int64_t n) {
    using T_ = std::remove_pointer_t<std::remove_reference_t<decltype(p)>>;
    using E_ = std::conditional_t<std::is_void_v<T_>, std::byte, T_>; // workspaces: bytes
    auto a = alloc<E_>(n);
    if (!a) {
      ok = false;
    } else {
      p = *a;
      grabbed.emplace_back(static_cast<void*>(*a), static_cast<std::size_t>(std::max<int64_t>(n, 1)) * sizeof(E_));
    }
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
  if (c.num_experts > 0)
    grab(routed_record, c.num_hidden_layers * T * c.num_experts_per_tok);
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
  if (poison_seed) // before the workspaces are zeroed: only what must start at zero does
    for (std::size_t i = 0; i < grabbed.size(); ++i)
      if (auto s = poison(grabbed[i].first, grabbed[i].second, 1000 + i); !s)
        return s;
  // Zero the workspaces once (their counters must start at zero; launches leave them so).
  for (auto& [ptr, bytes] : grabbed)
    if (ptr == moe_ws || ptr == gemm_ws || ptr == attn_ws || ptr == sample_ws)
      zeroed_workspaces.emplace_back(ptr, bytes);
  for (auto& [ptr, bytes] : zeroed_workspaces)
    GPU_TRY(cudaMemset(ptr, 0, bytes));

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
// forward

status qwen3_gpu_model::impl::gemm_bf16(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x,
                                        int64_t m, void* y, int64_t ldy, bool f32_out) {
  if (options.batch_invariant) { // one kernel, one summation order, at every m
    const kernels::gemm_bf16_invariant_args g{x, w, y, m, n, k, ldy, f32_out};
    if (const auto st = kernels::gemm_bf16_invariant_launch(g, stream); st != kernel_status::ok)
      return fail(fmt::format("batch-invariant BF16 linear [{} x {}] x [{} x {}]^T failed ({})", m, k, n, k,
                              kernels::to_string(st)));
    return {};
  }
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
  g.batch_invariant = options.batch_invariant;
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
  f.batch_invariant = options.batch_invariant;
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
  trace_layer = -1;
  if (auto s = mark("embedding", {residual, T, H, trace_type::f32}); !s)
    return s;
  const uint16_t* pending = nullptr; // the last sublayer's output, added at the next norm
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const auto& L = layers[l];
    trace_layer = l;
    kernels::add_rms_norm_args n1{residual, pending, L.input_norm, nullptr, h, T, H, eps};
    KERNEL_TRY("input_layernorm", kernels::add_rms_norm_launch(n1, stream));
    if (auto s = mark("norms", {h, T, H, trace_type::bf16}); !s)
      return s;
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
    if (auto s = mark("qkv GEMM", {qkv, T, qkv_cols, trace_type::bf16}); !s)
      return s;
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
    if (auto s = mark("q/k norm + RoPE + KV write", {q, T, nq * D, trace_type::bf16}); !s)
      return s;
    KERNEL_TRY("paged attention", kernels::paged_attention_launch(attention_args(l, T, S), attn_ws, stream));
    if (auto s = mark("paged attention", {attn, T, nq * D, trace_type::bf16}); !s)
      return s;
    if (auto s = gemm(L.o, attn, T, delta, H, false); !s)
      return s;
    if (auto s = mark("o_proj GEMM", {delta, T, H, trace_type::bf16}); !s)
      return s;
    kernels::add_rms_norm_args n2{residual, delta, L.post_norm, nullptr, h, T, H, eps};
    KERNEL_TRY("post_attention_layernorm", kernels::add_rms_norm_launch(n2, stream));
    if (auto s = mark("norms", {h, T, H, trace_type::bf16}); !s)
      return s;
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
      if (auto s = mark("router GEMM", {router_logits, T, E, trace_type::f32}); !s)
        return s;
      const int32_t* ids = nullptr;
      if (L.w13 >= 0) {
        const kernels::fused_moe_args f = int4_moe_args(L, T);
        KERNEL_TRY("fused MoE (INT4)", kernels::fused_moe_launch(f, moe_ws, stream));
        const auto parts = kernels::fused_moe_workspace_parts(f, moe_ws);
        ids = parts.topk_ids;
        if (trace_file) { // the MoE's own stages: which of them parts first
          const int64_t K = c.num_experts_per_tok;
          if (auto s = trace("MoE top-k ids", {parts.topk_ids, T, K, trace_type::i32}); !s)
            return s;
          if (auto s = trace("MoE top-k weights", {parts.topk_weights, T, K, trace_type::f32}); !s)
            return s;
          if (!kernels::fused_moe_takes_gemv_path(f)) // the GEMV path keeps gate|up elsewhere
            if (auto s = trace("MoE w13 (SiLU-mul)", {parts.h, T * K, c.moe_intermediate_size, trace_type::bf16}); !s)
              return s;
          if (auto s = trace("MoE w2 rows", {parts.y, T * K, H, trace_type::f32}); !s)
            return s;
        }
      } else {
        const kernels::moe_bf16_args f = bf16_moe_args(L, T);
        KERNEL_TRY("fused MoE (BF16)", kernels::moe_bf16_launch(f, moe_ws, stream));
        ids = kernels::moe_bf16_topk_ids(f, moe_ws);
      }
      if (record_routing && routed_record && ids) {
        const auto K = static_cast<std::size_t>(c.num_experts_per_tok);
        GPU_TRY(cudaMemcpyAsync(routed_record + static_cast<std::size_t>(l) * T * K, ids,
                                static_cast<std::size_t>(T) * K * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
      }
    }
    if (auto s = mark(L.sparse ? "MoE" : "dense MLP", {delta, T, H, trace_type::bf16}); !s)
      return s;
    pending = delta;
  }
  // The last delta joins the residual, then only the rows that want logits are normed.
  kernels::add_rms_norm_args last{residual, pending, final_norm, nullptr, h, T, H, eps};
  KERNEL_TRY("final residual add", kernels::add_rms_norm_launch(last, stream));
  kernels::add_rms_norm_args fin{residual, nullptr, final_norm, dev.logit_rows, h_rows, R, H, eps};
  KERNEL_TRY("final norm", kernels::add_rms_norm_launch(fin, stream));
  trace_layer = c.num_hidden_layers;
  if (auto s = mark("norms", {h_rows, R, H, trace_type::bf16}); !s)
    return s;
  auto lm = gemm_bf16(lm_head, V, H, h_rows, R, logits, V, true);
  if (!lm)
    return lm;
  return mark("lm_head GEMM", {logits, R, V, trace_type::f32});
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
  ++trace_step;
  if (!graph_ok || !options.cuda_graphs || profile || trace_file)
    return run_step(T, S, R);
  const std::pair<int64_t, bool> key{T, record_routing};
  auto it = graphs.find(key);
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
    it = graphs.emplace(key, exec).first;
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

status qwen3_gpu_model::forward(std::span<forward_item> items, std::vector<float>& logits,
                                std::vector<int32_t>* routed_experts) {
  gpu_spec_result none;
  return forward(items, logits, routed_experts, {}, none);
}

namespace {

// Why the spec items cannot run as given, or nothing: checked before any work is queued.
std::string spec_refusal(std::span<const forward_item> items, std::span<const gpu_spec_item> spec) {
  if (spec.size() > items.size())
    return fmt::format("forward: {} speculation items for {} sequences", spec.size(), items.size());
  for (std::size_t s = 0; s < spec.size(); ++s) {
    const auto& it = items[s];
    const auto& x = spec[s];
    const auto k = static_cast<int64_t>(x.draft_tokens.size());
    const bool greedy = !(x.sampling.temperature >= 1e-6f);
    const auto where = fmt::format("forward: speculation item {}", s);
    if (k > kernels::k_spec_verify_max_draft)
      return fmt::format("{}: {} proposals, at most {} are verified at once", where, k,
                         kernels::k_spec_verify_max_draft);
    if (it.logit_rows != k + 1 || static_cast<int64_t>(it.tokens.size()) < k + 1)
      return fmt::format("{}: {} proposals need {} logits rows of at least as many tokens, the item has "
                         "{} rows of {} tokens", where, k, k + 1, it.logit_rows, it.tokens.size());
    if (k > 0 && !std::equal(x.draft_tokens.begin(), x.draft_tokens.end(), it.tokens.end() - k))
      return where + ": the item's last tokens are not its proposals";
    if (!greedy && static_cast<int64_t>(x.uniforms.size()) != k + 1)
      return fmt::format("{}: sampling takes {} uniforms, got {}", where, k + 1, x.uniforms.size());
    if (!greedy && k > 0 &&
        (static_cast<int64_t>(x.draft_rows.size()) != k ||
         std::any_of(x.draft_rows.begin(), x.draft_rows.end(), [](const float* r) { return r == nullptr; })))
      return fmt::format("{}: a sampled verification of {} proposals needs their {} draft distributions on "
                         "the device, got {}", where, k, k, x.draft_rows.size());
    if (k > 0 && x.keep_row)
      return where + ": a verification keeps no distribution (keep_row is for proposals)";
  }
  return {};
}

} // namespace

// The spec items' rows (the first of p.logits): filtered distributions (into each proposal's
// keep_row, or the scratch), then spec_verify over them, and the results to the host. Queued
// after the step; the caller synchronizes.
status qwen3_gpu_model::impl::speculate(std::span<forward_item> items, std::span<const gpu_spec_item> spec,
                                        gpu_spec_result& out) {
  const int64_t V = config.vocab_size, S = static_cast<int64_t>(spec.size());
  int64_t R = 0, D = 0, max_k = 0;
  for (std::size_t s = 0; s < spec.size(); ++s) {
    R += items[s].logit_rows;
    D += static_cast<int64_t>(spec[s].draft_tokens.size());
    max_k = std::max<int64_t>(max_k, static_cast<int64_t>(spec[s].draft_tokens.size()));
  }
  // Small arrays, laid out once for max_rows rows and max_seqs sequences: results first (one
  // copy back), then the arguments; pointer tables 8-byte aligned at the end.
  const int64_t RC = max_rows, SC = max_seqs;
  const std::size_t n_accepted = 0, n_token = n_accepted + SC, n_logprob = n_token + RC;
  const std::size_t n_temp_row = n_logprob + RC, n_topk_row = n_temp_row + RC, n_topp_row = n_topk_row + RC,
                    n_minp_row = n_topp_row + RC, n_uniform = n_minp_row + RC, n_temp_seq = n_uniform + RC,
                    n_offset = n_temp_seq + SC, n_drafts = n_offset + SC + 1, n_words = n_drafts + RC;
  const std::size_t tables_at = (n_words * 4 + 7) / 8 * 8;
  const std::size_t bytes = tables_at + static_cast<std::size_t>(2 * RC) * sizeof(void*);
  if (!spec_dev) {
    GPU_TRY(cudaMalloc(&spec_dev, bytes));
    GPU_TRY(cudaMallocHost(&spec_host, bytes));
  }
  if (R > spec_probs_rows) {
    GPU_TRY(cudaStreamSynchronize(stream)); // the old scratch may still be read
    if (spec_probs)
      GPU_TRY(cudaFree(spec_probs));
    spec_probs = nullptr;
    spec_probs_rows = 0;
    if (auto e = cudaMalloc(&spec_probs, static_cast<std::size_t>(R * V) * sizeof(float)); e != cudaSuccess)
      return fail(fmt::format("{}: cannot allocate {} MiB for the target's distributions of {} speculation rows: {}",
                              device_name, (R * V * 4) >> 20, R, cuda_text(e)));
    spec_probs_rows = R;
  }
  auto* words = static_cast<int32_t*>(spec_host);
  auto* fwords = reinterpret_cast<float*>(spec_host);
  auto* tables = reinterpret_cast<float**>(static_cast<std::byte*>(spec_host) + tables_at);
  // One table of p rows: filtered_probs writes them, spec_verify reads them; then the q rows.
  float** p_rows = tables;
  const float** draft_rows = const_cast<const float**>(tables + RC);
  int64_t row = 0, d = 0;
  words[n_offset] = 0;
  for (int64_t s = 0; s < S; ++s) {
    const auto& x = spec[static_cast<std::size_t>(s)];
    const auto k = static_cast<int64_t>(x.draft_tokens.size());
    const bool greedy = !(x.sampling.temperature >= 1e-6f);
    fwords[n_temp_seq + s] = greedy ? 0.0f : x.sampling.temperature;
    for (int64_t j = 0; j <= k; ++j, ++row) {
      fwords[n_temp_row + row] = greedy ? 0.0f : x.sampling.temperature;
      words[n_topk_row + row] = x.sampling.top_k;
      fwords[n_topp_row + row] = x.sampling.top_p;
      fwords[n_minp_row + row] = x.sampling.min_p;
      fwords[n_uniform + row] = greedy ? 0.0f : x.uniforms[static_cast<std::size_t>(j)];
      float* at = k == 0 && x.keep_row ? x.keep_row : spec_probs + row * V;
      p_rows[row] = at;
    }
    for (int64_t i = 0; i < k; ++i, ++d) {
      words[n_drafts + d] = x.draft_tokens[static_cast<std::size_t>(i)];
      draft_rows[d] = greedy ? nullptr : x.draft_rows[static_cast<std::size_t>(i)];
    }
    words[n_offset + s + 1] = static_cast<int32_t>(d);
  }
  GPU_TRY(cudaMemcpyAsync(spec_dev, spec_host, bytes, cudaMemcpyHostToDevice, stream));
  auto* dw = static_cast<int32_t*>(spec_dev);
  auto* dfw = static_cast<float*>(spec_dev);
  auto* dtables = reinterpret_cast<float**>(static_cast<std::byte*>(spec_dev) + tables_at);
  kernels::filtered_probs_args fa;
  fa.logits = logits;
  fa.temperature = dfw + n_temp_row;
  fa.top_k = dw + n_topk_row;
  fa.top_p = dfw + n_topp_row;
  fa.min_p = dfw + n_minp_row;
  fa.row_out = dtables;
  fa.rows = R;
  fa.vocab = V;
  KERNEL_TRY("speculation: filtered distributions", kernels::filtered_probs_launch(fa, stream));
  kernels::spec_verify_args va;
  va.target_rows = dtables;
  va.draft_rows = dtables + RC;
  va.target_logits = logits;
  va.temperature = dfw + n_temp_seq;
  va.draft_offset = dw + n_offset;
  va.draft_tokens = dw + n_drafts;
  va.uniform = dfw + n_uniform;
  va.accepted = dw + n_accepted;
  va.token = dw + n_token;
  va.logprob = dfw + n_logprob;
  va.sequences = S;
  va.drafts = D;
  va.vocab = V;
  va.max_draft = max_k;
  KERNEL_TRY("speculation: verification", kernels::spec_verify_launch(va, stream));
  GPU_TRY(cudaMemcpyAsync(spec_host, spec_dev, n_temp_row * 4, cudaMemcpyDeviceToHost, stream));
  mark("speculation");
  GPU_TRY(cudaStreamSynchronize(stream));
  out.accepted.assign(words + n_accepted, words + n_accepted + S);
  out.tokens.assign(words + n_token, words + n_token + R);
  out.logprobs.assign(fwords + n_logprob, fwords + n_logprob + R);
  for (int64_t s = 0; s < S; ++s)
    if (out.accepted[static_cast<std::size_t>(s)] < 0)
      return fail(fmt::format("speculation: the device refused the layout of item {}", s));
  return {};
}

status qwen3_gpu_model::impl::routing_of(std::span<const forward_item> items, int64_t T, bool recorded,
                                         std::vector<int32_t>& out) {
  // [T, layers, top_k] as the CPU model gives it (-1 for dense layers), from [layers, T, top_k].
  const int64_t L = config.num_hidden_layers, K = std::max<int64_t>(config.num_experts_per_tok, 1);
  int64_t real = 0;
  for (const auto& it : items)
    real += static_cast<int64_t>(it.tokens.size());
  out.assign(static_cast<std::size_t>(real * L * K), -1);
  if (!recorded)
    return {};
  std::vector<int32_t> by_layer(static_cast<std::size_t>(L * T * K));
  GPU_TRY(cudaMemcpyAsync(by_layer.data(), routed_record, by_layer.size() * 4, cudaMemcpyDeviceToHost, stream));
  GPU_TRY(cudaStreamSynchronize(stream));
  for (int64_t l = 0; l < L; ++l) {
    if (!layers[static_cast<std::size_t>(l)].sparse)
      continue;
    for (int64_t t = 0; t < real; ++t)
      std::copy_n(by_layer.data() + (l * T + t) * K, K, out.data() + (t * L + l) * K);
  }
  return {};
}

status qwen3_gpu_model::forward(std::span<forward_item> items, std::vector<float>& logits,
                                std::vector<int32_t>* routed_experts, std::span<const gpu_spec_item> spec,
                                gpu_spec_result& spec_out) {
  auto& p = *impl_;
  if (auto s = p.require(true, true, "forward"); !s)
    return s;
  if (auto why = spec_refusal(items, spec); !why.empty())
    return fail(why);
  GPU_TRY(cudaSetDevice(p.device)); // the runner's thread may not be the creating one
  int64_t T = 0, S = 0, R = 0;
  bool decode = std::all_of(items.begin(), items.end(), [](const forward_item& it) {
    return it.tokens.size() == 1 && it.logit_rows == 1;
  });
  // Recording the routing adds a copy per sparse layer: decode steps that record replay graphs of
  // their own (keyed by the bucket and the recording), so a routed request does not take its
  // whole batch off the graphs, and batches that do not record pay nothing for it.
  const bool record = routed_experts != nullptr && p.routed_record != nullptr;
  const bool graph = decode && !p.trace_file && static_cast<int64_t>(items.size()) <= std::min<int64_t>(p.max_seqs, 256);
  if (auto s = p.prepare(items, T, S, R, graph); !s)
    return s;
  p.record_routing = record;
  auto launched = p.launch(T, S, R, graph);
  p.record_routing = false;
  if (!launched)
    return launched;
  if (routed_experts)
    if (auto s = p.routing_of(items, T, record, *routed_experts); !s)
      return s;
  int64_t R_real = 0, R_spec = 0;
  for (const auto& it : items)
    R_real += it.logit_rows;
  for (std::size_t s = 0; s < spec.size(); ++s)
    R_spec += items[s].logit_rows;
  if (!spec.empty())
    if (auto s = p.speculate(items, spec, spec_out); !s)
      return s;
  logits.resize(static_cast<std::size_t>((R_real - R_spec) * p.config.vocab_size));
  if (R_real > R_spec)
    GPU_TRY(cudaMemcpyAsync(logits.data(), p.logits + R_spec * p.config.vocab_size, logits.size() * 4,
                            cudaMemcpyDeviceToHost, p.stream));
  GPU_TRY(cudaStreamSynchronize(p.stream));
  p.collect();
  for (auto& it : items)
    it.kv->length += static_cast<int64_t>(it.tokens.size());
  return {};
}

status qwen3_gpu_model::release_memory(memory_tags tags, bool backup_weights) {
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device));
  GPU_TRY(cudaStreamSynchronize(p.stream));
  if (tags.weights)
    if (auto s = p.weight_arena->release(backup_weights); !s)
      return s;
  if (tags.kv_cache)
    if (auto s = p.kv_arena->release(false); !s)
      return s;
  if (tags.cuda_graph) {
    if (auto s = p.runtime_arena->release(false); !s)
      return s;
    // The speculation scratch is taken again, at its size then, by the next verification.
    if (p.spec_probs)
      GPU_TRY(cudaFree(p.spec_probs));
    p.spec_probs = nullptr;
    p.spec_probs_rows = 0;
  }
  return {};
}

status qwen3_gpu_model::resume_memory(memory_tags tags) {
  auto& p = *impl_;
  GPU_TRY(cudaSetDevice(p.device));
  if (tags.weights && p.weight_arena->released())
    if (auto s = p.weight_arena->resume(); !s)
      return s;
  if (tags.kv_cache && p.kv_arena->released()) {
    if (auto s = p.kv_arena->resume(); !s)
      return s;
    for (std::size_t l = 0; l < p.k_cache.size(); ++l) { // as at start: no stale values in unused slots
      const auto bytes = static_cast<std::size_t>(p.num_slots * p.config.num_key_value_heads * p.config.head_dim) * 2;
      GPU_TRY(cudaMemset(p.k_cache[l], 0, bytes));
      GPU_TRY(cudaMemset(p.v_cache[l], 0, bytes));
    }
  }
  if (tags.cuda_graph && p.runtime_arena->released()) {
    if (auto s = p.runtime_arena->resume(); !s)
      return s;
    // What the runtime memory must hold beyond scratch: zeroed workspace counters, the RoPE table.
    for (auto& [ptr, bytes] : p.zeroed_workspaces)
      GPU_TRY(cudaMemset(ptr, 0, bytes));
    if (auto s = p.fill_rope_table(); !s)
      return s;
  }
  GPU_TRY(cudaDeviceSynchronize());
  return {};
}

qwen3_gpu_model::memory_tags qwen3_gpu_model::released_memory() const {
  return {impl_->weight_arena->released(), impl_->kv_arena->released(), impl_->runtime_arena->released()};
}

std::size_t qwen3_gpu_model::mapped_bytes() const {
  const auto& p = *impl_;
  return p.weight_arena->mapped_bytes() + p.kv_arena->mapped_bytes() + p.runtime_arena->mapped_bytes() +
         p.update_arena->mapped_bytes();
}

status qwen3_gpu_model::copy_kv_slots(int32_t from, int32_t to, int64_t slots) {
  auto& p = *impl_;
  const auto& c = p.config;
  if (from < 0 || to < 0 || slots < 0 || slots > p.options.kv_block_size ||
      std::max(from, to) >= p.options.kv_num_blocks)
    return fail(fmt::format("copy_kv_slots: blocks {} -> {} ({} slots) outside a pool of {} blocks of {}",
                            from, to, slots, p.options.kv_num_blocks, p.options.kv_block_size));
  if (auto s = p.require(false, true, "copy_kv_slots"); !s)
    return s;
  GPU_TRY(cudaSetDevice(p.device));
  const auto row = static_cast<std::size_t>(c.num_key_value_heads * c.head_dim); // bf16 per slot
  const auto bytes = static_cast<std::size_t>(slots) * row * sizeof(uint16_t);
  const auto at = [&](int32_t block) { return static_cast<std::size_t>(block) * p.options.kv_block_size * row; };
  for (std::size_t l = 0; l < p.k_cache.size(); ++l) {
    GPU_TRY(cudaMemcpyAsync(p.k_cache[l] + at(to), p.k_cache[l] + at(from), bytes, cudaMemcpyDeviceToDevice, p.stream));
    GPU_TRY(cudaMemcpyAsync(p.v_cache[l] + at(to), p.v_cache[l] + at(from), bytes, cudaMemcpyDeviceToDevice, p.stream));
  }
  return {};
}

status qwen3_gpu_model::forward_sample(std::span<forward_item> items,
                                       std::span<const gpu_sample_row> rows,
                                       std::vector<int32_t>& tokens, std::vector<float>& logprobs,
                                       std::vector<int32_t>* routed_experts) {
  auto& p = *impl_;
  if (auto s = p.require(true, true, "forward"); !s)
    return s;
  GPU_TRY(cudaSetDevice(p.device)); // the runner's thread may not be the creating one
  if (rows.size() != items.size())
    return fail(fmt::format("forward_sample: {} sampling rows for {} sequences", rows.size(), items.size()));
  for (const auto& it : items)
    if (it.tokens.size() != 1 || it.logit_rows != 1)
      return fail("forward_sample: every sequence must run one token and ask for one logits row");
  int64_t T = 0, S = 0, R = 0;
  const bool graph = !p.trace_file && static_cast<int64_t>(items.size()) <= std::min<int64_t>(p.max_seqs, 256);
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
  // Recording the routing: the bucket's recording graph (as forward), sampling still here.
  const bool record = routed_experts != nullptr && p.routed_record != nullptr;
  p.record_routing = record;
  auto launched = p.launch(T, S, R, graph);
  p.record_routing = false;
  if (!launched)
    return launched;
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
  if (auto s = p.trace("sampled tokens", {p.out_token, R, 1, impl::trace_type::i32}); !s)
    return s;
  if (auto s = p.trace("sampled logprobs", {p.out_logprob, R, 1, impl::trace_type::f32}); !s)
    return s;
  GPU_TRY(cudaStreamSynchronize(p.stream));
  if (routed_experts)
    if (auto s = p.routing_of(items, T, record, *routed_experts); !s)
      return s;
  p.collect();
  for (auto& it : items)
    it.kv->length += 1;
  return {};
}

void gpu_profiler_range(bool open) {
  cudaDeviceSynchronize(); // the range holds exactly the launches made inside it
  if (open)
    cudaProfilerStart();
  else
    cudaProfilerStop();
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
  // Defined bytes to copy: compute-sanitizer's initcheck (run_runner.sh determinism) reports a copy
  // of uninitialized memory.
  cudaMemset(a, 0, bytes);
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
status qwen3_gpu_model::forward(std::span<forward_item>, std::vector<float>&, std::vector<int32_t>*) {
  return fail(k_no_cuda);
}
status qwen3_gpu_model::forward(std::span<forward_item>, std::vector<float>&, std::vector<int32_t>*,
                                std::span<const gpu_spec_item>, gpu_spec_result&) {
  return fail(k_no_cuda);
}
status qwen3_gpu_model::copy_kv_slots(int32_t, int32_t, int64_t) { return fail(k_no_cuda); }
status qwen3_gpu_model::release_memory(memory_tags, bool) { return fail(k_no_cuda); }
status qwen3_gpu_model::resume_memory(memory_tags) { return fail(k_no_cuda); }
qwen3_gpu_model::memory_tags qwen3_gpu_model::released_memory() const { return {}; }
std::size_t qwen3_gpu_model::mapped_bytes() const { return 0; }
status qwen3_gpu_model::forward_sample(std::span<forward_item>, std::span<const gpu_sample_row>,
                                       std::vector<int32_t>&, std::vector<float>&, std::vector<int32_t>*) {
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
void gpu_profiler_range(bool) {}

} // namespace rlserve::model

#endif
