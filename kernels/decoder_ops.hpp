// The small ops of the GPU decoder forward (model/qwen3_gpu.cu): embedding gather, fused
// residual-add + RMSNorm, q/k-norm + RoPE + paged KV write, paged attention, a BF16 GEMV for
// decode-size linear layers, SiLU-mul, a BF16 fused MoE (the engine's own BF16 baseline beside the INT4 one) and the sampler.
//
// Conventions shared by every op here:
//   - One args struct per op; `*_ref` is the CPU reference (host pointers), `*_launch` the CUDA
//     twin (device pointers, asynchronous on `stream`). Both return kernel_status and never throw.
//   - Launches are CUDA-graph capturable: no allocation, no host synchronization, and everything
//     that changes from step to step (ids, positions, slots, block tables, sampling parameters,
//     uniforms) is read from device memory, never passed by value. Grid sizes depend only on the
//     args' static sizes, so one graph per batch bucket replays any batch of that bucket.
//   - Padding rows: a graph bucket is larger than the batch it runs; rows past the batch carry
//     id / slot / sequence -1 and must produce finite values (zeros) and write no KV slot.
//   - Activations between layers are bf16 (uint16_t bits); the residual stream is fp32; KV is bf16.
//   - Numerics: fp32 arithmetic, one rounding per stored bf16 value. The CUDA twin equals the CPU
//     reference up to fp32 summation order (tests state the tolerance), except where an op says
//     bit-exact.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- embedding -------------------------------------------------------------------------------------
// residual[t, :] = float(table[ids[t], :]); a row whose id is outside [0, vocab) (padding: -1)
// becomes zeros. Bit-exact.
struct embed_args {
  const int32_t* ids = nullptr;    // [tokens]
  const uint16_t* table = nullptr; // bf16 [vocab, hidden]
  float* residual = nullptr;       // fp32 [tokens, hidden]
  int64_t tokens = 0, vocab = 0, hidden = 0; // hidden % 8 == 0
};
kernel_status embed_can_implement(const embed_args& a);
kernel_status embed_ref(const embed_args& a);
kernel_status embed_launch(const embed_args& a, cudaStream_t stream);

// ---- residual add + RMSNorm ----------------------------------------------------------------------
// For each output row r (source row s = rows_index ? rows_index[r] : r):
//   if delta:  residual[s, :] += float(delta[s, :])          (residual updated in place)
//   out[r, :] = bf16( residual[s, :] * rsqrt(mean(residual[s, :]^2) + eps) * float(weight) )
// rows_index (the last-token rows before lm_head) and delta are never given together. A source
// row < 0 writes zeros.
struct add_rms_norm_args {
  float* residual = nullptr;          // fp32 [rows or more, cols]
  const uint16_t* delta = nullptr;    // bf16 [rows, cols] or null
  const uint16_t* weight = nullptr;   // bf16 [cols]
  const int32_t* rows_index = nullptr; // [rows] or null
  uint16_t* out = nullptr;            // bf16 [rows, cols]
  int64_t rows = 0, cols = 0;         // cols % 8 == 0, cols <= 16384
  float eps = 1e-6f;
};
kernel_status add_rms_norm_can_implement(const add_rms_norm_args& a);
kernel_status add_rms_norm_ref(const add_rms_norm_args& a);
kernel_status add_rms_norm_launch(const add_rms_norm_args& a, cudaStream_t stream);

// ---- q/k RMSNorm + RoPE + paged KV write ---------------------------------------------------------
// qkv row t = [q heads | k heads | v heads] (the fused q_proj, k_proj, v_proj output), each head
// head_dim wide. Per token t with position p = positions[t]:
//   q_h = rope(rmsnorm(q_h) * q_norm)  -> q_out[t, h, :]   (bf16)
//   k_h = rope(rmsnorm(k_h) * k_norm)  -> k_cache[slot, h, :]  with slot = slots[t] (skip if < 0)
//   v_h                                -> v_cache[slot, h, :]
// rmsnorm over the head_dim of one head, fp32, eps; rope = Hugging Face rotate_half: dims i and
// i + head_dim/2 rotate by the angle whose cos / sin are rope_cos[p, i] / rope_sin[p, i] (a table
// the model builds once in double precision). Padding tokens (slot < 0) still write finite q.
struct qk_norm_rope_kv_args {
  const uint16_t* qkv = nullptr;     // bf16 [tokens, (q_heads + 2 kv_heads) * head_dim]
  const uint16_t* q_norm = nullptr;  // bf16 [head_dim]
  const uint16_t* k_norm = nullptr;  // bf16 [head_dim]
  const float* rope_cos = nullptr;   // fp32 [max_positions, head_dim / 2]
  const float* rope_sin = nullptr;   // fp32 [max_positions, head_dim / 2]
  const int32_t* positions = nullptr; // [tokens], 0 <= p < max_positions (padding: 0)
  const int32_t* slots = nullptr;    // [tokens] block * block_size + offset, or -1
  uint16_t* q_out = nullptr;         // bf16 [tokens, q_heads, head_dim]
  uint16_t* k_cache = nullptr;       // bf16 [num_slots, kv_heads, head_dim] (this layer)
  uint16_t* v_cache = nullptr;       // bf16 [num_slots, kv_heads, head_dim]
  int64_t tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0, max_positions = 0;
  int64_t num_slots = 0;             // num_blocks * block_size; slots >= num_slots are errors
  float eps = 1e-6f;                 // head_dim in {64, 128}
};
kernel_status qk_norm_rope_kv_can_implement(const qk_norm_rope_kv_args& a);
kernel_status qk_norm_rope_kv_ref(const qk_norm_rope_kv_args& a);
kernel_status qk_norm_rope_kv_launch(const qk_norm_rope_kv_args& a, cudaStream_t stream);

// ---- paged attention (prefill chunks and decode in one launch) ---------------------------------
// Query row t belongs to sequence s = row_seq[t] (-1: padding, output zeros) and sits at position
// p = row_pos[t]; it attends causally to that sequence's keys at positions 0 .. p, position j
// living in slot block_table[s * max_blocks + j / block_size] * block_size + j % block_size.
// Query head h reads kv head h / (q_heads / kv_heads). softmax(q k^T * scale) in fp32, P used in
// fp32, one bf16 rounding of the output. The keys of the current step must already be written
// (qk_norm_rope_kv runs first).
struct paged_attention_args {
  const uint16_t* q = nullptr;        // bf16 [tokens, q_heads, head_dim]
  const uint16_t* k_cache = nullptr;  // bf16 [num_slots, kv_heads, head_dim]
  const uint16_t* v_cache = nullptr;
  const int32_t* block_table = nullptr; // [sequences, max_blocks]
  const int32_t* row_seq = nullptr;     // [tokens]
  const int32_t* row_pos = nullptr;     // [tokens]
  uint16_t* out = nullptr;              // bf16 [tokens, q_heads, head_dim]
  int64_t tokens = 0, sequences = 0, max_blocks = 0, block_size = 16;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0; // head_dim in {64, 128}
  int64_t max_context = 0; // static upper bound on p + 1 (sizes split-KV work; 0 = max_blocks * block_size)
  // Workspace capacity in rows (0 = tokens). Launches of different token counts that share one
  // workspace must all pass the same max_tokens: the split merge's arrival counters persist
  // between launches, so their place may not move with the token count.
  int64_t max_tokens = 0;
  float scale = 1.0f;
};
kernel_status paged_attention_can_implement(const paged_attention_args& a);
kernel_status paged_attention_ref(const paged_attention_args& a);
// Scratch for split-KV partials and the merge's arrival counters; depends only on the static
// sizes. May be 0. The counters must be zero before the first launch (workspace_init, or a memset
// of the whole workspace); every launch leaves them zero again.
std::size_t paged_attention_workspace_bytes(const paged_attention_args& a);
kernel_status paged_attention_workspace_init(const paged_attention_args& a, void* workspace, cudaStream_t stream);
kernel_status paged_attention_launch(const paged_attention_args& a, void* workspace, cudaStream_t stream);

// ---- BF16 linear at decode sizes (GEMV) ----------------------------------------------------------
// y[r, c] = sum_j float(x[r, j]) * float(w[c, j]) for r < rows, c < n: a BF16 linear layer
// (Hugging Face orientation, w is [n, k]) for the few rows of a decode step, written as bf16 or
// fp32 with row stride ldy. fp32 sums on the GPU, double in the reference; one rounding of the
// output. Launched as a programmatic dependent: its first weights load while the kernel that
// wrote x finishes.
constexpr int64_t k_gemv_max_rows = 8;
// Where it beats cuBLAS (H200, kernels_bench --only gemv, back-to-back): at one row (o_proj
// 2048 x 4096 1.53x, q/k/v 5120 x 2048 1.09x, lm_head 151936 x 2048 1.07x) and for narrow
// outputs at any row count (the 128-expert router, 2.4x); at 4-8 rows of a wide output cuBLAS is
// faster (0.46-0.75x: each weight word is unpacked once per row of x).
constexpr bool gemv_bf16_preferred(int64_t rows, int64_t n) {
  return rows >= 1 && rows <= k_gemv_max_rows && (rows == 1 || n <= 1024);
}
struct gemv_bf16_args {
  const uint16_t* x = nullptr; // bf16 [rows, k], 16-byte aligned rows
  const uint16_t* w = nullptr; // bf16 [n, k], 16-byte aligned
  void* y = nullptr;           // bf16 or fp32 [rows, ldy]
  int64_t rows = 0, n = 0, k = 0, ldy = 0; // 1 <= rows <= k_gemv_max_rows, k % 8 == 0, ldy >= n
  bool f32_out = false;
};
kernel_status gemv_bf16_can_implement(const gemv_bf16_args& a);
kernel_status gemv_bf16_ref(const gemv_bf16_args& a);
kernel_status gemv_bf16_launch(const gemv_bf16_args& a, cudaStream_t stream);

// ---- SiLU-mul -----------------------------------------------------------------------------------
// out[r, c] = bf16( bf16(silu(g)) * u ) with g = gate_up[r, c], u = gate_up[r, cols + c] (fp32
// math, transformers' two roundings: act(gate) is a bf16 tensor before the product).
struct silu_mul_bf16_args {
  const uint16_t* gate_up = nullptr; // bf16 [rows, 2 * cols]
  uint16_t* out = nullptr;           // bf16 [rows, cols]
  int64_t rows = 0, cols = 0;        // cols % 8 == 0
};
kernel_status silu_mul_bf16_can_implement(const silu_mul_bf16_args& a);
kernel_status silu_mul_bf16_ref(const silu_mul_bf16_args& a);
kernel_status silu_mul_bf16_launch(const silu_mul_bf16_args& a, cudaStream_t stream);

// ---- BF16 fused MoE ------------------------------------------------------------------------------
// The same layer as kernels/fused_moe.hpp (routing, SwiGLU experts, weighted combine in slot
// order, h rounded to bf16, y in fp32, one bf16 rounding of out) with BF16 expert weights in the
// Hugging Face orientation. Tokens with router row all -inf never occur (padding rows carry a
// finite router row and their output is ignored by the caller).
struct moe_bf16_args {
  int64_t tokens = 0, hidden = 0, intermediate = 0, experts = 0; // hidden, intermediate % 64 == 0
  int32_t top_k = 8;
  bool norm_topk_prob = true;
  const float* router_logits = nullptr; // fp32 [tokens, experts]
  const uint16_t* x = nullptr;          // bf16 [tokens, hidden]
  const uint16_t* w13 = nullptr;        // bf16 [experts, 2 * intermediate, hidden] (gate rows, then up rows)
  const uint16_t* w2 = nullptr;         // bf16 [experts, hidden, intermediate]
  uint16_t* out = nullptr;              // bf16 [tokens, hidden]
  int64_t max_tokens = 0;               // workspace capacity (0 = tokens), as fused_moe_args
};
kernel_status moe_bf16_can_implement(const moe_bf16_args& a);
kernel_status moe_bf16_ref(const moe_bf16_args& a);
std::size_t moe_bf16_workspace_bytes(const moe_bf16_args& a);
kernel_status moe_bf16_workspace_init(const moe_bf16_args& a, void* workspace, cudaStream_t stream);
kernel_status moe_bf16_launch(const moe_bf16_args& a, void* workspace, cudaStream_t stream);

// ---- sampler -------------------------------------------------------------------------------------
// Row r, exactly the rule of model::sampler::sample (model/sampler.hpp):
//   temperature[r] < 1e-6: greedy, argmax of logits (NaN = -inf, ties -> lowest id), logprob =
//     log_softmax(logits)[token];
//   else p = softmax(logits / T); keep top-k (k most probable, ties -> lower id), then top-p (the
//     smallest most-probable-first prefix whose mass reaches top_p, at least one token), then
//     min-p (p >= min_p * p_max; if none, the most probable); walk the kept tokens in the CPU
//     sampler's order (most probable first when top-k or top-p is on, id order otherwise) and
//     return the first whose running mass exceeds uniform[r] * (kept mass); logprob =
//     log_softmax(logits / T)[token] (before filtering).
// The uniform is drawn by the host sampler of the request (one per non-greedy row), so the GPU
// and the CPU pick the same token from the same logits up to fp32-vs-double summation at the
// boundary. Rows with temperature < 0 are padding: token -1.
struct sample_args {
  const float* logits = nullptr;      // fp32 [rows, vocab]
  const float* temperature = nullptr; // [rows]
  const int32_t* top_k = nullptr;     // [rows] (<= 0: off)
  const float* top_p = nullptr;       // [rows] (>= 1: off)
  const float* min_p = nullptr;       // [rows] (<= 0: off)
  const float* uniform = nullptr;     // [rows] in [0, 1)
  int32_t* token = nullptr;           // [rows] out
  float* logprob = nullptr;           // [rows] out
  int64_t rows = 0, vocab = 0;
};
kernel_status sample_can_implement(const sample_args& a);
kernel_status sample_ref(const sample_args& a);
std::size_t sample_workspace_bytes(const sample_args& a);
kernel_status sample_launch(const sample_args& a, void* workspace, cudaStream_t stream);

} // namespace rlserve::kernels
