// The small ops of the GPU decoder forward (model/qwen3_gpu.cpp): embedding gather, fused
// residual-add + RMSNorm, q/k-norm + RoPE + paged KV write and SiLU-mul here; paged attention, the
// BF16 GEMV for decode-size linear layers, the BF16 fused MoE (the engine's own BF16 baseline
// beside the INT4 one) and the sampler each in their own header (kernels/paged_attention.hpp,
// gemv_bf16.hpp, moe_bf16.hpp, sampler.hpp). CPU references in kernels/cpu/<op>.cpp, CUDA twins in
// kernels/cuda/<op>.cu (these four ops here: cpu/decoder_ops.cpp, cuda/decoder_ops.cu).
//
// Conventions shared by every decoder op (here and in the four headers above):
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

} // namespace rlserve::kernels
